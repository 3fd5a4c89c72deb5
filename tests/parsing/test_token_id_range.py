"""Token ids a tokenizer cannot take (outside 0..2**32-1) reaching a parser: a 400, never a 500.

The envelope schema lets any 64-bit id through, and the decoder reads such ids as "" (as vLLM's
detokenizer does). vLLM's parser engine also decodes a record's ids one by one (when the record
has text or a marker id), and its tokenizer raises ``OverflowError`` on them, which vLLM's
endpoint answers with a 400. The worker answers the same records with a 400 naming the id, the
request goes on, and the failed record does not advance it.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.golden_cases import derenderer_for
from worker.core.envelope_processor import EnvelopeProcessor, ProcessResult

PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
HELLO, TOOL_CALL, THINK_END = 9707, 151657, 151668
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
OUT_OF_RANGE = [-1, -(2**63), 2**32, 2**63 - 1]


def _processor(tool_parser: str | None, reasoning_parser: str | None = "qwen3") -> EnvelopeProcessor:
    config = {
        "model_dir": "qwen3",
        "served_model_name": "test-model",
        "reasoning_parser": reasoning_parser,
        "tool_parser": tool_parser,
        "enable_auto_tool_choice": tool_parser is not None,
    }
    return EnvelopeProcessor(derenderer_for(config))


def _record(seq: int, ids: list[int]) -> bytes:
    body: dict[str, Any] = {
        "stream": True,
        "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": ids}]},
    }
    if seq == 0:
        body |= {
            "model": "test-model",
            "prompt_token_ids": PROMPT,
            "chat_request": {
                "model": "test-model",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": TOOLS,
            },
        }
    return orjson.dumps({"request_id": "r", "seq": seq, "endpoint": "chat", "body": body})


def _error(result: ProcessResult) -> Any:
    assert result.output is not None
    return result.output.get("error")


@pytest.mark.parametrize("bad", OUT_OF_RANGE)
@pytest.mark.parametrize(
    ("tool_parser", "reasoning_parser", "first"),
    [
        ("qwen3_coder", "qwen3", [THINK_END, HELLO]),
        ("qwen3_xml", "qwen3", [THINK_END, HELLO]),
        ("qwen3_coder", None, [HELLO]),
        ("hermes", "qwen3", [HELLO]),  # still reasoning: the engine reasoning parser reads the ids
    ],
)
@pytest.mark.parametrize(
    "ids",
    [
        pytest.param([TOOL_CALL, 0], id="with-a-marker"),
        pytest.param([HELLO, 0], id="with-text"),
    ],
)
def test_an_id_out_of_range_where_the_parser_decodes_ids_is_a_400(
    bad: int, tool_parser: str, reasoning_parser: str | None, first: list[int], ids: list[int]
) -> None:
    processor = _processor(tool_parser, reasoning_parser)
    assert _error(processor.process(_record(0, first))) is None
    failed = processor.process(_record(1, [bad if i == 0 else i for i in ids]))
    assert failed.internal_error is None
    error = _error(failed)
    assert error is not None and error["code"] == 400 and str(bad) in error["message"]
    # The request goes on from where it was: the failed record left no trace in its state.
    state = processor.requests["r"].sequences[0]
    assert state.output_token_ids == first
    after = processor.process(_record(2, [HELLO]))
    assert _error(after) is None


@pytest.mark.parametrize("bad", OUT_OF_RANGE)
def test_a_record_with_no_text_and_no_marker_reads_the_id_as_nothing_as_vllm(bad: int) -> None:
    processor = _processor("qwen3_coder")
    assert _error(processor.process(_record(0, [THINK_END, HELLO]))) is None
    out = processor.process(_record(1, [bad]))
    assert _error(out) is None
    assert out.output is not None
    assert out.output["body"]["chunk"]["choices"][0]["delta"]["content"] is None


@pytest.mark.parametrize("bad", OUT_OF_RANGE)
@pytest.mark.parametrize("first", [[], [THINK_END]])
def test_a_parser_that_does_not_decode_ids_reads_them_as_nothing_as_vllm(bad: int, first: list[int]) -> None:
    # hermes alone, or hermes once the engine reasoning parser is done: vLLM only counts ids there.
    processor = _processor("hermes", "qwen3" if first else None)
    assert _error(processor.process(_record(0, [*first, HELLO]))) is None
    out = processor.process(_record(1, [HELLO, bad, TOOL_CALL]))
    assert _error(out) is None


def test_ids_past_the_vocabulary_but_in_range_decode_as_nothing() -> None:
    processor = _processor("qwen3_coder")
    out = processor.process(_record(0, [THINK_END, HELLO, 2**32 - 1, TOOL_CALL]))
    assert _error(out) is None
