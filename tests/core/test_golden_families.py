"""The parser-family golden cases (gpt-oss Harmony, DeepSeek V4/V3.2, Kimi K2, Nemotron 3): our output
envelopes equal vLLM 0.33.0's, field for field, with the same comparison as the other golden files."""

from __future__ import annotations

import pytest

from tests.core.test_golden import _compare, run_case
from tests.golden_cases import FAMILIES_DIR, GOLDEN_VERSION, GoldenCase, load_cases


@pytest.mark.parametrize("case", load_cases(FAMILIES_DIR), ids=lambda c: f"{c.file}:{c.id}")
def test_family_golden_case(case: GoldenCase) -> None:
    _compare(case, run_case(case, GOLDEN_VERSION))
