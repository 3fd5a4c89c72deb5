"""The parser-family golden cases (gpt-oss Harmony, DeepSeek V4/V3.2, Kimi K2, Nemotron 3): our output
envelopes equal vLLM 0.33.0's, field for field, with the same comparison as the other golden files."""

from __future__ import annotations

import json

import pytest

from tests.core.test_golden import _compare, run_case
from tests.golden_cases import GoldenCase
from tests.paths import REPO_ROOT

FAMILIES_DIR = REPO_ROOT / "tests" / "golden_families"

# Files whose family is not served yet: strict, so a family that starts passing must leave this table.
PENDING: dict[str, str] = {
    "gptoss": "Harmony (gpt-oss) is not served yet",
}


def _load() -> list[GoldenCase]:
    cases = []
    for path in sorted(FAMILIES_DIR.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                raw = json.loads(line)
                cases.append(GoldenCase(path.stem, raw["id"], raw["config"], raw["input"], raw["expected"]))
    return cases


def _param(case: GoldenCase) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=PENDING[case.file])] if case.file in PENDING else []
    return pytest.param(case, id=f"{case.file}:{case.id}", marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in _load()])
def test_family_golden_case(case: GoldenCase) -> None:
    _compare(case, run_case(case))
