"""Model output nested deeper than Python's json reads (about 1,000 levels) fails where vLLM's does.

vLLM's parsers call ``json.loads`` on tool-call text; past the interpreter's recursion limit
that raises ``RecursionError``, not a ``ValueError``. vLLM's ``hermes`` swallows any failure
of a streamed record (the record sends nothing); the engine parsers (``qwen3_coder``) let it
out, and vLLM's derender answers 400 "invalid stream_state: derender failed". Neither is a
bug of ours, and the request goes on in both (here a 500 closed it, then every later record
got a 409).
"""

from __future__ import annotations

from typing import Any

import orjson

from tests.golden_cases import derenderer_for, sample_config
from tests.stream_builders import written
from worker.core.envelope_processor import EnvelopeProcessor

PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
DEPTH = 1500
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {arg: {"type": kind}}, "required": [arg]},
        },
    }
    for name, arg, kind in (("get_weather", "city", "string"), ("run_tests", "max_failures", "integer"))
]


def _outputs(tool_parser: str, chunks: list[str]) -> list[dict[str, Any]]:
    derenderer = derenderer_for(sample_config(parsers=True, tool_parser=tool_parser))
    encode = derenderer.tokenizer.backend.encode
    processor = EnvelopeProcessor(derenderer)
    outputs = []
    for seq, text in enumerate(chunks):
        ids = encode(text, add_special_tokens=False).ids
        choice: dict[str, Any] = {"index": 0, "token_ids": ids}
        if seq == len(chunks) - 1:
            choice["finish_reason"] = "stop"
        body: dict[str, Any] = {"stream": True, "generate_chunk": {"request_id": "r", "choices": [choice]}}
        if seq == 0:
            messages = [{"role": "user", "content": "hi"}]
            body |= {
                "model": "test-model",
                "prompt_token_ids": PROMPT,
                "chat_request": {"model": "test-model", "messages": messages, "tools": TOOLS},
            }
        record = {"request_id": "r", "seq": seq, "endpoint": "chat", "body": body}
        result = processor.process(orjson.dumps(record))
        assert result.output is not None and result.internal_error is None
        outputs.append(written(result))
    return outputs


def _tool_deltas(output: dict[str, Any]) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = output["body"]["chunk"]["choices"][0]["delta"].get("tool_calls") or []
    return calls


def test_hermes_sends_nothing_for_a_record_nested_too_deep_and_goes_on() -> None:
    outputs = _outputs(
        "hermes",
        [
            '<tool_call>\n{"name": "get_weather", "arguments": ',
            "[" * DEPTH,
            "]" * DEPTH + "}\n</tool_call>",
            "The end.",
        ],
    )
    assert not any("error" in output for output in outputs)
    assert [d["function"]["name"] for d in _tool_deltas(outputs[0])] == ["get_weather"]
    assert _tool_deltas(outputs[1]) == []  # the failed read: nothing sent, no call state moved
    # The record that closes the call streams the arguments whole, as nothing of them went out.
    arguments = "".join(d["function"]["arguments"] or "" for o in outputs for d in _tool_deltas(o))
    assert arguments == "[" * DEPTH + "]" * DEPTH


def test_qwen3_coder_answers_400_for_a_value_nested_too_deep_and_goes_on() -> None:
    outputs = _outputs(
        "qwen3_coder",
        [
            "<tool_call>\n<function=run_tests>\n<parameter=max_failures>\n",
            "[" * DEPTH,
            "]" * DEPTH,
            "\n</parameter>\n</function>\n</tool_call>",
            "x",
        ],
    )
    errors = [(o["seq"], o["error"]["code"], o["error"]["message"]) for o in outputs if "error" in o]
    assert errors == [(3, 400, "invalid stream_state: derender failed")]
    assert "error" not in outputs[4]  # the request is still open: no 409 for the next record
    assert outputs[4]["body"]["chunk"]["choices"][0]["finish_reason"] is not None
