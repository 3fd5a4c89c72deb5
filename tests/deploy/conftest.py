"""Fixtures of the deployment tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No DERENDER_ variables from the test environment: parser defaults come from what a test sets."""
    for name in list(os.environ):
        if name.startswith("DERENDER_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)
    return monkeypatch
