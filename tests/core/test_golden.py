"""Every golden case: our output envelopes equal vLLM's, field for field, under the version that
recorded them (``tests/golden/``: 0.33.0, ``tests/golden_034/``: 0.34.0)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.golden_cases import GOLDEN_034_DIR, GoldenCase, derenderer_for, load_cases, normalize
from tests.stream_builders import written
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.vllm_version import VllmVersion

CASES = load_cases()
CASES_034 = load_cases(GOLDEN_034_DIR)


def run_case(case: GoldenCase, version: VllmVersion) -> list[dict[str, Any]]:
    processor = EnvelopeProcessor(derenderer_for(case.config, version))
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
    _compare(case, run_case(case, VllmVersion.V0_33))


@pytest.mark.parametrize("case", [c for c in CASES if c.uses_parser], ids=lambda c: f"{c.file}:{c.id}")
def test_parser_golden_case(case: GoldenCase) -> None:
    _compare(case, run_case(case, VllmVersion.V0_33))


#: The vLLM 0.34 cases that still differ, each with why (strict: one that passes fails the run).
KNOWN_034_DIFFERENCES: dict[str, str] = {}


def _034_param(case: GoldenCase) -> Any:
    reason = KNOWN_034_DIFFERENCES.get(case.id)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason is not None else []
    return pytest.param(case, id=f"{case.file}:{case.id}", marks=marks)


def test_known_034_differences_are_cases() -> None:
    assert KNOWN_034_DIFFERENCES.keys() <= {c.id for c in CASES_034}
    assert len(CASES_034) == 185


@pytest.mark.parametrize("case", [_034_param(c) for c in CASES_034])
def test_golden_034_case(case: GoldenCase) -> None:
    _compare(case, run_case(case, VllmVersion.V0_34))
