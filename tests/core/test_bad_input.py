"""Bad input: each record gets a clear error (or dead letter) and the rest of the stream is untouched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.golden_cases import MODELS_DIR, derenderer_for, sample_config
from tests.stream_builders import chat_one_shot, chat_stream, written
from worker.core.envelope_processor import EnvelopeProcessor

PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
CONFIG = sample_config(max_model_len=64)


def _processor() -> EnvelopeProcessor:
    return EnvelopeProcessor(derenderer_for(CONFIG), max_record_bytes=64 * 1024)


def _good_stream() -> list[bytes]:
    return [orjson.dumps(r) for r in chat_stream("good", [[9707], [0], [151645]], prompt_token_ids=PROMPT)]


def _outputs(processor: EnvelopeProcessor, records: list[bytes]) -> list[Any]:
    return [processor.process(r) for r in records]


def _normalized_good(results: list[Any]) -> list[Any]:
    outs = [written(r) for r in results if r.output is not None and r.output["request_id"] == "good"]
    for o in outs:
        o["body"]["chunk"]["created"] = 0
    return outs


def _record(body: dict[str, Any], endpoint: str = "chat", rid: str = "bad", seq: int = 0) -> bytes:
    return orjson.dumps({"request_id": rid, "seq": seq, "endpoint": endpoint, "body": body})


DEAD_LETTERS: dict[str, bytes] = {
    "truncated JSON": b'{"request_id": "bad", "seq": 0, "endpoint": "chat", "body": {"stre',
    "not an object": b"[1, 2, 3]",
    "binary garbage": b"\xff\xfe\x00garbage",
    "unknown endpoint": _record({"stream": True}, endpoint="embeddings"),
    "negative seq": b'{"request_id": "bad", "seq": -1, "endpoint": "chat", "body": {}}',
    "seq of the wrong type": b'{"request_id": "bad", "seq": "zero", "endpoint": "chat", "body": {}}',
    "missing body": b'{"request_id": "bad", "seq": 0, "endpoint": "chat"}',
    "empty request_id": b'{"request_id": "", "seq": 0, "endpoint": "chat", "body": {}}',
    "oversize record": _record({"stream": True, "padding": "x" * 70_000}),
}


@pytest.mark.parametrize("name", sorted(DEAD_LETTERS))
def test_invalid_envelopes_are_dead_lettered_and_the_stream_goes_on(name: str) -> None:
    good = _good_stream()
    clean = _normalized_good(_outputs(_processor(), good))
    mixed = [good[0], DEAD_LETTERS[name], good[1], good[2]]
    results = _outputs(_processor(), mixed)
    bad = results[1]
    assert bad.output is None and bad.dead_letter is not None
    assert bad.dead_letter.reason  # a reason a person can act on
    assert bad.dead_letter.value == DEAD_LETTERS[name]  # the original bytes, unchanged
    assert _normalized_good(results) == clean


def _stream_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "stream": True,
        "generate_chunk": {"request_id": "bad", "choices": [{"index": 0, "token_ids": [9707]}]},
        "prompt_token_ids": PROMPT,
        "chat_request": {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]},
    }
    body.update(overrides)
    return body


REJECTED: dict[str, tuple[bytes, int]] = {
    "token_ids of the wrong type": (
        _record(
            _stream_body(generate_chunk={"request_id": "bad", "choices": [{"index": 0, "token_ids": "abc"}]})
        ),
        400,
    ),
    "negative id in a one-shot response": (
        orjson.dumps(chat_one_shot("bad", [-5, 0], prompt_token_ids=PROMPT)),
        400,
    ),
    "one-shot token_ids longer than max_model_len": (
        orjson.dumps(chat_one_shot("bad", [9707] * 65, prompt_token_ids=PROMPT)),
        400,
    ),
    "stream prompt + delta longer than max_model_len": (
        _record(
            _stream_body(
                generate_chunk={"request_id": "bad", "choices": [{"index": 0, "token_ids": [1] * 60}]}
            )
        ),
        400,
    ),
    "stream_state whose chunk lens disagree": (
        _record(_stream_body(stream_state={"output_token_ids": [1, 2, 3], "output_chunk_lens": [2]}), seq=0),
        400,
    ),
    "stream_state with a negative offset": (
        _record(_stream_body(stream_state={"prefix_offset": -1}), seq=0),
        400,
    ),
    "stream_state with an oversize window": (
        _record(_stream_body(stream_state={"prev_tokens": ["a"] * 1025}), seq=0),
        400,
    ),
    "two choices in one chunk": (
        _record(
            _stream_body(
                generate_chunk={
                    "request_id": "bad",
                    "choices": [{"index": 0, "token_ids": [1]}, {"index": 1, "token_ids": [2]}],
                }
            )
        ),
        400,
    ),
    "unknown model": (_record(_stream_body(model="other-model")), 404),
    "streaming stop strings": (
        _record(_stream_body(chat_request={"model": "m", "messages": [], "stop": ["!"]})),
        400,
    ),
    "tool_choice without tools": (
        _record(_stream_body(chat_request={"model": "m", "messages": [], "tool_choice": "required"})),
        400,
    ),
    **{
        f"named tool_choice, {name}": (
            _record(
                _stream_body(
                    chat_request={
                        "model": "m",
                        "messages": [],
                        "tools": tools,
                        "tool_choice": {"type": "function", "function": {"name": choice_name}},
                    }
                )
            ),
            400,
        )
        for name, tools, choice_name in (
            # vLLM's check walks these and fails with a 500; the fields' validation answers 400.
            ("tools not a list", 7, "f"),
            ("a tool that is a string", ["x"], "f"),
            ("a tool whose function is a list", [{"type": "function", "function": []}], "f"),
            ("a tool whose name is a list", [{"type": "function", "function": {"name": []}}], "f"),
            ("a name that is a list", [{"type": "function", "function": {"name": "f"}}], []),
            ("an empty name", [{"type": "function", "function": {"name": "f"}}], ""),
        )
    },
    "output_mode text": (
        _record(_stream_body(generate_chunk={"request_id": "bad", "output_mode": "text", "choices": []})),
        400,
    ),
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_bodies_get_an_error_record_and_the_stream_goes_on(name: str) -> None:
    record, code = REJECTED[name]
    good = _good_stream()
    clean = _normalized_good(_outputs(_processor(), good))
    results = _outputs(_processor(), [good[0], record, good[1], good[2]])
    bad = results[1]
    assert bad.dead_letter is None and bad.output is not None
    error = bad.output["error"]
    assert error["code"] == code
    assert error["message"] and error["type"]
    assert _normalized_good(results) == clean


def test_ids_beyond_the_vocabulary_and_negative_ids_decode_as_nothing_in_streams() -> None:
    records = chat_stream("r", [[9707], [10_000_000], [-3], [0], [151645]], prompt_token_ids=PROMPT)
    results = _outputs(_processor(), [orjson.dumps(r) for r in records])
    text = "".join(r.output["body"]["chunk"]["choices"][0]["delta"]["content"] or "" for r in results)
    assert text == "Hello!"


def test_sequence_gap_fails_the_request_and_duplicates_are_skipped() -> None:
    records = [
        orjson.dumps(r) for r in chat_stream("r", [[9707], [0], [15], [151645]], prompt_token_ids=PROMPT)
    ]
    processor = _processor()
    first = processor.process(records[0])
    assert first.output is not None and "body" in first.output
    assert processor.process(records[0]).duplicate
    gap = processor.process(records[2])
    assert gap.output is not None and gap.output["error"]["code"] == 409
    assert gap.output["error"]["type"] == "SequenceGapError" and gap.sequence_gap
    assert gap.closed and "r" not in processor.requests
    # A later record of the failed request has no state: a gap too, and nothing else is one.
    assert processor.process(records[3]).sequence_gap
    assert not first.sequence_gap and not processor.process(b"{not json").sequence_gap


def test_replay_reports_bad_lines_and_exits_non_zero(tmp_path: Path) -> None:
    good = _good_stream()
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join([good[0], b"{not json", good[1], b"", good[2]]) + b"\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker.cli",
            "replay",
            str(source),
            "--tokenizer",
            str(MODELS_DIR / "qwen3"),
            "--served-model-name",
            "test-model",
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(orjson.loads(line)["request_id"] == "good" for line in lines)
    assert b"line 2" in done.stderr and b"malformed JSON" in done.stderr


def test_a_request_whose_first_record_is_rejected_fails_as_a_whole() -> None:
    """Later records must not be derendered without the context the rejected first record carried."""
    request = {"model": "test-model", "messages": [], "stop": ["!"]}  # streaming stop strings: 400
    records = chat_stream("r", [[9707], [0], [151645]], prompt_token_ids=PROMPT, chat_request=request)
    results = _outputs(_processor(), [orjson.dumps(r) for r in records])
    codes = [r.output["error"]["code"] for r in results]
    assert codes == [400, 409, 409]


def test_a_rejected_later_record_keeps_the_request_going() -> None:
    records = chat_stream("r", [[9707], [0], [151645]], prompt_token_ids=PROMPT)
    records[1]["body"]["generate_chunk"]["choices"] = [
        {"index": 0, "token_ids": [0]},
        {"index": 1, "token_ids": [0]},
    ]  # two choices in one chunk: 400
    results = _outputs(_processor(), [orjson.dumps(r) for r in records])
    assert "body" in results[0].output
    assert results[1].output["error"]["code"] == 400
    last = results[2].output["body"]["chunk"]["choices"][0]
    assert last["finish_reason"] == "stop"
    assert results[2].closed


def _continued_by(later: dict[str, Any], seq: int) -> list[Any]:
    """A three-record stream with ``later`` (a record of the same request) put in at ``seq``."""
    records = chat_stream("r", [[9707], [0], [151645]], prompt_token_ids=PROMPT)
    later = {"request_id": "r", "seq": seq, **later}
    stream = [*records[:seq], later, *[{**r, "seq": r["seq"] + 1} for r in records[seq:]]]
    return _outputs(_processor(), [orjson.dumps(r) for r in stream])


def test_a_later_record_on_another_endpoint_is_a_400_and_the_request_goes_on() -> None:
    results = _continued_by({"endpoint": "completion", "body": {"stream": True}}, 1)
    assert [r.output["seq"] for r in results] == [0, 1, 2, 3]
    error = results[1].output["error"]
    assert (error["code"], error["message"]) == (
        400,
        "request 'r' started on endpoint 'chat', not 'completion'",
    )
    assert "body" in results[2].output and results[3].output["body"]["chunk"]["choices"][0]["finish_reason"]
    assert results[3].closed


def test_a_one_shot_record_under_an_open_streams_id_is_a_400_and_the_stream_goes_on() -> None:
    one_shot = orjson.loads(orjson.dumps(chat_one_shot("r", [9707], prompt_token_ids=PROMPT)))
    results = _continued_by({"endpoint": "chat", "body": one_shot["body"]}, 1)
    error = results[1].output["error"]
    assert error["code"] == 400 and "is an open stream" in error["message"]
    assert not results[1].closed
    assert "body" in results[2].output and results[3].closed


def test_a_one_shot_record_past_an_open_streams_seq_is_a_gap() -> None:
    records = chat_stream("r", [[9707], [0], [151645]], prompt_token_ids=PROMPT)
    one_shot = {**chat_one_shot("r", [9707], prompt_token_ids=PROMPT), "seq": 10}
    results = _outputs(_processor(), [orjson.dumps(r) for r in [records[0], one_shot, *records[1:]]])
    assert results[1].output["error"]["code"] == 409 and results[1].closed
    assert [r.duplicate for r in results[2:]] == [True, True]  # the request is over at seq 10


@pytest.mark.parametrize(
    ("tools", "tool_choice", "message"),
    [
        (
            [{"type": "function", "function": {"name": "f"}}],
            {"type": "function", "function": {"name": "g"}},
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
        ),
        (
            [{"type": "function", "function": {"name": "f"}}],
            {"type": "function", "function": {"name": 3}},
            "Invalid `name` in `function`: `3` in `tool_choice`!",
        ),
        (
            [{"type": "function", "function": {"name": "f"}}],
            {"type": "function"},
            "Invalid value for `function`: `None` in `tool_choice`!",
        ),
        (
            [{"type": "function", "function": {"name": "f"}}],
            "sometimes",
            'Invalid value for `tool_choice`: sometimes! Only named tools, "none", "auto" or "required"',
        ),
        ([], None, "`tools` must not be an empty array."),
    ],
)
def test_tool_usage_errors_say_what_vllm_says(tools: Any, tool_choice: Any, message: str) -> None:
    request: dict[str, Any] = {"model": "m", "messages": [], "tools": tools}
    if tool_choice is not None:
        request["tool_choice"] = tool_choice
    (result,) = _outputs(_processor(), [_record(_stream_body(chat_request=request))])
    error = result.output["error"]
    assert error["code"] == 400
    assert message in error["message"]


def test_tool_usage_errors_name_vllms_parameter() -> None:
    request = {"model": "m", "messages": [], "tool_choice": "auto"}
    (result,) = _outputs(_processor(), [_record(_stream_body(chat_request=request))])
    error = result.output["error"]
    assert (
        "'msg': 'Value error, When using `tool_choice`, `tools` must be set. (parameter=tool_choice)'"
        in (error["message"])
    )
    assert error["param"] == "tool_choice"


# vLLM 0.33.0 runs these rules on `chat_request` / `completion_request` before their fields: the
# text after "Value error, " is its exception's, and `param` the parameter it names (else where
# the error is). Each case: the request's fields over a valid request, the text, the param.
CHAT_RULES: dict[str, tuple[dict[str, Any], str, str]] = {
    "top_logprobs below -1": (
        {"logprobs": True, "top_logprobs": -2},
        "`top_logprobs` must be a positive value or -1. (parameter=top_logprobs, value=-2)",
        "top_logprobs",
    ),
    "top_logprobs without logprobs": (
        {"logprobs": False, "top_logprobs": 2},
        "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
        "top_logprobs",
    ),
    "top_logprobs -1 without logprobs": (
        {"top_logprobs": -1},
        "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
        "top_logprobs",
    ),
    # vLLM checks the raw value's type before pydantic's lax mode could turn "2" into 2.
    "top_logprobs as a string": (
        {"logprobs": True, "top_logprobs": "2"},
        "`top_logprobs` must be an integer. (parameter=top_logprobs, value=2)",
        "top_logprobs",
    ),
    "prompt_logprobs as a string": (
        {"prompt_logprobs": "1"},
        "`prompt_logprobs` must be an integer. (parameter=prompt_logprobs, value=1)",
        "prompt_logprobs",
    ),
    "prompt_logprobs when streaming": (
        {"stream": True, "prompt_logprobs": 1},
        "`prompt_logprobs` are not available when `stream=True`. (parameter=prompt_logprobs)",
        "prompt_logprobs",
    ),
    "prompt_logprobs below -1": (
        {"prompt_logprobs": -3},
        "`prompt_logprobs` must be a positive value or -1. (parameter=prompt_logprobs, value=-3)",
        "prompt_logprobs",
    ),
    "logprob_token_ids with beam search": (
        {"logprobs": True, "logprob_token_ids": [1], "use_beam_search": True},
        "`logprob_token_ids` is not supported with beam search. (parameter=logprob_token_ids)",
        "logprob_token_ids",
    ),
    "logprob_token_ids without logprobs": (
        {"logprob_token_ids": [1]},
        "when using `logprob_token_ids`, `logprobs` must be set to true. (parameter=logprob_token_ids)",
        "logprob_token_ids",
    ),
    "stream_options without stream": (
        {"stream": False, "stream_options": {"include_usage": False}},
        "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
        "stream_options",
    ),
    "both generation-prompt flags": (
        {"add_generation_prompt": True, "continue_final_message": True},
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        "body.chat_request",
    ),
    "two structured-output constraint kinds": (
        {"structured_outputs": {"json": {"type": "object"}, "regex": "a+"}},
        "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice').",
        "body.chat_request",
    ),
    "a structured-output constraint and a named tool": (
        {
            "structured_outputs": {"regex": "a+"},
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
        "You can only either use constraints for structured outputs or tools, not both.",
        "body.chat_request",
    ),
    # vLLM's check counts a null tool_choice as a named one.
    "a structured-output constraint and a null tool_choice": (
        {"structured_outputs": {"choice": ["a", "b"]}, "tool_choice": None},
        "You can only either use constraints for structured outputs or tools, not both.",
        "body.chat_request",
    ),
    "a json_schema response format without its schema": (
        {"response_format": {"type": "json_schema"}},
        "When response_format type is 'json_schema', the 'json_schema' field must be provided. "
        "(parameter=response_format)",
        "response_format",
    ),
    "an empty cache_salt": (
        {"cache_salt": ""},
        "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)",
        "cache_salt",
    ),
    "a cache_salt with a slash": (
        {"cache_salt": "a/b"},
        "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', "
        "'\\\\', or NUL. (parameter=cache_salt)",
        "cache_salt",
    ),
}

# Bodies next to the rejected ones that vLLM takes.
CHAT_NEIGHBOURS: dict[str, dict[str, Any]] = {
    "top_logprobs -1 with logprobs": {"logprobs": True, "top_logprobs": -1},
    "top_logprobs 0 without logprobs": {"logprobs": False, "top_logprobs": 0},
    "null top_logprobs": {"top_logprobs": None},
    "top_logprobs as a float": {"logprobs": True, "top_logprobs": 2.0},
    "prompt_logprobs 0 when streaming": {"stream": True, "prompt_logprobs": 0},
    "prompt_logprobs -1 one-shot": {"prompt_logprobs": -1},
    "empty stream_options without stream": {"stream_options": {}},
    "stream_options with stream": {"stream": True, "stream_options": {"include_usage": True}},
    "continue_final_message alone": {"add_generation_prompt": False, "continue_final_message": True},
    "one structured-output constraint kind and a null one": {
        "structured_outputs": {"json": {}, "regex": None}
    },
    "a structured-output constraint with tools on auto": {
        "structured_outputs": {"regex": "a+"},
        "tools": [{"type": "function", "function": {"name": "f"}}],
    },
    "a json_schema response format with its schema": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}
    },
    "a plain cache_salt": {"cache_salt": "salt"},
}

COMPLETION_RULES: dict[str, tuple[dict[str, Any], str, str]] = {
    "logprobs below -1": (
        {"logprobs": -2},
        "`logprobs` must be a positive value or -1. (parameter=logprobs, value=-2)",
        "logprobs",
    ),
    "logprobs as a string": (
        {"logprobs": "1"},
        "`logprobs` must be an integer. (parameter=logprobs, value=1)",
        "logprobs",
    ),
    "no prompt": (
        {"prompt": None},
        "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
        "prompt",
    ),
    "an empty prompt": (
        {"prompt": ""},
        "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
        "prompt",
    ),
    "prompt_logprobs when streaming": (
        {"stream": True, "prompt_logprobs": -1},
        "`prompt_logprobs` are not available when `stream=True`. (parameter=prompt_logprobs)",
        "prompt_logprobs",
    ),
    "stream_options without stream": (
        {"stream_options": {"include_usage": True}},
        "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
        "stream_options",
    ),
    "logprob_token_ids without logprobs": (
        {"logprob_token_ids": [1]},
        "when using `logprob_token_ids`, `logprobs` must be set. (parameter=logprob_token_ids)",
        "logprob_token_ids",
    ),
    "logprob_token_ids on an echo of max_tokens 0": (
        {"logprobs": 0, "logprob_token_ids": [1], "echo": True, "max_tokens": 0},
        "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because no output "
        "tokens are generated. (parameter=logprob_token_ids)",
        "logprob_token_ids",
    ),
    "echo with logprobs and beam search": (
        {"logprobs": 0, "echo": True, "use_beam_search": True},
        "`echo` with `logprobs` is not supported with beam search because beam search does not compute "
        "prompt logprobs. (parameter=echo)",
        "echo",
    ),
    "two structured-output constraint kinds": (
        {"structured_outputs": {"choice": ["a"], "regex": "a+"}},
        "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice'). "
        "(parameter=structured_outputs)",
        "structured_outputs",
    ),
    "too many prompts": (
        {"prompt": ["p"] * 1025},
        "prompt list length 1025 exceeds the maximum allowed count of 1024. To increase this limit, set "
        "the VLLM_MAX_COMPLETION_PROMPTS environment variable. (parameter=prompt)",
        "prompt",
    ),
}

COMPLETION_NEIGHBOURS: dict[str, dict[str, Any]] = {
    "logprobs -1": {"logprobs": -1},
    "logprobs 0": {"logprobs": 0},
    "prompt embeddings instead of a prompt": {"prompt": None, "prompt_embeds": "AAAA"},
    "token ids as the prompt": {"prompt": [9707, 0]},
    "1024 prompts": {"prompt": ["p"] * 1024},
    "1025 token ids as the prompt": {"prompt": [1] * 1025},
    "prompt_logprobs 0 when streaming": {"stream": True, "prompt_logprobs": 0},
    "stream_options with stream": {"stream": True, "stream_options": {"include_usage": True}},
    "a structured-output constraint with tools named": {
        "structured_outputs": {"regex": "a+"},
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    },
}


def _chat_request(**fields: Any) -> dict[str, Any]:
    return {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], **fields}


def _completion_stream_record(**fields: Any) -> bytes:
    request = {"model": "test-model", "prompt": "Hi", **fields}
    body = {
        "stream": True,
        "generate_chunk": {"request_id": "bad", "choices": [{"index": 0, "token_ids": [9707]}]},
        "prompt_token_ids": [13048],
        "completion_request": request,
    }
    return _record(body, endpoint="completion")


def _rule_error(record: bytes) -> dict[str, Any]:
    (result,) = _outputs(_processor(), [record])
    assert result.output is not None and "error" in result.output, result.output
    error: dict[str, Any] = result.output["error"]
    assert (error["code"], error["type"]) == (400, "Bad Request")
    return error


@pytest.mark.parametrize("name", sorted(CHAT_RULES))
def test_chat_request_rules_answer_as_vllm(name: str) -> None:
    fields, text, param = CHAT_RULES[name]
    error = _rule_error(_record(_stream_body(chat_request=_chat_request(**fields))))
    expected = f"{{'type': 'value_error', 'loc': 'body.chat_request', 'msg': {'Value error, ' + text!r}}}"
    assert error["message"] == f"1 validation error:\n  {expected}"
    assert error["param"] == param


@pytest.mark.parametrize("name", sorted(CHAT_RULES))
def test_chat_request_rules_hold_one_shot_too(name: str) -> None:
    fields, text, param = CHAT_RULES[name]
    record = chat_one_shot(
        "bad", [9707, 151645], prompt_token_ids=PROMPT, chat_request=_chat_request(**fields)
    )
    error = _rule_error(orjson.dumps(record))
    assert f"'loc': 'body.chat_request', 'msg': {'Value error, ' + text!r}" in error["message"]
    assert error["param"] == param


@pytest.mark.parametrize("name", sorted(CHAT_NEIGHBOURS))
def test_chat_requests_next_to_the_rules_pass(name: str) -> None:
    record = _record(_stream_body(chat_request=_chat_request(**CHAT_NEIGHBOURS[name])))
    (result,) = _outputs(_processor(), [record])
    assert result.output is not None and "body" in result.output, result.output


@pytest.mark.parametrize("name", sorted(COMPLETION_RULES))
def test_completion_request_rules_answer_as_vllm(name: str) -> None:
    fields, text, param = COMPLETION_RULES[name]
    error = _rule_error(_completion_stream_record(**fields))
    expected = (
        f"{{'type': 'value_error', 'loc': 'body.completion_request', 'msg': {'Value error, ' + text!r}}}"
    )
    assert error["message"] == f"1 validation error:\n  {expected}"
    assert error["param"] == param


@pytest.mark.parametrize("name", sorted(COMPLETION_NEIGHBOURS))
def test_completion_requests_next_to_the_rules_pass(name: str) -> None:
    (result,) = _outputs(_processor(), [_completion_stream_record(**COMPLETION_NEIGHBOURS[name])])
    assert result.output is not None and "body" in result.output, result.output


@pytest.mark.parametrize(
    ("fields", "first"),
    [
        # vLLM runs its before-validators last-defined first: generation prompt, tools, structured
        # outputs, logprobs, stream options, response format, cache salt.
        (
            {"add_generation_prompt": True, "continue_final_message": True, "tools": []},
            "continue_final_message",
        ),
        ({"tools": [], "logprob_token_ids": [1]}, "`tools` must not be an empty array"),
        (
            {"tools": [], "structured_outputs": {"json": {}, "regex": "a"}},
            "`tools` must not be an empty array",
        ),
        ({"structured_outputs": {"json": {}, "regex": "a"}, "top_logprobs": -2}, "one kind of constraints"),
        (
            {"top_logprobs": -2, "stream_options": {"include_usage": True}},
            "(parameter=top_logprobs, value=-2)",
        ),
        ({"stream_options": {"x": 1}, "response_format": {"type": "json_schema"}}, "Stream options"),
        (
            {"response_format": {"type": "json_schema"}, "cache_salt": ""},
            "'json_schema' field must be provided",
        ),
        # The rules come before the fields' own validation.
        ({"cache_salt": "", "n": "many"}, "'cache_salt' must be a non-empty string"),
    ],
)
def test_chat_request_rules_run_in_vllms_order(fields: dict[str, Any], first: str) -> None:
    error = _rule_error(_record(_stream_body(chat_request=_chat_request(**fields))))
    assert error["message"].startswith("1 validation error:\n")
    assert first in error["message"]


@pytest.mark.parametrize(
    ("fields", "first"),
    [
        ({"prompt": ["p"] * 1025, "stream_options": {"include_usage": True}}, "prompt list length 1025"),
        ({"prompt": None, "stream_options": {"include_usage": True}}, "Either prompt or prompt_embeds"),
        ({"stream_options": {"include_usage": True}, "logprobs": -2}, "Stream options"),
        (
            {"logprobs": -2, "structured_outputs": {"json": {}, "regex": "a"}},
            "(parameter=logprobs, value=-2)",
        ),
        (
            {"structured_outputs": {"json": {}, "regex": "a"}, "response_format": {"type": "json_schema"}},
            "one kind",
        ),
        (
            {"response_format": {"type": "json_schema"}, "cache_salt": ""},
            "'json_schema' field must be provided",
        ),
    ],
)
def test_completion_request_rules_run_in_vllms_order(fields: dict[str, Any], first: str) -> None:
    error = _rule_error(_completion_stream_record(**fields))
    assert error["message"].startswith("1 validation error:\n")
    assert first in error["message"]


@pytest.mark.parametrize(
    ("fields", "param", "msg"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "body.chat_request.stop", "List should have at most 4 items"),
        (
            {"seed": 2**63},
            "body.chat_request.seed",
            "Input should be less than or equal to 9223372036854775807",
        ),
        (
            {"truncate_prompt_tokens": -2},
            "body.chat_request.truncate_prompt_tokens",
            "Input should be greater than or equal to -1",
        ),
        (
            {"priority": "first"},
            "body.chat_request.priority",
            "Input should be a valid integer, unable to parse string as an integer",
        ),
        (
            {"routed_experts_prompt_start": -1},
            "body.chat_request.routed_experts_prompt_start",
            "Input should be greater than or equal to 0",
        ),
        (
            {"stream_interval": 0},
            "body.chat_request.stream_interval",
            "Input should be greater than or equal to 1",
        ),
        (
            {"structured_outputs": "json"},
            "body.chat_request.structured_outputs",
            "Input should be a valid dictionary",
        ),
    ],
)
def test_chat_request_fields_are_bounded_as_in_vllm(fields: dict[str, Any], param: str, msg: str) -> None:
    error = _rule_error(_record(_stream_body(chat_request=_chat_request(**fields))))
    assert error["param"] == param
    assert f"'loc': '{param}', 'msg': '{msg}" in error["message"]


def test_completion_prompt_token_ids_must_not_be_negative() -> None:
    error = _rule_error(_completion_stream_record(prompt=[1, -1]))
    assert error["param"] == "body.completion_request.prompt.1"
    assert (
        "'loc': 'body.completion_request.prompt.1', 'msg': 'Input should be greater than or equal to 0'"
        in (error["message"])
    )


def test_a_completion_request_n_may_not_be_null() -> None:
    error = _rule_error(_completion_stream_record(n=None))
    assert error["param"] == "body.completion_request.n"
