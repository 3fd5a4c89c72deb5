"""One engine family, defined once (vLLM's parser class that ``make_adapters`` splits in two).

A family module (``worker/core/parsing/families/NAME.py``) holds its markers,
its :class:`~.config.EngineConfig`, its argument converter and scanner, and one
:class:`EngineFamily` subclass saying how a request picks the config. Its
reasoning adapter and its tool adapter are the engine's two adapters pointed at
that definition (``family = ...``), plus, on the tool side, the hooks where
vLLM's own class overrides its engine.
"""

from __future__ import annotations

from typing import Any

from worker.core.parsing.engine.config import EngineConfig
from worker.core.parsing.types import ParserTokenizer


class EngineFamily:
    """How a request (tokenizer, ``chat_template_kwargs``) picks this family's config."""

    @classmethod
    def config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        """The config both adapters run (the reasoning adapter with tools off)."""
        raise NotImplementedError

    @classmethod
    def tool_config(cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
        """The tool adapter's config, where vLLM's tool side decides thinking differently."""
        return cls.config(tokenizer, chat_template_kwargs)

    @classmethod
    def reasoning_enabled(
        cls, tokenizer: ParserTokenizer, chat_template_kwargs: dict[str, Any], config: EngineConfig
    ) -> bool:
        """False when a request switch turns one-shot reasoning extraction off (the text is content)."""
        return True
