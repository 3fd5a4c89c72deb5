"""glm45 and qwen3_coder stream arguments in one pass: same deltas as vLLM's rebuild, O(delta) work.

The reference is vLLM's own algorithm, kept in the engine for grammars without a
scanner: the arguments JSON rebuilt from the whole raw text with the format's
regular expressions whenever a record is more than a plain continuation of the
open value. Random argument markup (well-formed, malformed, whitespace in tags,
repeated names, typed values) must give identical deltas; the work per record is
checked by counting the characters the argument scanner is handed.
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any

import pytest

from tests.parsing_helpers import qwen3, qwen3_encode, records
from worker.core.parsing import ParseRequest
from worker.core.parsing.tools import _xml_args
from worker.core.parsing.tools._xml_args import NAME_IN_ARGS_RE
from worker.core.parsing.tools._xml_engine import EngineToolParser, ToolGrammar
from worker.core.parsing.tools.glm45 import Glm47MoeToolParser
from worker.core.parsing.tools.qwen3_coder import Qwen3EngineToolParser
from worker.core.parsing.types import DeltaOut, ParserTokenizer
from worker.core.parsing.util import NameProbe

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


def _reference(parser_class: type[EngineToolParser]) -> type[EngineToolParser]:
    class Reference(parser_class):  # type: ignore[misc, valid-type]  # mypy takes no variable base class
        @classmethod
        def make_grammar(
            cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]
        ) -> ToolGrammar:
            grammar = parser_class.make_grammar(tokenizer, chat_template_kwargs)
            return dataclasses.replace(grammar, arg_scanner=None)

    return Reference


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
    ("parser_class", "pieces", "head", "tail"),
    [
        (Glm47MoeToolParser, GLM_PIECES, "<tool_call>{}\n", "</tool_call>"),
        (Qwen3EngineToolParser, QWEN_PIECES, "<tool_call>\n<function={}>\n", "</function>\n</tool_call>"),
    ],
    ids=["glm45", "qwen3_coder"],
)
def test_one_pass_arguments_equal_the_rebuild(
    parser_class: type[EngineToolParser], pieces: list[str], head: str, tail: str
) -> None:
    rng = random.Random(20)
    reference = _reference(parser_class)
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
        (Glm47MoeToolParser, _xml_args.GlmArgScanner, "<arg_key>n</arg_key><arg_value>1</arg_value>\n"),
        (Glm47MoeToolParser, _xml_args.GlmArgScanner, "<arg_key>a key that never closes "),
        (Qwen3EngineToolParser, _xml_args.QwenArgScanner, "<parameter=n>\n1\n</parameter>\n"),
        (Qwen3EngineToolParser, _xml_args.QwenArgScanner, "<parameter=content>\nlong value text "),
    ],
)
def test_each_record_scans_only_its_own_text(
    parser_class: type[EngineToolParser], scanner: Any, unit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1-token records over a long call: every record hands the scanner its own text and no more."""
    counting = _Counting(scanner)

    class Counted(parser_class):  # type: ignore[misc, valid-type]  # mypy takes no variable base class
        @classmethod
        def make_grammar(
            cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]
        ) -> ToolGrammar:
            return dataclasses.replace(
                parser_class.make_grammar(tokenizer, chat_template_kwargs), arg_scanner=counting
            )

    head = (
        "<tool_call>write_file\n"
        if parser_class is Glm47MoeToolParser
        else "<tool_call>\n<function=write_file>\n"
    )
    text = head + unit * 150
    loaded, adapter = qwen3()
    request = ParseRequest(tools=TOOLS, tool_choice="auto", parallel_tool_calls=None)
    parser = Counted(adapter, TOOLS, {"enable_thinking": False})
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
