"""MkDocs hooks: the configuration reference is rendered from the code at every build.

Rendering at build time (rather than committing the page) means the reference always says
what the config builder in this checkout does; `mkdocs build --strict` then checks its
links with the rest of the guide.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # mkdocs loads hooks by path

from mkdocs.structure.files import File, Files  # noqa: E402

from tools.docs.config_reference import PAGE_NAME, render  # noqa: E402


def on_files(files: Files, config: Any) -> Files:
    """Add the generated configuration reference to the site's pages."""
    files.append(File.generated(config, PAGE_NAME, content=render()))
    return files
