"""gpt-oss (Harmony): vLLM's ``HarmonyParser`` with its ``openai_gptoss`` reasoning and ``openai`` tool names.

gpt-oss writes OpenAI's Harmony format::

    <|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>commentary
     to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

vLLM parses it by token id with the ``openai_harmony`` library (PyPI ``oss-harmony``, the fork vLLM
0.33.0 pins), and so does this module: the library's ``StreamableParser`` does the format; this module
does what vLLM does with its messages (``vllm/parser/harmony.py``): the ``analysis`` channel is
reasoning, ``final`` and a ``commentary`` without recipient are content, a ``functions.NAME``
recipient is a tool call. vLLM switches Harmony on by ``config.json``'s ``model_type: gpt_oss``, and
defaults the reasoning parser to ``openai_gptoss`` there (:func:`harmony_names`); its two parser
classes are stubs that only say which parts are on (here too: :class:`GptOssReasoning`,
:class:`GptOssTools`).

Costs: vLLM polls the library's whole message list after every token, which grows with the output.
Here one live :class:`_Session` per choice feeds ids as they come; a message's end is seen from the
library's ``current_role`` (set while a message body is open, unset once it ends) and the library is
then started afresh, so it holds one message at a time and a record costs O(its ids).

The vocabulary: Harmony tokenizes with OpenAI's ``o200k_base.tiktoken``. It is rebuilt from the served
tokenizer's own BPE vocabulary and checked against OpenAI's sha256 (:func:`_o200k_vocabulary`), so a
model whose vocabulary is not Harmony's is refused at startup and nothing is fetched at run time.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Final, NamedTuple

from openai_harmony import HarmonyEncoding, HarmonyError, Role, StreamableParser, load_harmony_encoding

from worker.core.parsing.base import ReasoningParser, ToolParser
from worker.core.parsing.harmony_switch import (
    REASONING_NAME,
    TOOL_NAME,
    serves,
)
from worker.core.parsing.ids import random_tool_call_id
from worker.core.parsing.types import (
    DeltaOut,
    ExtractedCalls,
    FunctionDeltaOut,
    ParseRequest,
    ParserTokenizer,
    ToolCallDeltaOut,
    ToolCallOut,
)
from worker.errors import ParserSetupError

#: OpenAI's published digest of ``o200k_base.tiktoken``, which the library checks too.
O200K_SHA256: Final = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
O200K_RANKS: Final = 199_998
_ENCODINGS_BASE_VAR: Final = "TIKTOKEN_ENCODINGS_BASE"

# Recipients of the built-in tools: not function calls (vLLM's ``BUILTIN_TOOL_TO_MCP_SERVER_LABEL``).
_BUILTIN_RECIPIENTS: Final = frozenset({"python", "browser", "container"})
_CONSTRAIN: Final = "<|constrain|>"


# --- the vocabulary ---------------------------------------------------------------------------


def _unicode_to_byte() -> dict[int, int]:
    """The inverse of GPT-2's byte-to-unicode table (byte-level BPE spells each byte as a printable
    character)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = 256 + shifted
            shifted += 1
    return {char: b for b, char in table.items()}


def _o200k_vocabulary(tokenizer: ParserTokenizer) -> bytes:
    """``o200k_base.tiktoken`` rebuilt from the tokenizer's BPE entries (ids 0..199,997), one
    ``base64(token bytes) rank`` line each; ``ParserSetupError`` unless it is OpenAI's file."""
    by_id: list[str | None] = [None] * O200K_RANKS
    for text, token_id in tokenizer.get_vocab().items():
        if 0 <= token_id < O200K_RANKS:
            by_id[token_id] = text
    table = _unicode_to_byte()
    lines = []
    for rank, token in enumerate(by_id):
        if token is None or any(ord(c) not in table for c in token):
            raise ParserSetupError(
                f"the vocabulary is not Harmony's o200k: id {rank} is not a byte-level token"
            )
        raw = token.translate(table).encode("latin-1")
        lines.append(base64.b64encode(raw) + b" %d\n" % rank)
    data = b"".join(lines)
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        raise ParserSetupError("the vocabulary is not Harmony's o200k (its sha256 differs from OpenAI's)")
    return data


_encoding_lock = threading.Lock()
_encoding: HarmonyEncoding | None = None
_checked: weakref.WeakSet[Any] = weakref.WeakSet()


def harmony_encoding(tokenizer: ParserTokenizer) -> HarmonyEncoding:
    """The library's gpt-oss encoding, once per process, loaded from the vocabulary rebuilt from
    ``tokenizer`` (checked once per tokenizer).

    The file is written to a fresh private directory (``mkdtemp``: mode 0700, this process's own),
    the library is pointed at it only while it loads (it reads ``$TIKTOKEN_ENCODINGS_BASE`` and
    checks the sha256 itself), and the directory is removed: the encoding lives in memory.
    """
    global _encoding
    with _encoding_lock:
        if tokenizer in _checked and _encoding is not None:
            return _encoding
        data = _o200k_vocabulary(tokenizer)
        if _encoding is None:
            with tempfile.TemporaryDirectory(prefix="derender-harmony-") as folder:
                (Path(folder) / "o200k_base.tiktoken").write_bytes(data)
                previous = os.environ.get(_ENCODINGS_BASE_VAR)
                os.environ[_ENCODINGS_BASE_VAR] = folder
                try:
                    _encoding = load_harmony_encoding("HarmonyGptOss")
                except HarmonyError as exc:
                    raise ParserSetupError(f"the Harmony library cannot load the vocabulary: {exc}") from exc
                finally:
                    if previous is None:
                        del os.environ[_ENCODINGS_BASE_VAR]
                    else:
                        os.environ[_ENCODINGS_BASE_VAR] = previous
        _checked.add(tokenizer)
        return _encoding


# --- the registered names: capability declarations, as vLLM's stub classes ---------------------


def _require_harmony(tokenizer: ParserTokenizer, name: str) -> None:
    if not serves(tokenizer):
        # vLLM composes these stubs into its generic parser there, whose every parse raises
        # NotImplementedError; refusing at startup says why instead.
        raise ParserSetupError(
            f"{name} parses gpt-oss (Harmony) output only: config.json must say model_type gpt_oss"
        )
    harmony_encoding(tokenizer)


_STUB = "Harmony parses by token id in HarmonyChoiceParser; this class only says the part is on"


class GptOssReasoning(ReasoningParser):
    """``openai_gptoss``: Harmony's reasoning (the ``analysis`` channel) is on."""

    def __init__(self, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> None:
        super().__init__(tokenizer, chat_template_kwargs)
        _require_harmony(tokenizer, f"reasoning parser {REASONING_NAME}")

    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        return True

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        raise NotImplementedError(_STUB)

    def stream(self, delta_text: str, delta_ids: Sequence[int]) -> DeltaOut | None:
        raise NotImplementedError(_STUB)

    def ended_in_stream(self, delta_ids: Sequence[int]) -> bool:
        return True

    def content_ids(self, delta_ids: list[int]) -> list[int]:
        raise NotImplementedError(_STUB)


class GptOssTools(ToolParser):
    """``openai``: Harmony's tool calls (``functions.NAME`` recipients) are on."""

    # vLLM's class has a structural tag ("harmony"): required and named choices parse natively.
    supports_required_and_named = False

    def setup(self) -> None:
        _require_harmony(self.tokenizer, f"tool parser {TOOL_NAME}")

    def extract_tool_calls(self, text: str, request: ParseRequest) -> ExtractedCalls:
        raise NotImplementedError(_STUB)

    def stream(self, delta_text: str, delta_ids: Sequence[int], request: ParseRequest) -> DeltaOut | None:
        raise NotImplementedError(_STUB)


# --- the parser -------------------------------------------------------------------------------


class _Kind(Enum):
    TOOL = "tool"
    REASONING = "reasoning"
    CONTENT = "content"
    IGNORE = "ignore"


def _is_function_recipient(recipient: str) -> bool:
    """vLLM's ``is_function_recipient`` as chat completions call it (no allow-list)."""
    if not recipient or recipient.startswith("<|") or recipient == "assistant":
        return False
    if recipient.startswith("functions."):
        return len(recipient) > len("functions.")
    return recipient.split(".", 1)[0] not in _BUILTIN_RECIPIENTS


def _kind(channel: str | None, recipient: str | None) -> _Kind:
    if recipient and _is_function_recipient(recipient):
        return _Kind.TOOL
    if channel == "analysis":
        return _Kind.REASONING
    if channel == "final" or (channel == "commentary" and recipient is None):
        return _Kind.CONTENT
    return _Kind.IGNORE


def _normalize_recipient(recipient: str | None) -> str | None:
    """Drop a constrained format read into the recipient (vLLM's ``_normalize_recipient``)."""
    if recipient is None:
        return None
    cut = recipient.find(_CONSTRAIN)
    if cut == -1:
        return recipient
    return recipient[:cut].rstrip() or None


@dataclass(frozen=True, slots=True)
class _Message:
    """A finished Harmony message (the fields vLLM reads of the library's ``Message``)."""

    role: str
    channel: str | None
    recipient: str | None
    content_type: str | None
    text: str | None  # the first content part's text; None without content


class _Segment(NamedTuple):
    channel: str | None
    recipient: str | None
    delta: str
    completed: _Message | None = None


class _Session:
    """The library's streaming parser kept alive for one choice (vLLM's ``process_chunk``/``flush``).

    vLLM keeps one library parser for the whole output and reads its growing message list after each
    token; this one starts the library afresh after each finished message (which leaves it exactly as
    the finished state: expecting ``<|start|>``, no role), so it holds one message and reads it once.
    """

    def __init__(self, encoding: HarmonyEncoding, tokenizer: ParserTokenizer) -> None:
        self._encoding = encoding
        self._tokenizer = tokenizer
        self._start()
        # The ids of the message in progress: what a cut inside a header returns as text.
        self._message_ids: list[int] = []

    def _start(self, role: Role | None = Role.ASSISTANT) -> None:
        self._parser = StreamableParser(self._encoding, role)
        # Set while a message body is open; unset by the token that ends it (the library's
        # ``current_role``: only an ended message takes it from set to unset).
        self._role: Role | None = self._parser.current_role

    @property
    def current_recipient(self) -> str | None:
        return _normalize_recipient(self._parser.current_recipient)

    def _ended(self) -> _Message | None:
        """After a token: the message it ended, if any (the library then starts afresh)."""
        role = self._parser.current_role
        was, self._role = self._role, role
        if was is None or role is not None:
            return None
        # The library was started afresh after the previous message: this is its only one.
        message = self._parser.messages[-1]
        self._start(None)
        first = message.content[0] if message.content else None
        return _Message(
            role=str(message.author.role.value),
            channel=message.channel,
            recipient=_normalize_recipient(message.recipient),
            content_type=message.content_type,
            text=getattr(first, "text", "") if first is not None else None,
        )

    def process(self, token_ids: Sequence[int]) -> list[_Segment]:
        segments = []
        parser = self._parser
        for token_id in token_ids:
            try:
                parser.process(token_id)
            except HarmonyError:
                self._role = parser.current_role
                continue  # vLLM skips the token
            channel = parser.current_channel
            recipient = _normalize_recipient(parser.current_recipient)
            delta = parser.last_content_delta or ""
            completed = self._ended()
            if completed is not None:
                self._message_ids.clear()
                parser = self._parser
            else:
                self._message_ids.append(token_id)
            segments.append(_Segment(channel, recipient, delta, completed))
        return segments

    def flush(self) -> list[_Segment]:
        """The end of the output: the message in progress ends (vLLM's ``flush``)."""
        segments = []
        message: _Message | None
        try:
            self._parser.process_eos()
            message = self._ended()
        except HarmonyError:
            # A cut inside a header: vLLM returns the unfinished message's raw text as final content.
            text = self._tokenizer.decode(list(self._message_ids))
            segments.append(_Segment("final", None, text))
            message = _Message("assistant", "final", None, None, text)
        self._start()
        self._message_ids.clear()
        if message is not None:
            segments.append(_Segment(message.channel, message.recipient, "", message))
        return segments


class HarmonyChoiceParser:
    """One choice's Harmony parsing: one-shot (:meth:`parse`) or streamed (:meth:`parse_delta`)."""

    def __init__(
        self, tokenizer: ParserTokenizer, request: ParseRequest, *, reasoning: bool, tools: bool
    ) -> None:
        self._request = request
        self._reasoning = reasoning
        self._tools = tools
        self._session = _Session(harmony_encoding(tokenizer), tokenizer)
        self._next_call_index = 0

    def parse(self, token_ids: Sequence[int]) -> tuple[str | None, str | None, list[ToolCallOut] | None]:
        """The whole output: reasoning and content parts joined with ``"\\n"``, every call (the
        caller applies ``tool_choice``)."""
        segments = self._session.process(token_ids) + self._session.flush()
        reasoning_parts: list[str] = []
        content_parts: list[str] = []
        calls: list[ToolCallOut] = []
        for segment in segments:
            message = segment.completed
            if message is None or message.role != "assistant" or message.text is None:
                continue
            text = message.text
            kind = _kind(message.channel, message.recipient)
            if kind is _Kind.REASONING and self._reasoning and text:
                reasoning_parts.append(text)
            elif kind is _Kind.CONTENT and text:
                content_parts.append(text)
            elif kind is _Kind.TOOL and self._tools:
                assert message.recipient is not None
                name = message.recipient.removeprefix("functions.")
                calls.append(ToolCallOut(id="", name=name, arguments=_arguments(text, message.content_type)))
        return "\n".join(reasoning_parts) or None, "\n".join(content_parts) or None, calls or None

    def parse_delta(
        self, delta_text: str, delta_ids: list[int], prompt_token_ids: list[int] | None, finished: bool
    ) -> DeltaOut | None:
        """One record, by its ids (``delta_text`` is not read: Harmony parses ids)."""
        session = self._session
        previous = session.current_recipient
        segments = session.process(delta_ids)
        if finished:
            segments += session.flush()
        content = ""
        reasoning = ""
        calls: list[ToolCallDeltaOut] = []
        for segment in segments:
            if segment.completed is not None:
                previous = None
                continue
            kind = _kind(segment.channel, segment.recipient)
            if kind is _Kind.REASONING and self._reasoning:
                reasoning += segment.delta
            elif kind is _Kind.CONTENT:
                content += segment.delta
            elif kind is _Kind.TOOL and self._tools:
                recipient = segment.recipient
                assert recipient is not None
                if recipient != previous:
                    calls.append(
                        ToolCallDeltaOut(
                            index=self._next_call_index,
                            id=random_tool_call_id(),
                            type="function",
                            function=FunctionDeltaOut(
                                name=recipient.removeprefix("functions."), arguments=segment.delta
                            ),
                        )
                    )
                    self._next_call_index += 1
                    previous = recipient
                elif segment.delta:
                    if calls:
                        function = calls[-1].function
                        assert function is not None
                        function.arguments = (function.arguments or "") + segment.delta
                    else:
                        calls.append(
                            ToolCallDeltaOut(
                                index=self._next_call_index - 1,
                                function=FunctionDeltaOut(arguments=segment.delta),
                            )
                        )
        if finished:
            self._next_call_index = 0
        if not content and not reasoning and not calls:
            return None
        delta = DeltaOut(reasoning=reasoning or None, content=content or None, tool_calls=calls)
        if not self._request.include_reasoning:
            delta.reasoning = None
            if not delta.content and not delta.tool_calls:
                return None
        return delta


def _arguments(text: str, content_type: str | None) -> str:
    """One-shot arguments: JSON re-serialized by Python's json (vLLM's ``json.dumps(json.loads())``:
    spaces after ``:`` and ``,``, non-ASCII escaped); kept as written when not JSON."""
    if content_type is not None and "json" not in content_type:
        return text
    try:
        return json.dumps(json.loads(text))
    except json.JSONDecodeError:
        return text
