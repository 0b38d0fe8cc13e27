"""Fixtures of the unit tests."""

from __future__ import annotations

import logging

import pytest

from mindrl.config.fates import reset_warnings


@pytest.fixture
def fate_log(caplog):
    """The config's once-only fate warnings, fresh for the test and captured."""
    reset_warnings()
    caplog.set_level(logging.WARNING, logger="mindrl.config")
    yield caplog
    reset_warnings()
