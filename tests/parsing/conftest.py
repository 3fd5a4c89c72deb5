"""Fixtures shared by the parsing tests."""

from __future__ import annotations

from typing import Any

import pytest

from worker.core.parsing.tools import llama3_json


@pytest.fixture
def partial_json_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every text ``llama3_json`` hands to the partial-JSON read (a record's cost)."""
    seen: list[int] = []
    original = llama3_json.partial_loads

    def counting(text: str, allow_str: bool) -> tuple[Any, int]:
        seen.append(len(text))
        return original(text, allow_str)

    monkeypatch.setattr(llama3_json, "partial_loads", counting)
    return seen
