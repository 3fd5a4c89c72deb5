"""glm45 and qwen3_coder stream arguments in one pass: same deltas as vLLM's rebuild, O(delta) work.

The reference is vLLM's own algorithm, kept here: the arguments JSON rebuilt from
the whole raw text with the format's regular expressions whenever a record is more
than a plain continuation of the open value (which the format's value extender
streams directly). Random argument markup (well-formed, malformed, whitespace in tags,
repeated names, typed values) must give identical deltas; the work per record is
checked by counting the characters the argument scanner is handed.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.parsing_helpers import qwen3, qwen3_encode, records
from worker.core.parsing import ParseRequest
from worker.core.parsing.engine.arguments import NAME_IN_ARGS_RE, WS, NameProbe, ScannerFactory
from worker.core.parsing.engine.config import EngineConfig
from worker.core.parsing.engine.schema import fix_arg_types
from worker.core.parsing.engine.tools import CallSlot, EngineToolParser
from worker.core.parsing.families import glm45
from worker.core.parsing.families import qwen3 as qwen3_coder
from worker.core.parsing.families.glm45 import Glm47MoeToolParser
from worker.core.parsing.families.qwen3 import Qwen3EngineToolParser
from worker.core.parsing.types import DeltaOut, ParserTokenizer

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {
                    "content": {"type": "string"},
                    "n": {"type": "integer"},
                    "opts": {"type": "object"},
                    "flag": {"type": "boolean"},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "untyped", "parameters": {"type": "object"}}},
]
GLM_PIECES = ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "content", "n", "opts", "flag"]
GLM_PIECES += [" ", "\n", "x", "12", "<", ">", "/", '"', "\\", "é", '{"a": 1}', "true", "\t"]
QWEN_PIECES = ["<parameter=", "</parameter>", "< parameter =", "< / parameter >", "<parameter", "=", ">"]
QWEN_PIECES += ["content", "n", "opts", "flag", "\n", " ", "x", "12", "<", "/", '"', "{", "}", "é", "true"]


def _with_scanner(parser_class: type[EngineToolParser], scanner: ScannerFactory) -> type[EngineToolParser]:
    """The parser with another argument scanner."""

    class Replaced(parser_class):  # type: ignore[misc, valid-type]  # mypy takes no variable base class
        @classmethod
        def make_config(
            cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]
        ) -> EngineConfig:
            config = parser_class.make_config(tokenizer, chat_template_kwargs)
            assert config.arguments is not None
            return dataclasses.replace(
                config, arguments=dataclasses.replace(config.arguments, scanner=scanner)
            )

    return Replaced


# -- vLLM's rebuild (vllm/parser/engine/parser_engine.py _compute_arg_delta) ----------

#: Maps a raw argument delta to the JSON text it appends to the open value, or
#: None once the delta may change anything else.
Extender = Callable[[str], "str | None"]
_ARG_VALUE_END = "</arg_value>"
# What ends an open value: its closing tag or the next opener.
_VALUE_END_RE = re.compile(rf"<{WS}*/{WS}*parameter{WS}*>|<{WS}*parameter{WS}*=")
_WS_CHAR = re.compile(WS)


def _glm_extender(raw: str) -> Extender | None:
    """Stream the open trailing value verbatim until ``</arg_value>`` shows up."""
    params, open_key = glm45._parse_args(raw, partial=True)
    if open_key is None or next(reversed(params)) != open_key:
        return None
    keep = len(_ARG_VALUE_END) - 1
    tail = raw[-keep:]

    def extend(delta: str) -> str | None:
        nonlocal tail
        text = tail + delta
        if _ARG_VALUE_END in text:
            return None
        tail = text[-keep:]
        return json.dumps(delta, ensure_ascii=False)[1:-1]

    return extend


def _could_end_value(tail: str) -> bool:
    """Is ``tail`` (starting with ``<``) a prefix of a value end (``</parameter>`` / ``<parameter=``)?"""
    n = len(tail)
    i = 1

    def spaces(i: int) -> int:
        while i < n and _WS_CHAR.match(tail[i]):
            i += 1
        return i

    i = spaces(i)
    if i == n:
        return True
    closing = tail[i] == "/"
    if closing:
        i = spaces(i + 1)
    for ch in "parameter":
        if i == n:
            return True
        if tail[i] != ch:
            return False
        i += 1
    i = spaces(i)
    if i == n:
        return True
    return i == n - 1 and tail[i] == (">" if closing else "=")


def _end_window(text: str) -> str:
    """The suffix of ``text`` that may still grow into a value end."""
    start = text.rfind("<")
    if start < 0:
        return ""
    tail = text[start:]
    return tail if _could_end_value(tail) else ""


def _qwen3_extender(raw: str) -> Extender | None:
    """Stream the open trailing ``<parameter=...>`` value as JSON string text.

    Mirrors ``convert_args``: the value's first newline is dropped and a
    trailing newline is held back until more text follows it.
    """
    match = qwen3_coder._OPEN_PARAM_RE.search(qwen3_coder._PARAM_RE.sub("", raw))
    if match is None:
        return None
    name, value = match.group(1), match.group(2)
    # A key seen before keeps its first position in the JSON: not the last value.
    if any(m.group(1) == name for m in qwen3_coder._PARAM_RE.finditer(raw)):
        return None
    window = _end_window(value)
    started = bool(value)
    held = "\n" if value.endswith("\n") and value != "\n" else ""

    def extend(delta: str) -> str | None:
        nonlocal window, started, held
        text = window + delta
        if _VALUE_END_RE.search(text):
            return None
        window = _end_window(text)
        text = held + delta
        if not started and text:
            started = True
            text = text.removeprefix("\n")
        held = "\n" if text.endswith("\n") else ""
        text = text[: len(text) - len(held)]
        return json.dumps(text, ensure_ascii=False)[1:-1]

    return extend


def safe_arg_prefix(text: str, string_keys: set[str] | None) -> tuple[str, bool]:
    """The JSON prefix that cannot change any more, and whether it ends inside an open string.

    Everything up to the last top-level value is stable; that value itself is
    left out unless it is a string of a key that stays a string, whose
    unterminated text may stream.
    """
    last_colon = -1
    last_key: str | None = None
    pending: str | None = None
    in_string = escape = False
    start = -1
    depth = 0
    for i, ch in enumerate(text):
        if escape:
            escape = False
            continue
        if in_string:
            if ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
                if depth == 1 and start >= 0:
                    pending = text[start + 1 : i]
            continue
        if ch == '"':
            in_string = True
            start = i
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == ":" and depth == 1:
            last_colon = i
            last_key = pending
            pending = None
    if last_colon < 0:
        return "", False
    end = last_colon + 1
    while end < len(text) and text[end] in " \t\n\r":
        end += 1
    if end >= len(text) or text[end] != '"':
        return text[:end], False
    if string_keys is not None and last_key not in string_keys:
        return text[:end], False
    escape = False
    for i in range(end + 1, len(text)):
        ch = text[i]
        if escape:
            escape = False
        elif ch == "\\":
            escape = True
        elif ch == '"':
            return text[:i], True
    return text, True


@dataclasses.dataclass
class _Rebuilt:
    streamed: str = ""
    extend: Extender | None = None
    value_streams: bool = False


def _rebuild_reference(
    parser_class: type[EngineToolParser], extender: Callable[[str], Extender | None]
) -> type[EngineToolParser]:
    """The parser streaming arguments as vLLM does: keep the raw text, rebuild the JSON."""

    class Rebuild(parser_class):  # type: ignore[misc, valid-type]  # mypy takes no variable base class
        def _new_slot(self) -> CallSlot:
            return CallSlot(None)  # raw text kept, as one-shot keeps it

        def _rebuilt(self, slot: CallSlot) -> _Rebuilt:
            states: dict[int, _Rebuilt] = self.__dict__.setdefault("_rebuilt_states", {})
            return states.setdefault(id(slot), _Rebuilt())

        def _arg_delta(self, slot: CallSlot, raw_delta: str) -> str | None:
            state = self._rebuilt(slot)
            if state.extend is not None:
                # Fast path: the delta only lengthens the open trailing value.
                diff = state.extend(raw_delta)
                if diff is not None:
                    if not diff or not state.value_streams:
                        return None
                    state.streamed += diff
                    return diff
                state.extend = None
            try:
                current = self.config.arguments.convert(slot.args, True)
            except (ValueError, TypeError):
                return None
            if not current:
                return None
            if slot.name:
                current = fix_arg_types(current, self.tools, slot.name)
            previous = state.streamed
            safe, value_streams = safe_arg_prefix(current, slot.string_keys)
            if not safe or (previous and not safe.startswith(previous)):
                return None
            state.streamed = safe
            state.extend = extender(slot.args)
            state.value_streams = value_streams
            return safe[len(previous) :] or None

        def _final_args_diff(self, slot: CallSlot) -> str | None:
            state = self._rebuilt(slot)
            try:
                final: str = self.config.arguments.convert(slot.args, False)
            except (ValueError, TypeError):
                return None
            if final:
                final = fix_arg_types(final, self.tools, slot.name)
            previous = state.streamed
            if final and len(final) > len(previous):
                if previous and not final.startswith(previous):
                    return None
                state.streamed = final
                return final[len(previous) :]
            return None

    return Rebuild


def _run(parser_class: type[EngineToolParser], text: str, cuts: list[int], finish: bool) -> list[Any]:
    loaded, adapter = qwen3()
    request = ParseRequest(tools=TOOLS, tool_choice="auto", parallel_tool_calls=None)
    parser = parser_class(adapter, TOOLS, {"enable_thinking": False})
    ids = qwen3_encode(text)
    chunks = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True) if ids[a:b]]
    out: list[Any] = []
    for piece, chunk in records(loaded, chunks):
        out.append(_plain(parser.stream(piece, chunk, request)))
    if finish:
        out.append(_plain(parser.finish_stream()))
    return out


def _plain(delta: DeltaOut | None) -> Any:
    """A delta without the random call ids (whether an id is sent is kept)."""
    if delta is None:
        return None
    calls = [
        (
            c.index,
            c.id is not None,
            c.function.name if c.function else None,
            c.function and c.function.arguments,
        )
        for c in delta.tool_calls
    ]
    return (delta.content, delta.reasoning, calls)


def _texts(pieces: list[str], head: str, tail: str, rng: random.Random) -> str:
    """A call whose arguments are mostly well formed, with random pieces dropped, doubled or inserted."""
    glm = "<arg_key>" in pieces
    parts: list[str] = []
    for _ in range(rng.randint(0, 5)):
        key = rng.choice(["content", "n", "opts", "flag", "content", " n ", ""])
        value = "".join(rng.choice(pieces[4:]) for _ in range(rng.randint(0, 6)))
        if glm:
            parts += [
                "<arg_key>",
                key,
                "</arg_key>",
                rng.choice(["", "\n", " "]),
                "<arg_value>",
                value,
                "</arg_value>",
            ]
        else:
            parts += [
                "<parameter=",
                key,
                ">",
                rng.choice(["", "\n"]),
                value,
                rng.choice(["\n", ""]),
                "</parameter>",
            ]
        parts.append(rng.choice(["", "\n"]))
    for _ in range(rng.randint(0, 3)):
        at = rng.randint(0, len(parts))
        action = rng.random()
        if action < 0.3 and at < len(parts):
            del parts[at]
        elif action < 0.6 and at < len(parts):
            parts.insert(at, parts[at])
        else:
            parts.insert(at, rng.choice(pieces))
    name = rng.choice(["write_file", "untyped", "write_file", ""])
    return head.format(name) + "".join(parts) + (tail if rng.random() < 0.8 else "")


@pytest.mark.parametrize(
    ("parser_class", "extender", "pieces", "head", "tail"),
    [
        (Glm47MoeToolParser, _glm_extender, GLM_PIECES, "<tool_call>{}\n", "</tool_call>"),
        (
            Qwen3EngineToolParser,
            _qwen3_extender,
            QWEN_PIECES,
            "<tool_call>\n<function={}>\n",
            "</function>\n</tool_call>",
        ),
    ],
    ids=["glm45", "qwen3_coder"],
)
def test_one_pass_arguments_equal_the_rebuild(
    parser_class: type[EngineToolParser],
    extender: Callable[[str], Extender | None],
    pieces: list[str],
    head: str,
    tail: str,
) -> None:
    rng = random.Random(20)
    reference = _rebuild_reference(parser_class, extender)
    for _ in range(250):
        text = _texts(pieces, head, tail, rng)
        if rng.random() < 0.2:
            # Two well-formed arguments around the random ones.
            text = text.replace(
                head.format("write_file"), head.format("write_file") + _well_formed(parser_class)
            )
        size = len(qwen3_encode(text))
        cuts = sorted(rng.sample(range(1, size), min(size - 1, rng.randint(0, size)))) if size > 1 else []
        finish = rng.random() < 0.7
        assert _run(parser_class, text, cuts, finish) == _run(reference, text, cuts, finish), (text, cuts)


def _well_formed(parser_class: type[EngineToolParser]) -> str:
    if parser_class is Glm47MoeToolParser:
        return (
            "<arg_key>content</arg_key>\n<arg_value>hello\nworld</arg_value>\n"
            "<arg_key>n</arg_key><arg_value>3</arg_value>\n"
        )
    return "<parameter=content>\nhello\nworld\n</parameter>\n<parameter=n>\n3\n</parameter>\n"


class _Counting:
    """Wraps a scanner factory: how many characters each record hands the scanner."""

    def __init__(self, factory: Any) -> None:
        self.factory = factory
        self.fed = 0

    def __call__(self) -> Any:
        scanner = self.factory()
        inner = scanner.feed

        def feed(text: str) -> list[tuple[str, ...]]:
            self.fed += len(text)
            events: list[tuple[str, ...]] = inner(text)
            return events

        scanner.feed = feed
        return scanner


@pytest.mark.parametrize(
    ("parser_class", "scanner", "unit"),
    [
        (Glm47MoeToolParser, glm45.GlmArgScanner, "<arg_key>n</arg_key><arg_value>1</arg_value>\n"),
        (Glm47MoeToolParser, glm45.GlmArgScanner, "<arg_key>a key that never closes "),
        (Qwen3EngineToolParser, qwen3_coder.QwenArgScanner, "<parameter=n>\n1\n</parameter>\n"),
        (Qwen3EngineToolParser, qwen3_coder.QwenArgScanner, "<parameter=content>\nlong value text "),
    ],
)
def test_each_record_scans_only_its_own_text(
    parser_class: type[EngineToolParser], scanner: Any, unit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1-token records over a long call: every record hands the scanner its own text and no more."""
    counting = _Counting(scanner)
    counted = _with_scanner(parser_class, counting)

    head = (
        "<tool_call>write_file\n"
        if parser_class is Glm47MoeToolParser
        else "<tool_call>\n<function=write_file>\n"
    )
    text = head + unit * 150
    loaded, adapter = qwen3()
    request = ParseRequest(tools=TOOLS, tool_choice="auto", parallel_tool_calls=None)
    parser = counted(adapter, TOOLS, {"enable_thinking": False})
    ids = qwen3_encode(text)
    total = 0
    for piece, chunk in records(loaded, [[i] for i in ids]):
        before = counting.fed
        parser.stream(piece, chunk, request)
        fed = counting.fed - before
        # The lexer may release a held-back marker prefix with the next record.
        assert fed <= len(piece) + len("</parameter>"), (piece, fed)
        total += fed
    assert total <= len(text)


@pytest.mark.parametrize("pattern", [NAME_IN_ARGS_RE, re.compile(r'"name"\s*:\s*"([^"]*)"')])
def test_name_probe_finds_what_a_full_search_finds(pattern: re.Pattern[str]) -> None:
    """A nameless call's name, searched as the text arrives: the full search's answer at every step."""
    rng = random.Random(5)
    alphabet = ['"', "name", ":", " ", "\n", "x", '"name"', '": "', "\x1c", "\\"]
    for _ in range(2000):
        probe = NameProbe(pattern)
        text = ""
        for _ in range(rng.randint(1, 30)):
            piece = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            text += piece
            probe.feed(piece)
            match = pattern.search(text)
            assert probe.done == (match is not None), text
            assert probe.name == (match.group(1) or None if match else None), text
