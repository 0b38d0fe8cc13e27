"""The broken verifiers of `_verifier_support`, written once per session as a real file."""

from __future__ import annotations

from pathlib import Path

import pytest
from _verifier_support import VERIFIERS


@pytest.fixture(scope="session")
def verifier_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reliability") / "broken_verifiers.py"
    path.write_text(VERIFIERS)
    return path
