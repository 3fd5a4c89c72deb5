"""A stream whose ``stream_state`` crosses vLLM versions loses no text.

vLLM 0.33 and 0.34 each ignore the other's window key, so a stream handed between them silently
drops its first characters. Here every one-choice plain golden stream is handed to the other
version at every record boundary (each record goes to a fresh worker of the other version, with
the state the previous one returned), starting from either version: each chunk equals the one the
answering version writes when it runs the stream alone, so the text is the single-version text.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from tests.golden_cases import GoldenCase, derenderer_for, load_cases, normalize, sample_config
from tests.stream_builders import written
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.vllm_version import StateForm, VllmVersion

OTHER = {VllmVersion.V0_33: VllmVersion.V0_34, VllmVersion.V0_34: VllmVersion.V0_33}
FORM = {VllmVersion.V0_33: StateForm.TOKENS, VllmVersion.V0_34: StateForm.IDS}


def _plain_streams() -> list[GoldenCase]:
    """Golden streams without parsers, whose records carry their whole context and no state, with
    one choice (a later choice's first record has no state to carry: a new worker would refuse it)."""
    return [
        case
        for case in load_cases()
        if not case.uses_parser
        and all(e["body"].get("stream") is True for e in case.input)
        and all("stream_state" not in e["body"] for e in case.input)
        and all(("prompt_token_ids" in e["body"]) for e in case.input)
        and all(c["index"] == 0 for e in case.input for c in e["body"]["generate_chunk"].get("choices") or [])
    ]


STREAMS = _plain_streams()


def _choice_index(envelope: dict[str, Any], last: int) -> int:
    choices = envelope["body"]["generate_chunk"].get("choices") or []
    return int(choices[0]["index"]) if choices else last


def _alone(case: GoldenCase, version: VllmVersion) -> list[dict[str, Any]]:
    processor = EnvelopeProcessor(derenderer_for(case.config, version))
    return [written(processor.process(orjson.dumps(e))) for e in case.input]


def _handed_over(case: GoldenCase, first: VllmVersion) -> list[tuple[VllmVersion, dict[str, Any]]]:
    """Each record on a fresh worker, the versions alternating, the last state of its choice carried."""
    states: dict[tuple[str, int], Any] = {}
    last_index: dict[str, int] = {}
    version = first
    out = []
    for envelope in case.input:
        rid = envelope["request_id"]
        index = _choice_index(envelope, last_index.get(rid, 0))
        last_index[rid] = index
        sent = copy.deepcopy(envelope)
        if (rid, index) in states:
            sent["body"]["stream_state"] = states[(rid, index)]
        output = written(EnvelopeProcessor(derenderer_for(case.config, version)).process(orjson.dumps(sent)))
        if "body" in output:
            states[(rid, index)] = output["body"]["stream_state"]
        out.append((version, output))
        version = OTHER[version]
    return out


def _text(outputs: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    text: dict[tuple[str, int], str] = {}
    for output in outputs:
        for choice in (output.get("body") or {}).get("chunk", {}).get("choices", []):
            piece = choice["delta"].get("content") if "delta" in choice else choice.get("text")
            key = (output["request_id"], choice["index"])
            text[key] = text.get(key, "") + (piece or "")
    return text


def _without_state(output: dict[str, Any]) -> dict[str, Any]:
    body = output.get("body")
    if body is None:
        return output
    return {**output, "body": {"chunk": body["chunk"]}}


def test_there_are_plain_streams_to_hand_over() -> None:
    assert len(STREAMS) >= 20
    assert sum(len(c.input) for c in STREAMS) >= 150


@pytest.mark.parametrize("first", list(VllmVersion), ids=lambda v: f"from-{v.value}")
@pytest.mark.parametrize("case", STREAMS, ids=lambda c: f"{c.file}:{c.id}")
def test_a_stream_crossing_versions_at_every_boundary_loses_no_text(
    case: GoldenCase, first: VllmVersion
) -> None:
    alone = {v: _alone(case, v) for v in VllmVersion}
    handed = _handed_over(case, first)
    for seq, (version, output) in enumerate(handed):
        assert normalize([_without_state(output)]) == normalize([_without_state(alone[version][seq])]), (
            f"seq {seq} on {version.value}"
        )
        state = (output.get("body") or {}).get("stream_state")
        if state is not None:
            # Answered in the form the stream came in: the first worker's.
            assert FORM[first].value in state and FORM[OTHER[first]].value not in state, state
    assert _text([o for _, o in handed]) == _text(alone[first]) == _text(alone[OTHER[first]])


# --- one state, both keys ----------------------------------------------------------------------


def _chunk(token_ids: list[int], state: dict[str, Any] | None, seq: int) -> bytes:
    body: dict[str, Any] = {
        "stream": True,
        "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": token_ids}]},
        "prompt_token_ids": [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198],
        "chat_request": {
            "model": "test-model",
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": True,
        },
    }
    if state is not None:
        body["stream_state"] = state
    return orjson.dumps({"request_id": "r", "seq": seq, "endpoint": "chat", "body": body})


def _first_state(version: VllmVersion) -> dict[str, Any]:
    """The state after "Sure" and the first byte of a two-token character (the window holds it)."""
    processor = EnvelopeProcessor(derenderer_for(sample_config(), version))
    result = processor.process(_chunk([39814, 0, 61804], None, 0))  # "Sure", "!", half of " 👋"
    state = result.stream_state()
    assert state is not None
    return state


def test_a_state_with_both_keys_that_agree_is_accepted_and_answered_in_the_configured_form() -> None:
    ids_state = _first_state(VllmVersion.V0_34)
    tokens_state = _first_state(VllmVersion.V0_33)
    both = {**tokens_state, "prev_token_ids": ids_state["prev_token_ids"]}
    for version in VllmVersion:
        out = EnvelopeProcessor(derenderer_for(sample_config(), version)).process(_chunk([233], both, 1))
        alone = EnvelopeProcessor(derenderer_for(sample_config(), version)).process(
            _chunk([233], tokens_state if version is VllmVersion.V0_33 else ids_state, 1)
        )
        assert written(out) == written(alone)
        state = out.stream_state()
        assert state is not None and FORM[version].value in state and FORM[OTHER[version]].value not in state


def test_a_state_whose_two_windows_disagree_is_a_400() -> None:
    ids_state = _first_state(VllmVersion.V0_34)
    tokens_state = _first_state(VllmVersion.V0_33)
    wrong = [*ids_state["prev_token_ids"][:-1], ids_state["prev_token_ids"][-1] + 1]
    for version in VllmVersion:
        processor = EnvelopeProcessor(derenderer_for(sample_config(), version))
        out = written(processor.process(_chunk([233], {**tokens_state, "prev_token_ids": wrong}, 1)))
        assert out["error"]["code"] == 400, out
        assert "disagree" in out["error"]["message"]
        short = written(processor.process(_chunk([233], {**tokens_state, "prev_token_ids": wrong[:-1]}, 2)))
        assert short["error"]["code"] == 400 and "disagree" in short["error"]["message"], short
