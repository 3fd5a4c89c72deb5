"""llama3_json reads a finished call once: a record re-reads only the object in progress.

vLLM re-reads every object of the output at every record; the parser keeps the
objects that are complete and followed by ``; {`` (or two other characters
without brackets or quotes, blanks, then ``{``), which read the same forever.
The work is checked by counting the characters handed to the partial-JSON reader.
"""

from __future__ import annotations

import json

import pytest

from tests.parsing_helpers import records, sample_encode, sample_tokenizer, tool_parsing
from worker.core.parsing import ParseRequest
from worker.core.parsing.tools import llama3_json

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = '{"name": "get_weather", "parameters": {"city": "Zürich", "days": 3}}'


def test_each_record_reads_only_the_object_in_progress(partial_json_reads: list[int]) -> None:
    read = partial_json_reads
    text = "<|python_tag|>" + "; ".join([CALL] * 40)
    ids = sample_encode("llama-3.1", text)
    session = tool_parsing("llama-3.1", "llama3_json").new_stream(
        ParseRequest(tools=TOOLS, tool_choice="auto", parallel_tool_calls=None), [1]
    )
    names = 0
    for piece, chunk in records(sample_tokenizer("llama-3.1"), [[i] for i in ids]):
        read.clear()
        delta, _ = session.step(piece, chunk, None)
        # One partial read of the current object (plus the one it just finished and the next).
        assert sum(read) <= 3 * (len(CALL) + 2), sum(read)
        names += sum(
            1 for call in (delta.tool_calls if delta else []) if call.function and call.function.name
        )
    assert names == 40


LINE = 'print("café", {"k": [1, 2]})\t# 北京 \\ 😀\n'
#: Argument shapes: a long string, many short arguments, numbers, nested containers, deep nesting.
SHAPES = {
    "long string": {"path": "a.py", "content": LINE * 120},
    "many short arguments": {f"k{i}": i for i in range(300)},
    "many short strings": {f"k{i}": f"v{i}" for i in range(200)},
    "numbers": {f"n{i}": [-1.5e3 * i, 0.25, 10**i % 997, True, None] for i in range(80)},
    "nested lists and objects": {"rows": [{"id": i, "tags": ["a", {"b": [i, "c"]}]} for i in range(60)]},
    "deep nesting": {"a": json.loads("[" * 120 + '"x"' + "]" * 120), "b": 1},
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_call_in_progress_costs_each_record_its_own_characters(
    partial_json_reads: list[int], shape: str
) -> None:
    """Once the name is sent, a record scans its own characters plus a constant window, never the call."""
    read = partial_json_reads
    args = SHAPES[shape]
    body = json.dumps(args, ensure_ascii=False)
    text = '<|python_tag|>{"name": "write_file", "parameters": ' + body + "}"
    ids = sample_encode("llama-3.1", text)
    session = tool_parsing("llama-3.1", "llama3_json").new_stream(
        ParseRequest(tools=TOOLS, tool_choice="auto", parallel_tool_calls=None), [1]
    )
    parser = session._parser.tools
    assert isinstance(parser, llama3_json.Llama3JsonToolParser)
    streamed, inside = "", 0
    for piece, chunk in records(sample_tokenizer("llama-3.1"), [[i] for i in ids]):
        reader = parser._reader
        before = reader.scanned if reader is not None else 0
        read.clear()
        delta, _ = session.step(piece, chunk, None)
        streamed += "".join(
            c.function.arguments or "" for c in (delta.tool_calls if delta else []) if c.function
        )
        if reader is not None and parser._reader is reader:
            inside += 1
            assert not read  # the call is not re-read
            assert reader.scanned - before <= 3 * len(piece) + 48, (piece, reader.scanned - before)
    # Every record after the name's few was read this way, and the stream is the whole argument.
    assert inside > len(ids) - 30
    streamed += parser.remaining_unstreamed_args()
    assert json.loads(streamed) == args
