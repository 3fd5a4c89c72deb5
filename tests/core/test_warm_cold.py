"""Warm equals cold: live parser sessions and replay from a carried ``stream_state`` agree exactly.

Warm: the core keeps each sequence's parser alive between records. Cold: every
record carries the previous output ``stream_state`` (through JSON) and goes to a
fresh processor, so every record rebuilds its parser by replaying the state,
which is what vLLM's stateless endpoint does on every call. Evicted: the warm
path with a one-parser cap, so sessions are evicted and rebuilt mid-stream.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
import pytest

from tests.golden_cases import FAMILIES_DIR, GoldenCase, derenderer_for, load_cases, normalize, sample_config
from tests.stream_builders import split, written
from worker.core.envelope_processor import EnvelopeProcessor

JsonDict = dict[str, Any]

#: The parser families' files: the cold path resumes each family's parser from its carried
#: ``stream_state`` at every record boundary of every streamed case.
FAMILY_FILES = {"deepseek_v4", "deepseek_v32", "kimi_k2", "nemotron_v3"}
STREAM_PARSER_CASES = [
    c
    for c in load_cases() + load_cases(FAMILIES_DIR)
    if c.uses_parser
    and c.file
    in {"reasoning", "tools", "parsers_reasoning_deepseek_v3", "parsers_reasoning_glm45", *FAMILY_FILES}
    and all(e["body"].get("stream") for e in c.input)
    and all("error" not in e for e in c.expected)
]


def _warm(case: GoldenCase, records: list[JsonDict], max_live_parsers: int = 10_000) -> list[JsonDict]:
    processor = EnvelopeProcessor(derenderer_for(case.config), max_live_parsers=max_live_parsers)
    outputs = []
    for record in records:
        result = processor.process(orjson.dumps(record))
        assert result.output is not None
        outputs.append(written(result))
    return outputs


def _cold(case: GoldenCase, records: list[JsonDict]) -> list[JsonDict]:
    """Each record with the whole context (the latest each field was given) and the last state."""
    context: JsonDict = {}
    states: dict[int, Any] = {}
    last_index = 0
    outputs = []
    for record in records:
        record = copy.deepcopy(record)
        context |= {k: v for k, v in record["body"].items() if k not in ("generate_chunk", "stream_state")}
        choices = record["body"]["generate_chunk"]["choices"]
        index = choices[0]["index"] if choices else last_index
        record["body"].update(context)
        record["body"]["stream_state"] = states.get(index)
        result = EnvelopeProcessor(derenderer_for(case.config)).process(orjson.dumps(record))
        assert result.output is not None, result
        outputs.append(written(result))
        if "body" in result.output:
            states[index] = result.stream_state()
        last_index = index
    return outputs


def _resplit(records: list[JsonDict], rng: random.Random) -> list[JsonDict]:
    """The same generation (one choice) cut at random places into new records."""
    ids: list[int] = []
    finish: str | None = None
    tail: list[JsonDict] = []
    for record in records:
        chunk = record["body"]["generate_chunk"]
        if not chunk["choices"]:
            tail.append(record)
            continue
        ids.extend(chunk["choices"][0].get("token_ids") or [])
        finish = chunk["choices"][0].get("finish_reason") or finish
    cuts = rng.sample(range(1, len(ids)), k=min(len(ids) - 1, rng.randint(1, 8)))
    chunks = split(ids, cuts)
    out = []
    template = records[0]
    for seq, chunk in enumerate(chunks):
        record = copy.deepcopy(template)
        record["seq"] = seq
        choice: JsonDict = {"index": 0, "token_ids": chunk}
        if seq == len(chunks) - 1 and finish:
            choice["finish_reason"] = finish
        record["body"]["generate_chunk"]["choices"] = [choice]
        record["body"]["generate_chunk"].pop("usage", None)
        out.append(record)
    for extra in tail:
        record = copy.deepcopy(extra)
        record["seq"] = len(out)
        out.append(record)
    return out


def _single_choice(case: GoldenCase) -> bool:
    indexes = {c["index"] for r in case.input for c in r["body"]["generate_chunk"]["choices"]}
    return indexes <= {0}


def _counted_session_builds(monkeypatch: pytest.MonkeyPatch, case: GoldenCase) -> list[int]:
    """A one-element list counting the parser sessions ``case``'s derenderer builds from now on."""
    derenderer = derenderer_for(case.config)
    builds = [0]
    build = type(derenderer)._new_live_parser

    def counting(self: Any, *args: Any) -> Any:
        builds[0] += 1
        return build(self, *args)

    monkeypatch.setattr(type(derenderer), "_new_live_parser", counting)
    return builds


@pytest.mark.parametrize("case", STREAM_PARSER_CASES, ids=lambda c: c.id)
def test_warm_equals_cold_and_evicted_on_golden_streams(case: GoldenCase) -> None:
    warm = normalize(_warm(case, case.input))
    assert warm == normalize(case.expected)
    assert normalize(_cold(case, case.input)) == warm
    assert normalize(_warm(case, case.input, max_live_parsers=0)) == warm


@pytest.mark.parametrize("case", [c for c in STREAM_PARSER_CASES if _single_choice(c)], ids=lambda c: c.id)
@pytest.mark.parametrize("seed", range(3))
def test_warm_equals_cold_on_random_splits(case: GoldenCase, seed: int) -> None:
    records = _resplit(case.input, random.Random(f"{case.id}-{seed}"))
    warm = normalize(_warm(case, records))
    assert normalize(_cold(case, records)) == warm
    assert normalize(_warm(case, records, max_live_parsers=0)) == warm


def _after_finish(finish_reason: str, token_ids: list[int]) -> list[JsonDict]:
    """Records that step choice 0 after its finish (n=2 keeps the request open)."""
    prompt = [151644, 872, 198, 3872, 220, 16, 15, 15, 16, 264, 10250, 1372, 30, 151645, 198]
    prompt += [151644, 77091, 198]
    request = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "n": 2}
    choices: list[JsonDict] = [
        {"index": 0, "token_ids": token_ids, "finish_reason": finish_reason},
        {"index": 0, "token_ids": [26549]},
        {"index": 0, "token_ids": [151668, 9707]},
        {"index": 0, "token_ids": [], "finish_reason": "stop"},
    ]
    records = []
    for seq, choice in enumerate(choices):
        body: JsonDict = {"stream": True, "generate_chunk": {"request_id": "after", "choices": [choice]}}
        if seq == 0:
            body |= {"model": "test-model", "prompt_token_ids": prompt, "chat_request": request}
        records.append({"request_id": "after", "seq": seq, "endpoint": "chat", "body": body})
    return records


@pytest.mark.parametrize(
    ("finish_reason", "token_ids"), [("length", [9707]), ("stop", [9707, 151645]), ("abort", [151667])]
)
def test_a_record_that_steps_a_finished_choice_is_refused_unless_it_carries_its_state(
    finish_reason: str, token_ids: list[int]
) -> None:
    """vLLM answers such a record by replaying the choice's history without the finish; held
    sessions could only rebuild, O(the output so far) for one record, and records alternating
    finish and no finish made every record cost that. No engine sends one: with parsers on it is a
    400 that leaves the request as it was. Carrying the ``stream_state`` (vLLM's way) still gets
    vLLM's answer."""
    records = _after_finish(finish_reason, token_ids)
    case = GoldenCase("adhoc", "after-finish", sample_config(parsers=True), records, [])
    for warm in (_warm(case, records), _warm(case, records, max_live_parsers=0)):
        assert "body" in warm[0]
        for output in warm[1:]:
            assert output["error"]["code"] == 400
            assert output["error"]["message"].startswith("choice 0 of request 'after' already finished")
    assert all("body" in output for output in _cold(case, records))


@pytest.mark.parametrize("case", [c for c in STREAM_PARSER_CASES if _single_choice(c)], ids=lambda c: c.id)
def test_a_record_that_changes_what_the_parsers_read_is_refused_once_there_is_output(
    case: GoldenCase,
) -> None:
    """vLLM builds its parser from each call's ``chat_request`` and replays the history through it:
    for held sessions that is a rebuild, O(the output so far) for one record. A later record that
    changes what the parsers read (here ``tool_choice: "none"``, or reasoning shown or hidden) is a 400
    and the request goes on with its request as it was, exactly as if the record had not come."""
    request = case.input[0]["body"]["chat_request"]
    changed = (
        {**request, "tool_choice": "auto" if request.get("tool_choice") == "none" else "none"}
        if request.get("tools")
        else {**request, "include_reasoning": not request.get("include_reasoning", True)}
    )
    records = copy.deepcopy(case.input)
    middle = len(records) // 2
    records[middle]["body"]["chat_request"] = changed
    without = [{**r, "seq": seq} for seq, r in enumerate(records[:middle] + records[middle + 1 :])]
    expected = [{**o, "seq": None} for o in normalize(_cold(case, without))]
    for warm in (_warm(case, records), _warm(case, records, max_live_parsers=0)):
        assert warm[middle]["error"]["code"] == 400, warm[middle]
        assert warm[middle]["error"]["param"] == "chat_request"
        rest = warm[:middle] + warm[middle + 1 :]
        assert [{**o, "seq": None} for o in normalize(rest)] == expected


@pytest.mark.parametrize("case", [c for c in STREAM_PARSER_CASES if _single_choice(c)], ids=lambda c: c.id)
def test_a_record_that_changes_what_the_parsers_do_not_read_keeps_the_sessions(
    case: GoldenCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = copy.deepcopy(case.input)
    middle = len(records) // 2
    records[middle]["body"]["chat_request"] = {**records[0]["body"]["chat_request"], "temperature": 0.25}
    builds = _counted_session_builds(monkeypatch, case)
    assert normalize(_warm(case, records)) == normalize(case.expected)
    assert builds == [1]  # the session built on the first record served every record


def test_a_change_before_any_output_is_parsed_with_the_new_request() -> None:
    """With no output yet, a session built from the new request costs nothing to build: the
    change is taken, as vLLM takes it."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    first = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    call = [151657, 198, 4913, 606, 788, 330, 455, 69364, 497, 330, 16370, 788, 314, 3417, 198, 151658]
    chunks: list[JsonDict] = [
        {"index": 0, "token_ids": []},
        {"index": 0, "token_ids": call},
        {"index": 0, "token_ids": [151645], "finish_reason": "stop"},
    ]
    records = []
    for seq, choice in enumerate(chunks):
        body: JsonDict = {"stream": True, "generate_chunk": {"request_id": "early", "choices": [choice]}}
        if seq == 0:
            body |= {"model": "test-model", "prompt_token_ids": [151644, 77091, 198], "chat_request": first}
        if seq == 1:
            body["chat_request"] = {**first, "tool_choice": "none"}
        records.append({"request_id": "early", "seq": seq, "endpoint": "chat", "body": body})
    case = GoldenCase("adhoc", "change-before-output", sample_config(parsers=True), records, [])
    warm = normalize(_warm(case, records))
    assert all("body" in output for output in warm)
    assert not any(c["delta"].get("tool_calls") for o in warm for c in o["body"]["chunk"]["choices"])
    assert warm == normalize(_cold(case, records))


def test_a_usage_only_record_after_the_finish_does_not_rebuild_the_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The finish ends the live session; the usage-only record that follows steps nothing, so it
    must not replay the whole output to rebuild one (that would make it cost O(output))."""
    request = {
        "model": "test-model",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks: list[JsonDict] = [
        {"choices": [{"index": 0, "token_ids": [151667, 9707]}]},
        {"choices": [{"index": 0, "token_ids": [151668, 26549], "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
    ]
    records = []
    for seq, chunk in enumerate(chunks):
        body: JsonDict = {"stream": True, "generate_chunk": {"request_id": "usage", **chunk}}
        if seq == 0:
            body |= {"model": "test-model", "prompt_token_ids": [151644, 77091, 198], "chat_request": request}
        records.append({"request_id": "usage", "seq": seq, "endpoint": "chat", "body": body})
    case = GoldenCase("adhoc", "usage-after-finish", sample_config(parsers=True), records, [])
    builds = _counted_session_builds(monkeypatch, case)
    warm = normalize(_warm(case, records))
    assert builds == [1]
    assert warm == normalize(_cold(case, records))


def test_a_refused_record_leaves_the_request_as_it_was() -> None:
    """A record refused after its request was read (here: it steps a finished choice, with a
    request asking for n=3) must not make that request the request's own."""
    prompt = [151644, 872, 198, 3872, 151645, 198, 151644, 77091, 198]
    request = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "n": 2}

    def record(seq: int, choice: JsonDict, **extra: Any) -> bytes:
        body = {"stream": True, "generate_chunk": {"request_id": "x", "choices": [choice]}, **extra}
        return orjson.dumps({"request_id": "x", "seq": seq, "endpoint": "chat", "body": body})

    processor = EnvelopeProcessor(derenderer_for(sample_config(parsers=True)))
    first = {"index": 0, "token_ids": [9707], "finish_reason": "length"}
    processor.process(record(0, first, model="test-model", prompt_token_ids=prompt, chat_request=request))
    refused = processor.process(
        record(1, {"index": 0, "token_ids": [9707]}, chat_request={**request, "n": 3})
    )
    assert refused.output is not None and refused.output["error"]["code"] == 400
    last = processor.process(record(2, {"index": 1, "token_ids": [9707], "finish_reason": "length"}))
    assert last.closed and processor.requests == {}  # both of the n=2 choices finished


def test_a_later_record_that_changes_the_prompt_is_refused_once_there_is_output() -> None:
    """The parsers read the prompt too (a thinking-off prompt ends reasoning before the output):
    a later record bringing other prompt ids is held to the same rule as a changed request."""
    prompt = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
    thinking_off = [*prompt, 151667, 271, 151668, 271]
    request = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
    records = []
    for seq, ids in enumerate([[9707], [11, 1879], [9707], [151645]]):
        choice: JsonDict = {"index": 0, "token_ids": ids}
        if seq == 3:
            choice["finish_reason"] = "stop"
        body: JsonDict = {"stream": True, "generate_chunk": {"request_id": "p", "choices": [choice]}}
        if seq == 0:
            body |= {"model": "test-model", "prompt_token_ids": prompt, "chat_request": request}
        if seq == 1:
            body["prompt_token_ids"] = thinking_off
        records.append({"request_id": "p", "seq": seq, "endpoint": "chat", "body": body})
    case = GoldenCase("adhoc", "prompt-change", sample_config(parsers=True), records, [])
    without = [{**r, "seq": seq} for seq, r in enumerate([records[0], *records[2:]])]
    expected = [{**o, "seq": None} for o in normalize(_cold(case, without))]
    for warm in (_warm(case, records), _warm(case, records, max_live_parsers=0)):
        assert warm[1]["error"]["code"] == 400 and warm[1]["error"]["param"] == "prompt_token_ids"
        assert [{**o, "seq": None} for o in normalize([warm[0], *warm[2:]])] == expected


def test_a_carried_state_does_not_pay_for_the_other_choices_replay() -> None:
    """With n=2 and output in both choices, a record that changes the request while carrying one
    choice's state would leave the other choice's session to be rebuilt from its whole history,
    unpaid: refused too."""
    prompt = [151644, 872, 198, 3872, 151645, 198, 151644, 77091, 198]
    request = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "n": 2}

    def record(seq: int, index: int, **extra: Any) -> bytes:
        choice = {"index": index, "token_ids": [9707]}
        body = {"stream": True, "generate_chunk": {"request_id": "n2", "choices": [choice]}, **extra}
        return orjson.dumps({"request_id": "n2", "seq": seq, "endpoint": "chat", "body": body})

    processor = EnvelopeProcessor(derenderer_for(sample_config(parsers=True)))
    first = processor.process(record(0, 0, model="test-model", prompt_token_ids=prompt, chat_request=request))
    processor.process(record(1, 1))
    assert first.output is not None
    changed = {**request, "include_reasoning": False}
    state = first.stream_state()
    refused = processor.process(record(2, 0, chat_request=changed, stream_state=state))
    assert refused.output is not None and refused.output["error"]["code"] == 400
