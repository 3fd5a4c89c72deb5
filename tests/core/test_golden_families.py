"""The parser-family golden cases (gpt-oss Harmony, DeepSeek V4/V3.2, Kimi K2, Nemotron 3): our output
envelopes equal vLLM 0.33.0's, field for field, with the same comparison as the other golden files."""

from __future__ import annotations

import pytest

from tests.core.test_golden import _compare, run_case
from tests.golden_cases import FAMILIES_DIR, GoldenCase, load_cases

# Files whose family is not served yet: strict, so a family that starts passing must leave this table.
PENDING: dict[str, str] = {
    "gptoss": "Harmony (gpt-oss) is not served yet",
}


def _param(case: GoldenCase) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=PENDING[case.file])] if case.file in PENDING else []
    return pytest.param(case, id=f"{case.file}:{case.id}", marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in load_cases(FAMILIES_DIR)])
def test_family_golden_case(case: GoldenCase) -> None:
    _compare(case, run_case(case))
