"""gpt-oss (Harmony) streams: live sessions, replay from a carried ``stream_state`` and eviction all give
vLLM's output; a carried state resumes exactly at every record boundary."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import orjson
import pytest

from tests.core.test_warm_cold import _cold, _resplit, _single_choice, _warm
from tests.golden_cases import GoldenCase, derenderer_for, normalize
from tests.paths import REPO_ROOT
from tests.stream_builders import written
from worker.core.envelope_processor import EnvelopeProcessor

JsonDict = dict[str, Any]


def _gptoss_cases() -> list[GoldenCase]:
    path = REPO_ROOT / "tests" / "golden_families" / "gptoss.jsonl"
    cases = []
    for line in path.read_text(encoding="utf-8").splitlines():
        raw = json.loads(line)
        cases.append(GoldenCase("gptoss", raw["id"], raw["config"], raw["input"], raw["expected"]))
    return cases


STREAMS = [
    c
    for c in _gptoss_cases()
    if all(e["body"].get("stream") for e in c.input) and all("error" not in e for e in c.expected)
]


@pytest.mark.parametrize("case", STREAMS, ids=lambda c: c.id)
def test_warm_equals_cold_and_evicted(case: GoldenCase) -> None:
    warm = normalize(_warm(case, case.input))
    assert warm == normalize(case.expected)
    assert normalize(_warm(case, case.input, max_live_parsers=0)) == warm
    if _single_choice(case):  # the cold harness carries one choice's state
        assert normalize(_cold(case, case.input)) == warm


@pytest.mark.parametrize("case", [c for c in STREAMS if _single_choice(c)], ids=lambda c: c.id)
def test_warm_equals_cold_on_random_splits(case: GoldenCase) -> None:
    records = _resplit(case.input, random.Random(f"harmony-{case.id}"))
    warm = normalize(_warm(case, records))
    assert normalize(_cold(case, records)) == warm
    assert normalize(_warm(case, records, max_live_parsers=0)) == warm


def test_a_carried_state_resumes_at_every_record_boundary() -> None:
    """Reasoning, then a call whose header is cut at every token: a fresh processor given the state
    after record k (and the request's context) goes on exactly as the one that saw every record."""
    case = next(c for c in STREAMS if c.id == "gptoss-analysis-tool-call-stream-1tok")
    first_body = case.input[0]["body"]
    context = {k: v for k, v in first_body.items() if k not in ("generate_chunk", "stream_state")}
    states: list[JsonDict | None] = []
    full = []
    processor = EnvelopeProcessor(derenderer_for(case.config))
    for record in case.input:
        result = processor.process(orjson.dumps(record))
        states.append(result.stream_state())
        full.append(written(result))
    assert normalize(full) == normalize(case.expected)
    for boundary in range(1, len(case.input)):
        resumed = EnvelopeProcessor(derenderer_for(case.config))
        outputs = []
        for offset, record in enumerate(case.input[boundary:]):
            record = copy.deepcopy(record)
            if offset == 0:
                record["body"] = {**context, **record["body"], "stream_state": states[boundary - 1]}
            result = resumed.process(orjson.dumps(record))
            assert result.output is not None
            outputs.append(written(result))
        # The same ids too: the carried state pins them.
        assert normalize(full[:boundary] + outputs) == normalize(full), f"resumed after record {boundary - 1}"
