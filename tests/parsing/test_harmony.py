"""gpt-oss (Harmony): how it is switched on, the vocabulary check, and the session's bounded hold."""

from __future__ import annotations

import hashlib
import os
from functools import cache

import pytest

from tests.golden_cases import MODELS_DIR
from worker.core.model_dir import load_tokenizer
from worker.core.parsing import ChatParsing, ParseRequest, TokenizerAdapter, adapter_for
from worker.core.parsing.families import harmony
from worker.errors import ConfigurationError, ParserSetupError


@cache
def _gptoss() -> TokenizerAdapter:
    return adapter_for(load_tokenizer(MODELS_DIR / "gpt-oss"))


@cache
def _qwen3() -> TokenizerAdapter:
    return adapter_for(load_tokenizer(MODELS_DIR / "qwen3"))


def _create(tokenizer: TokenizerAdapter, reasoning: str | None, tool: str | None) -> ChatParsing | None:
    return ChatParsing.create(
        tokenizer, reasoning_parser=reasoning, tool_parser=tool, enable_auto_tool_choice=tool is not None
    )


def _ids(text: str) -> list[int]:
    ids: list[int] = _gptoss()._loaded.backend.encode(text, add_special_tokens=False).ids
    return ids


def test_model_type_gpt_oss_turns_harmony_on_without_flags() -> None:
    parsing = _create(_gptoss(), None, None)
    assert parsing is not None and parsing.harmony
    assert parsing.reasoning_cls is harmony.GptOssReasoning and parsing.tool_cls is None
    message = parsing.parse_full(
        "",
        _ids("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi"),
        ParseRequest(),
        None,
    )
    assert (message.reasoning, message.content, message.tool_calls) == ("Think.", "Hi", [])


def test_the_harmony_names_refuse_other_models() -> None:
    with pytest.raises(ConfigurationError, match="model_type gpt_oss"):
        _create(_qwen3(), "openai_gptoss", None)
    with pytest.raises(ConfigurationError, match="model_type gpt_oss"):
        _create(_qwen3(), None, "openai")


def test_a_gpt_oss_model_takes_only_the_harmony_parsers() -> None:
    with pytest.raises(ConfigurationError, match="output is Harmony"):
        _create(_gptoss(), "qwen3", None)
    with pytest.raises(ConfigurationError, match="output is Harmony"):
        _create(_gptoss(), None, "hermes")


class _AlteredVocab:
    """The gpt-oss tokenizer with one BPE entry respelled."""

    def __init__(self, inner: TokenizerAdapter) -> None:
        self.model_type = inner.model_type
        self.special_ids = inner.special_ids
        self._vocab = dict(inner.get_vocab())
        token = next(t for t, i in self._vocab.items() if i == 1000)
        del self._vocab[token]
        self._vocab[token + "x"] = 1000
        self.token_to_id = inner.token_to_id
        self.id_to_token = inner.id_to_token
        self.decode = inner.decode

    def get_vocab(self) -> dict[str, int]:
        return self._vocab


def test_the_vocabulary_is_rebuilt_from_the_tokenizer_and_checked_by_sha256() -> None:
    data = harmony._o200k_vocabulary(_gptoss())
    assert hashlib.sha256(data).hexdigest() == harmony.O200K_SHA256
    assert data.count(b"\n") == harmony.O200K_RANKS
    with pytest.raises(ParserSetupError, match="sha256"):
        harmony._o200k_vocabulary(_AlteredVocab(_gptoss()))


def test_the_library_reads_the_rebuilt_file_and_the_environment_is_left_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A folder without the file: the load works only because the library was pointed elsewhere.
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", "/nonexistent-harmony-folder")
    monkeypatch.setattr(harmony, "_encoding", None)
    monkeypatch.setattr(harmony, "_checked", type(harmony._checked)())
    encoding = harmony.harmony_encoding(_gptoss())
    assert encoding.decode(_ids("<|channel|>final")) == "<|channel|>final"
    assert os.environ["TIKTOKEN_ENCODINGS_BASE"] == "/nonexistent-harmony-folder"


def test_the_session_holds_one_message_however_many_came() -> None:
    parsing = _create(_gptoss(), None, "openai")
    assert parsing is not None
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    request = ParseRequest(tools=tools, tool_choice="auto")
    session = parsing.new_stream(request, None)
    call = _ids(
        '<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"k":1}<|call|>'
    )
    assert session.step("", _ids("<|channel|>analysis<|message|>x<|end|>"), None)[0] is not None
    indexes = []
    for _ in range(200):
        delta, _ = session.step("", call, None)
        assert delta is not None
        indexes += [c.index for c in delta.tool_calls if c.id is not None]
    assert indexes == list(range(200))
    library = session._parser._session._parser
    assert len(library.messages) == 0 and len(library.tokens) == 0
