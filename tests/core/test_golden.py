"""Every golden case: our output envelopes equal vLLM 0.33.0's, field for field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.golden_cases import GoldenCase, derenderer_for, load_cases, normalize
from tests.stream_builders import written
from worker.core.envelope_processor import EnvelopeProcessor

CASES = load_cases()


def run_case(case: GoldenCase) -> list[dict[str, Any]]:
    processor = EnvelopeProcessor(derenderer_for(case.config))
    outputs = []
    for envelope in case.input:
        result = processor.process(orjson.dumps(envelope))
        assert result.dead_letter is None, result.dead_letter
        assert result.output is not None
        outputs.append(written(result))
    return outputs


def _compare(case: GoldenCase, actual: list[dict[str, Any]]) -> None:
    expected = normalize(case.expected)
    actual = normalize(actual)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        if "error" in want:
            # The golden README: compare the status; messages need only be clear.
            assert "error" in got, f"seq {want['seq']}: expected an error, got {got}"
            assert got["error"]["code"] == want["error"]["code"], got["error"]
            assert got["error"]["message"]
        else:
            assert got == want, f"{case.id} seq {want['seq']}"


@pytest.mark.parametrize("case", [c for c in CASES if not c.uses_parser], ids=lambda c: f"{c.file}:{c.id}")
def test_plain_golden_case(case: GoldenCase) -> None:
    _compare(case, run_case(case))


@pytest.mark.parametrize("case", [c for c in CASES if c.uses_parser], ids=lambda c: f"{c.file}:{c.id}")
def test_parser_golden_case(case: GoldenCase) -> None:
    _compare(case, run_case(case))
