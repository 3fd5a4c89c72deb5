"""Model and server settings shared by every entry point (``replay``, ``run``, ``demo``).

Flag names are vLLM's, so a deployment can reuse its serving flags; each flag
can also come from an environment variable (``DERENDER_`` + upper-case name).
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass

from worker.core.derenderer import DEFAULT_MAX_LOGPROBS, DEFAULT_MAX_N_SEQUENCES, Derenderer, ServerOptions
from worker.core.envelope_processor import (
    DEFAULT_MAX_LIVE_PARSERS,
    DEFAULT_MAX_RECORD_BYTES,
    EnvelopeProcessor,
)
from worker.core.model_dir import load_tokenizer
from worker.core.parsing import ChatParsing, adapter_for
from worker.errors import ConfigurationError

log = logging.getLogger(__name__)

ENV_PREFIX = "DERENDER_"


def env_default(name: str, default: str | None = None) -> str | None:
    """The environment's value for flag ``name`` (``--max-model-len`` → ``DERENDER_MAX_MODEL_LEN``)."""
    return os.environ.get(ENV_PREFIX + name.lstrip("-").replace("-", "_").upper(), default)


def _env_int(name: str) -> int | None:
    value = env_default(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigurationError(f"{ENV_PREFIX}{name.upper()} must be an integer, got {value!r}") from exc


def _env_bool(name: str) -> bool:
    return (env_default(name) or "").lower() in ("1", "true", "yes", "on")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model (vLLM's flag names)")
    group.add_argument(
        "--tokenizer",
        default=env_default("tokenizer"),
        help="model directory: tokenizer.json (or .xz), tokenizer_config.json, config.json, "
        "generation_config.json",
    )
    group.add_argument(
        "--served-model-name",
        nargs="+",
        default=(env_default("served-model-name") or "").split() or None,
        help="name(s) the model answers to; the first is reported (default: the tokenizer directory's name)",
    )
    group.add_argument(
        "--max-model-len",
        type=int,
        default=_env_int("max-model-len"),
        help="default: max_position_embeddings from config.json",
    )
    group.add_argument("--max-logprobs", type=int, default=_env_int("max-logprobs") or DEFAULT_MAX_LOGPROBS)
    group.add_argument(
        "--max-n-sequences",
        type=int,
        default=_env_int("max-n-sequences") or DEFAULT_MAX_N_SEQUENCES,
        help="vLLM's VLLM_MAX_N_SEQUENCES",
    )
    group.add_argument("--reasoning-parser", default=env_default("reasoning-parser"))
    group.add_argument(
        "--tool-parser", "--tool-call-parser", dest="tool_parser", default=env_default("tool-parser")
    )
    group.add_argument(
        "--enable-auto-tool-choice", action="store_true", default=_env_bool("enable-auto-tool-choice")
    )
    group.add_argument(
        "--max-record-bytes",
        type=int,
        default=_env_int("max-record-bytes") or DEFAULT_MAX_RECORD_BYTES,
        help="larger records are dead-lettered",
    )
    group.add_argument(
        "--max-live-parsers",
        type=int,
        default=_env_int("max-live-parsers") or DEFAULT_MAX_LIVE_PARSERS,
        help="live parser sessions kept (in `run`: one pool for the whole worker); the least recently "
        "used is rebuilt from state on use",
    )


@dataclass(frozen=True, slots=True)
class ModelSettings:
    tokenizer: str
    served_model_names: tuple[str, ...] | None = None
    max_model_len: int | None = None
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    max_n_sequences: int = DEFAULT_MAX_N_SEQUENCES
    reasoning_parser: str | None = None
    tool_parser: str | None = None
    enable_auto_tool_choice: bool = False
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    max_live_parsers: int = DEFAULT_MAX_LIVE_PARSERS

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ModelSettings:
        if not args.tokenizer:
            raise ConfigurationError("--tokenizer (or DERENDER_TOKENIZER) is required")
        if args.tool_parser and not args.enable_auto_tool_choice:
            log.warning(
                "--tool-parser %s does nothing without --enable-auto-tool-choice (as in vLLM): "
                "tool calls stay text",
                args.tool_parser,
            )
        return cls(
            tokenizer=args.tokenizer,
            served_model_names=tuple(args.served_model_name) if args.served_model_name else None,
            max_model_len=args.max_model_len,
            max_logprobs=args.max_logprobs,
            max_n_sequences=args.max_n_sequences,
            reasoning_parser=args.reasoning_parser or None,
            tool_parser=args.tool_parser or None,
            enable_auto_tool_choice=args.enable_auto_tool_choice,
            max_record_bytes=args.max_record_bytes,
            max_live_parsers=args.max_live_parsers,
        )

    def build_derenderer(self) -> Derenderer:
        tokenizer = load_tokenizer(self.tokenizer)
        max_len = self.max_model_len or tokenizer.max_position_embeddings
        if max_len is None or max_len <= 0:
            raise ConfigurationError(
                "max_model_len is unknown: pass --max-model-len or give config.json a max_position_embeddings"
            )
        names = self.served_model_names or (os.path.basename(os.path.normpath(self.tokenizer)),)
        options = ServerOptions(
            served_model_names=names,
            max_model_len=max_len,
            max_logprobs=self.max_logprobs,
            max_n_sequences=self.max_n_sequences,
        )
        parsing = None
        if self.reasoning_parser or self.tool_parser:
            parsing = ChatParsing.create(
                adapter_for(tokenizer),
                reasoning_parser=self.reasoning_parser,
                tool_parser=self.tool_parser,
                enable_auto_tool_choice=self.enable_auto_tool_choice,
            )
        return Derenderer(tokenizer, options, parsing)

    def build_processor(self) -> EnvelopeProcessor:
        return self.processor_for(self.build_derenderer())

    def processor_for(self, derenderer: Derenderer) -> EnvelopeProcessor:
        """A new processor (its own request state) sharing ``derenderer``."""
        return EnvelopeProcessor(
            derenderer, max_record_bytes=self.max_record_bytes, max_live_parsers=self.max_live_parsers
        )
