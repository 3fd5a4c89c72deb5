"""Shared harness of the parsing tests: sample tokenizers, stream records, delta summaries.

A stream record carries the cumulative-decode difference of its ids, like the
core's detokenizer (partial UTF-8 held back unless told otherwise).

Ready-made harnesses sit on top: the Qwen3 one (``samples/models/qwen3``, a
user turn as prompt; the behaviour tests), the XML-tool one on top of it
(its tools, ids checked; the qwen3_coder, qwen3_xml and glm45 tests) and the
tool-only one over any sample tokenizer with a one-tool request (the
pythonic, llama3_json and llama4_pythonic tests), and :class:`SampleHarness`,
one sample tokenizer's driver for a parser's own tests with their own tools
(the deepseek_v31, mistral and kimi_k2 tests; ``DEEPSEEK_V3`` and its markers
are shared with the tool-call id pin tests). :class:`MistralV11StubTokenizer`
stands in for the Mistral v11+ vocabulary no sample has (the mistral and
tool-schema tests).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, TypeVar

from tests.golden_cases import MODELS_DIR
from worker.core.model_dir import LoadedTokenizer, load_tokenizer
from worker.core.parsing import (
    ChatParsing,
    ChatStreamSession,
    DeltaOut,
    ParsedMessage,
    ParseRequest,
    ParserTokenizer,
    TokenizerAdapter,
    adapter_for,
)
from worker.core.parsing.tools._pythonic_common import PythonicStream
from worker.core.parsing.tools.llama3_json import Llama3JsonToolParser

P = TypeVar("P")

# -- tokenizers and records ------------------------------------------------------


@cache
def sample_tokenizer(model_dir: str) -> LoadedTokenizer:
    """A tokenizer from ``samples/models`` (loaded once per test run): every test's one loader."""
    return load_tokenizer(MODELS_DIR / model_dir)


def encode_with(lt: LoadedTokenizer, text: str) -> list[int]:
    ids: list[int] = lt.backend.encode(text, add_special_tokens=False).ids
    return ids


def decode_with(lt: LoadedTokenizer, ids: list[int]) -> str:
    text: str = lt.backend.decode(ids, skip_special_tokens=False)
    return text


def create_parsing(tokenizer: ParserTokenizer, reasoning: str | None, tool: str | None) -> ChatParsing:
    """``ChatParsing.create`` with auto tool choice on exactly when a tool parser is named."""
    made = ChatParsing.create(
        tokenizer, reasoning_parser=reasoning, tool_parser=tool, enable_auto_tool_choice=tool is not None
    )
    assert made is not None
    return made


def splits(ids: list[int]) -> list[list[list[int]]]:
    """Every two-record split plus one record per token."""
    out = [[ids[:k], ids[k:]] for k in range(1, len(ids))]
    out.append([[i] for i in ids])
    return out


def records(
    lt: LoadedTokenizer, chunks: list[list[int]], *, hold_partial_utf8: bool = True
) -> list[tuple[str, list[int]]]:
    """(text, ids) per record; text is the cumulative-decode difference.

    With ``hold_partial_utf8`` a decode ending in U+FFFD yields no text (it
    comes with a later record); without, the replacement character is text.
    """
    out: list[tuple[str, list[int]]] = []
    seen: list[int] = []
    emitted = ""
    for chunk in chunks:
        seen.extend(chunk)
        text = decode_with(lt, seen)
        if hold_partial_utf8:
            new = "" if text.endswith("\ufffd") else text[len(emitted) :]
            if new:
                emitted = text
        else:
            new = text[len(emitted) :]
            emitted = text
        out.append((new, chunk))
    return out


def drive(
    session: ChatStreamSession[Any], recs: Sequence[tuple[str, list[int]]], finish: str = "stop"
) -> tuple[list[DeltaOut | None], str | None]:
    """Step a session through the records (``finish`` on the last); the deltas and the resolved reason."""
    deltas: list[DeltaOut | None] = []
    resolved = None
    for n, (text, ids) in enumerate(recs):
        delta, resolved = session.step(text, ids, finish if n == len(recs) - 1 else None)
        deltas.append(delta)
    return deltas, resolved


@dataclass
class Summary:
    """What a client would assemble from a stream's deltas."""

    reasoning: str | None = None
    content: str | None = None
    names: dict[int, str] = field(default_factory=dict)
    args: dict[int, str] = field(default_factory=dict)
    #: every (index, id) sent, in order
    ids: list[tuple[int, str]] = field(default_factory=list)
    finish: str | None = None

    @property
    def calls(self) -> list[tuple[str, str]]:
        """(name, arguments) per named call, by index."""
        return [(self.names[i], self.args.get(i, "")) for i in sorted(self.names)]


def summarize(
    deltas: Sequence[DeltaOut | None], *, ids_once: bool = False, names_once: bool = False
) -> Summary:
    """Concatenate the deltas.

    ``ids_once``: each call's id is sent once, and every named call has one.
    ``names_once``: every tool-call delta has a function and each name is sent once.
    """
    reasoning, content = "", ""
    out = Summary()
    id_indexes: set[int] = set()
    for delta in deltas:
        if delta is None:
            continue
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for call in delta.tool_calls:
            if names_once:
                assert call.function is not None
            if call.id is not None:
                if ids_once:
                    assert call.index not in id_indexes, "a call id is sent once"
                id_indexes.add(call.index)
                out.ids.append((call.index, call.id))
            if call.function is not None:
                if call.function.name is not None:
                    if names_once:
                        assert call.index not in out.names, "a call's name is sent once"
                    out.names[call.index] = call.function.name
                out.args[call.index] = out.args.get(call.index, "") + (call.function.arguments or "")
    if ids_once:
        assert id_indexes == set(out.names)
    out.reasoning = reasoning or None
    out.content = content or None
    return out


def stream_summary(
    session: ChatStreamSession[Any],
    recs: Sequence[tuple[str, list[int]]],
    finish: str = "stop",
    *,
    ids_once: bool = False,
    names_once: bool = False,
) -> Summary:
    """:func:`drive` then :func:`summarize`, with the resolved finish reason."""
    deltas, resolved = drive(session, recs, finish)
    out = summarize(deltas, ids_once=ids_once, names_once=names_once)
    out.finish = resolved
    return out


# -- one sample tokenizer's driver --------------------------------------------------


@dataclass(frozen=True)
class SampleHarness:
    """Encode, decode, stream and parse one-shot on one sample tokenizer."""

    model_dir: str
    #: the prompt ids every streamed session is opened with
    prompt: tuple[int, ...] = (1,)
    #: records hold a partial UTF-8 character back (else U+FFFD is text), see :func:`records`
    hold_partial_utf8: bool = True

    @property
    def tokenizer(self) -> LoadedTokenizer:
        return sample_tokenizer(self.model_dir)

    def encode(self, text: str) -> list[int]:
        return encode_with(self.tokenizer, text)

    def decode(self, ids: list[int]) -> str:
        return decode_with(self.tokenizer, ids)

    def token_id(self, token: str) -> int:
        """The id of a token that must be in the vocabulary."""
        found = self.tokenizer.backend.token_to_id(token)
        assert found is not None, token
        return found

    def stream(
        self, parsing: ChatParsing, req: ParseRequest, chunks: list[list[int]], finish: str = "stop"
    ) -> Summary:
        """The chunks as records through one session, summed."""
        session = parsing.new_stream(req, list(self.prompt))
        recs = records(self.tokenizer, chunks, hold_partial_utf8=self.hold_partial_utf8)
        return stream_summary(session, recs, finish)

    def oneshot(self, parsing: ChatParsing, req: ParseRequest, text: str) -> ParsedMessage:
        return parsing.parse_full(text, self.encode(text), req, None)


# -- the DeepSeek-V3 harness (deepseek_v31 and tool-call id pin tests) -------------

#: records send U+FFFD as text: vLLM decides from token-id counts
DEEPSEEK_V3 = SampleHarness("deepseek-v3", prompt=(0,), hold_partial_utf8=False)
#: DeepSeek-V3's tool markers, one token each
DEEPSEEK_CALLS_BEGIN, DEEPSEEK_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DEEPSEEK_CALL_BEGIN, DEEPSEEK_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
DEEPSEEK_SEP = "<｜tool▁sep｜>"


# -- stub vocabularies ------------------------------------------------------------


class MistralV11StubTokenizer:
    """A Mistral v11+ vocabulary (no sample tokenizer has one): [TOOL_CALLS] and [ARGS] are special tokens."""

    model_type: str | None = "mistral"
    special_ids = frozenset({1, 2})
    _vocab: ClassVar[dict[str, int]] = {"<s>": 1, "</s>": 2, "[TOOL_CALLS]": 9, "[ARGS]": 32}

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        return {v: k for k, v in self._vocab.items()}.get(token_id)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.id_to_token(i) or "" for i in ids)


# -- the Qwen3 harness -----------------------------------------------------------

PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@cache
def qwen3() -> tuple[LoadedTokenizer, TokenizerAdapter]:
    lt = sample_tokenizer("qwen3")
    return lt, adapter_for(lt)


def qwen3_encode(text: str) -> list[int]:
    return encode_with(qwen3()[0], text)


def qwen3_make(reasoning: str | None, tool: str | None) -> ChatParsing:
    """A Qwen3-tokenizer configuration."""
    return create_parsing(qwen3()[1], reasoning, tool)


def qwen3_stream_deltas(
    parsing: ChatParsing, req: ParseRequest, chunks: list[list[int]], finish: str = "stop"
) -> tuple[list[DeltaOut | None], str | None]:
    return drive(parsing.new_stream(req, qwen3_encode(PROMPT)), records(qwen3()[0], chunks), finish)


def qwen3_stream(
    parsing: ChatParsing,
    req: ParseRequest,
    chunks: list[list[int]],
    finish: str = "stop",
    *,
    ids_once: bool = False,
) -> dict[str, Any]:
    """The summed stream (reasoning, content, (name, arguments) calls, finish reason)."""
    got = stream_summary(
        parsing.new_stream(req, qwen3_encode(PROMPT)), records(qwen3()[0], chunks), finish, ids_once=ids_once
    )
    return {"reasoning": got.reasoning, "content": got.content, "calls": got.calls, "finish": got.finish}


def qwen3_oneshot(parsing: ChatParsing, req: ParseRequest, text: str) -> dict[str, Any]:
    msg = parsing.parse_full(text, qwen3_encode(text), req, qwen3_encode(PROMPT))
    return {
        "reasoning": msg.reasoning,
        "content": msg.content,
        "calls": [(c.name, c.arguments) for c in msg.tool_calls],
    }


# -- the XML tool-format harness (qwen3_coder, qwen3_xml, glm45) ---------------

XML_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "max_failures": {"type": "integer"},
                    "verbose": {"type": "boolean"},
                },
            },
        },
    },
]


def xml_request(
    tools: list[dict[str, Any]] | None = XML_TOOLS,
    choice: str | dict[str, Any] = "auto",
    kwargs: dict[str, Any] | None = None,
) -> ParseRequest:
    return ParseRequest(
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=None,
        include_reasoning=True,
        chat_template_kwargs=kwargs or {},
        messages=[],
    )


def xml_stream(
    parsing: ChatParsing, req: ParseRequest, chunks: list[list[int]], finish: str = "stop"
) -> dict[str, Any]:
    """The summed Qwen3 stream; each call's id must come once."""
    return qwen3_stream(parsing, req, chunks, finish, ids_once=True)


# -- the tool-only harness (one tool, prompt ``[1]``) -----------------------------

WEATHER_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
WEATHER_REQUEST = ParseRequest(tools=WEATHER_TOOLS, tool_choice="auto", parallel_tool_calls=None)


def sample_encode(model_dir: str, text: str) -> list[int]:
    return encode_with(sample_tokenizer(model_dir), text)


def tool_parsing(model_dir: str, name: str) -> ChatParsing:
    return create_parsing(adapter_for(sample_tokenizer(model_dir)), None, name)


def run_stream(model_dir: str, name: str, chunks: list[list[int]], finish: str = "stop") -> dict[str, Any]:
    """Records through a session; the summed output (names must come once per call)."""
    session = tool_parsing(model_dir, name).new_stream(WEATHER_REQUEST, [1])
    got = stream_summary(session, records(sample_tokenizer(model_dir), chunks), finish, names_once=True)
    return {"content": got.content, "calls": got.calls, "finish": got.finish}


def run_oneshot(model_dir: str, name: str, text: str) -> dict[str, Any]:
    message = tool_parsing(model_dir, name).parse_full(
        text, sample_encode(model_dir, text), WEATHER_REQUEST, [1]
    )
    return {"content": message.content, "calls": [(c.name, c.arguments) for c in message.tool_calls]}


def text_cuts(text: str, rng: random.Random) -> list[str]:
    """``text`` as records for the incremental-parser tests: mostly one to three characters,
    sometimes longer or empty."""
    pieces, pos = [], 0
    while pos < len(text):
        size = rng.choice([0, 1, 1, 1, 2, 3, 5, 17]) if rng.random() < 0.97 else rng.randint(20, 200)
        pieces.append(text[pos : pos + size])
        pos += size
    return pieces


def long_cuts(text: str, rng: random.Random) -> list[str]:
    """``text`` as records of 1 to 200 characters: a record may close one token and open the next
    (the 1-3 character records of :func:`text_cuts` rarely do; bugs hid there)."""
    pieces, pos = [], 0
    while pos < len(text):
        size = rng.choice([1, 2, 5, 10, 20, 40, 80, 200])
        pieces.append(text[pos : pos + size])
        pos += size
    return pieces


def delta_without_ids(delta: Any) -> Any:
    """A parser delta as plain data, with the random tool-call ids left out."""
    if delta is None:
        return None
    out = dataclasses.asdict(delta)
    for call in out["tool_calls"]:
        call["id"] = None
    return out


def matches_whole_reread(
    make: Callable[[bool], P],
    step: Callable[[P, str], Any],
    remainder: Callable[[P], str],
    pieces: list[str],
    *,
    before: Callable[[P, str], bool] | None = None,
    after: Callable[[P, str], bool] | None = None,
) -> int:
    """Feed ``pieces`` to an incremental reader and to its whole re-read (``make(False)``, the
    reference) and require every record's delta (ids aside) and the remainder to be equal; the
    records of the incremental run that ``before`` (ahead of the step) or ``after`` counted."""

    def run(incremental: bool) -> tuple[list[Any], str, int]:
        reader = make(incremental)
        out: list[Any] = []
        counted = 0
        for piece in pieces:
            counted += before is not None and before(reader, piece)
            out.append(delta_without_ids(step(reader, piece)))
            counted += after is not None and after(reader, piece)
        return out, remainder(reader), counted

    got, want = run(True), run(False)
    assert want[2] == 0
    assert got[:2] == want[:2], "".join(pieces)
    return got[2]


def pythonic_stream(marker: str | None) -> Callable[[bool], PythonicStream]:
    def make(incremental: bool) -> PythonicStream:
        stream = PythonicStream(marker)
        stream.incremental = incremental
        return stream

    return make


#: What the llama3_json incremental tests parse with: no tools, auto tool choice.
LLAMA3_JSON_REQUEST = ParseRequest(tools=None, tool_choice="auto", parallel_tool_calls=None)


def llama3_json_parser(tokenizer: Any, incremental: bool = True) -> Llama3JsonToolParser:
    parser = Llama3JsonToolParser(tokenizer, None, {})
    parser.incremental = incremental
    return parser


def llama3_json_matches_whole_reread(
    tokenizer: Any,
    pieces: list[str],
    *,
    before: Callable[[Llama3JsonToolParser, str], bool] | None = None,
    after: Callable[[Llama3JsonToolParser, str], bool] | None = None,
) -> int:
    """``matches_whole_reread`` for ``llama3_json`` (``LLAMA3_JSON_REQUEST``)."""
    return matches_whole_reread(
        lambda incremental: llama3_json_parser(tokenizer, incremental),
        lambda parser, piece: parser.stream(piece, [0], LLAMA3_JSON_REQUEST),
        Llama3JsonToolParser.remaining_unstreamed_args,
        pieces,
        before=before,
        after=after,
    )


def llama3_json_incremental_matches(tokenizer: Any, pieces: list[str]) -> int:
    """``llama3_json_matches_whole_reread``; the count is of the records that ran while the
    incremental reader held the call."""
    return llama3_json_matches_whole_reread(
        tokenizer, pieces, before=lambda parser, _piece: parser._reader is not None
    )


def llama3_json_cuts_match(tokenizer: Any, corpus: Sequence[str], seed: int, rounds: int = 60) -> None:
    """Random texts of ``corpus`` (some cut short) in random records, each equal to the whole re-read."""
    rng = random.Random(seed)
    for _ in range(rounds):
        text = rng.choice(corpus)
        if rng.random() < 0.3:
            text = text[: rng.randrange(1, len(text) + 1)]
        llama3_json_incremental_matches(tokenizer, text_cuts(text, rng))
        llama3_json_incremental_matches(tokenizer, long_cuts(text, rng))


def llama3_json_reads_per_record(tokenizer: Any, text: str, reads: list[int]) -> list[int]:
    """Whole reads per one-character record (``reads``: the ``partial_json_reads`` spy). The spy
    must see the reads a call does make, or "none after" says nothing."""
    parser = llama3_json_parser(tokenizer)
    out = []
    for char in text:
        reads.clear()
        parser.stream(char, [0], LLAMA3_JSON_REQUEST)
        out.append(sum(reads))
    assert any(out), "no read reached the partial_json_reads spy"
    return out
