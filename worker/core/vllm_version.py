"""Which vLLM release's derender the outputs equal, and every behaviour that differs between them.

``--vllm-version`` picks one ``VllmBehaviour`` (built once, ``VllmBehaviour.of``); the code that a
difference touches reads its one field here instead of comparing versions. The docs'
``vllm-versions.md`` lists each difference with the version(s) it holds for.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from schemas.openai import TOOL_RULES_034


class VllmVersion(enum.Enum):
    V0_33 = "0.33"
    V0_34 = "0.34"


#: What a worker matches unless told otherwise: the newest supported release.
DEFAULT_VLLM_VERSION = VllmVersion.V0_34


class StateForm(enum.Enum):
    """How a ``stream_state`` carries its decode window: the key it is under.

    ``TOKENS`` (vLLM 0.33): token strings; an out-of-vocabulary id in a chunk keeps ``""`` in the
    window. ``IDS`` (vLLM 0.34): token ids; such an id is skipped. The emitted text is the same.
    """

    TOKENS = "prev_tokens"
    IDS = "prev_token_ids"

    @property
    def skips_unknown_ids(self) -> bool:
        """Whether an id outside the vocabulary is left out of the window (an id window cannot hold it)."""
        return self is StateForm.IDS


@dataclass(frozen=True, slots=True)
class VllmBehaviour:
    """One vLLM release's derender behaviour, where the supported releases differ."""

    version: VllmVersion
    state_form: StateForm
    """The window form of a stream that did not bring its own ``stream_state``."""
    omits_null_details: bool
    """``usage.prompt_tokens_details`` and one-shot ``message.annotations`` left out when null."""
    one_shot_prompt_ids_fallback: bool
    """One-shot chat parsers read the request-level ``prompt_token_ids`` when the generate
    response has none."""
    prompt_tokens_from_usage: bool
    """One-shot ``prompt_tokens`` falls back to the generate response's ``usage.prompt_tokens``."""
    decodes_prompt_logprobs: bool
    """Prompt logprobs with a null ``decoded_token`` are decoded; completion choices carry them."""
    tokens_as_token_ids: bool
    """``return_tokens_as_token_ids`` (request field or server flag) gives ``token_id:N`` tokens."""
    empty_tools_mean_none: bool
    """``tools: []`` is no tools (0.33: a 400 for ``auto``/``required``)."""
    llama3_json_on_engine: bool
    """``llama3_json`` runs on the parser engine (whole arguments when a call closes, ...)."""
    reasoning_engine_streams_all: bool
    """Without a tool parser, an engine reasoning grammar that reopens reasoning in content
    (``glm45``) streams the whole output, content included: the ``\\n`` after ``</think>`` is held,
    partial UTF-8 content is ``null``."""

    @property
    def request_context(self) -> dict[str, Any]:
        """The validation context of a ``chat_request`` / ``completion_request`` (its rules)."""
        return {TOOL_RULES_034: self.empty_tools_mean_none}

    @classmethod
    def of(cls, version: VllmVersion) -> VllmBehaviour:
        newer = version is VllmVersion.V0_34
        return cls(
            version=version,
            state_form=StateForm.IDS if newer else StateForm.TOKENS,
            omits_null_details=newer,
            one_shot_prompt_ids_fallback=newer,
            prompt_tokens_from_usage=newer,
            decodes_prompt_logprobs=newer,
            tokens_as_token_ids=newer,
            empty_tools_mean_none=newer,
            llama3_json_on_engine=newer,
            reasoning_engine_streams_all=newer,
        )


DEFAULT_BEHAVIOUR = VllmBehaviour.of(DEFAULT_VLLM_VERSION)
