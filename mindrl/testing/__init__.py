"""mindrl.testing."""
