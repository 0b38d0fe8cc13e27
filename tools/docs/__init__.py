"""Tools that build the user guide (MkDocs site from docs/)."""
