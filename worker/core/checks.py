"""vLLM 0.33.0's request checks for the derender endpoints, in its order, with its messages.

Each raises ``RequestError`` (a 400 unless said) where vLLM answers with an error; the
endpoints in ``worker.core.derenderer`` call them before any decoding. Also here: the bounds
vLLM leaves off streamed chunks, which keep one record's work O(its tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.derender import DerenderChatStreamRequest, DerenderCompletionStreamRequest
from schemas.generate import GenerateTokensResponse, GenerateTokensStreamChoice
from worker.core.limits import DEFAULT_MAX_LOGPROBS as DEFAULT_MAX_LOGPROBS
from worker.core.limits import DEFAULT_MAX_N_SEQUENCES as DEFAULT_MAX_N_SEQUENCES
from worker.core.vllm_version import DEFAULT_BEHAVIOUR, VllmBehaviour
from worker.errors import ModelNotFoundError, RequestError

STREAM_STOP_STRINGS_ERROR = (
    "stop strings are not supported by streaming derender because text already sent cannot be cut. "
    "Use non-streaming derender or output_mode=text on /inference/v1/generate which holds stop strings back."
)
PARSER_NEEDS_CHAT_REQUEST = (
    "chat_request is required when a tool or reasoning parser is configured because plain "
    "detokenization would leak raw parser markup into content."
)
PARSER_NEEDS_PROMPT_IDS = (
    "prompt_token_ids is required when a tool or reasoning parser is configured. Without it "
    "parse_delta cannot tell whether the prompt left reasoning open (e.g. a chat template that "
    "pre-opens <think>) and would misclassify reasoning content as plain content."
)


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """What vLLM takes from its command line and environment for derender."""

    served_model_names: tuple[str, ...]
    max_model_len: int
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    max_n_sequences: int = DEFAULT_MAX_N_SEQUENCES
    behaviour: VllmBehaviour = DEFAULT_BEHAVIOUR
    """Which vLLM release's derender the outputs equal (``--vllm-version``)."""
    return_tokens_as_token_ids: bool = False
    """vLLM's ``--return-tokens-as-token-ids`` (0.34 on; a request's own field wins)."""

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


def check_model(options: ServerOptions, model: str | None) -> str:
    """The model name to report; 404 for a name this server does not serve."""
    if model and model not in options.served_model_names:
        raise ModelNotFoundError(model, ", ".join(options.served_model_names))
    return model or options.model_name


def check_prompt_ids(options: ServerOptions, prompt_token_ids: Sequence[int] | None) -> None:
    limit = options.max_model_len
    if prompt_token_ids is not None and len(prompt_token_ids) > limit:
        raise RequestError(
            f"prompt_token_ids length ({len(prompt_token_ids)}) exceeds max_model_len ({limit})."
        )


def check_bounds(options: ServerOptions, responses: Sequence[GenerateTokensResponse]) -> None:
    """A one-shot body's generate responses against the server's limits."""
    max_n = options.max_n_sequences
    limit = options.max_model_len
    max_logprobs = options.max_logprobs
    if len(responses) > max_n:
        raise RequestError(
            f"generate_responses count ({len(responses)}) exceeds server maximum ({max_n}). "
            "Set VLLM_MAX_N_SEQUENCES to increase this limit."
        )
    for gen in responses:
        if len(gen.choices) > max_n:
            raise RequestError(
                f"choices count ({len(gen.choices)}) in response '{gen.request_id}' "
                f"exceeds server maximum ({max_n})."
            )
        for choice in gen.choices:
            if choice.token_ids and len(choice.token_ids) > limit:
                raise RequestError(
                    f"token_ids length ({len(choice.token_ids)}) in choice {choice.index} "
                    f"exceeds max_model_len ({limit})."
                )
            content = choice.logprobs.content if choice.logprobs else None
            if content:
                if len(content) > limit:
                    raise RequestError(
                        f"logprobs.content length ({len(content)}) in choice {choice.index} "
                        f"exceeds max_model_len ({limit})."
                    )
                for entry in content:
                    if max_logprobs >= 0 and len(entry.top_logprobs) > max_logprobs:
                        raise RequestError(
                            f"top_logprobs count ({len(entry.top_logprobs)}) in choice {choice.index} "
                            f"exceeds max_logprobs ({max_logprobs})."
                        )
        if gen.prompt_logprobs and len(gen.prompt_logprobs) > limit:
            raise RequestError(
                f"prompt_logprobs length ({len(gen.prompt_logprobs)}) in response '{gen.request_id}' "
                f"exceeds max_model_len ({limit})."
            )


def _check_stream_choices(
    options: ServerOptions, choices: Sequence[GenerateTokensStreamChoice], prompt_len: int, delta_len: int
) -> None:
    """Bounds vLLM 0.33.0 leaves off streamed chunks, so one record's work stays O(its tokens).

    A completion chunk's delta is bounded by ``max_model_len`` as chat's is, logprob
    positions by the chunk's own tokens, candidates by ``max_logprobs``.
    """
    limit = options.max_model_len
    if prompt_len + delta_len > limit:
        raise RequestError(
            f"prompt_token_ids length ({prompt_len}) plus delta ({delta_len}) "
            f"exceeds max_model_len ({limit})."
        )
    max_logprobs = options.max_logprobs
    for choice in choices:
        content = choice.logprobs.content if choice.logprobs is not None else None
        if not content:
            continue
        tokens = len(choice.token_ids or ())
        if len(content) > tokens:
            raise RequestError(
                f"logprobs.content length ({len(content)}) in choice {choice.index} exceeds "
                f"its token_ids length ({tokens})."
            )
        if max_logprobs >= 0:
            for entry in content:
                if len(entry.top_logprobs) > max_logprobs:
                    raise RequestError(
                        f"top_logprobs count ({len(entry.top_logprobs)}) in choice {choice.index} "
                        f"exceeds max_logprobs ({max_logprobs})."
                    )


def _delta_len(choices: Sequence[GenerateTokensStreamChoice]) -> int:
    total = 0
    for choice in choices:  # a loop: the generator cost 0.3 µs more, on every record
        if choice.token_ids:
            total += len(choice.token_ids)
    return total


def check_chat_stream(
    options: ServerOptions, body: DerenderChatStreamRequest, prior_output_len: int, *, parsing: bool
) -> str:
    """vLLM's pre-checks for a streaming chat body, in its order; returns the model name.

    ``parsing``: a reasoning or tool parser is configured.
    """
    model = check_model(options, body.model)
    request = body.chat_request
    if request is not None and request.stop:
        raise RequestError(STREAM_STOP_STRINGS_ERROR)
    if parsing and request is None:
        raise RequestError(PARSER_NEEDS_CHAT_REQUEST)
    if parsing and body.prompt_token_ids is None:
        raise RequestError(PARSER_NEEDS_PROMPT_IDS)
    choices = body.generate_chunk.choices
    if len(choices) > 1:
        raise RequestError(f"derender_chat_stream expects at most one choice per chunk (got {len(choices)}).")
    prompt_len = len(body.prompt_token_ids) if body.prompt_token_ids is not None else 0
    delta_len = _delta_len(choices)
    limit = options.max_model_len
    if prompt_len + prior_output_len + delta_len > limit:
        raise RequestError(
            f"prompt_token_ids length ({prompt_len}) plus output_token_ids length ({prior_output_len}) "
            f"plus delta ({delta_len}) exceeds max_model_len ({limit})."
        )
    _check_stream_choices(options, choices, prompt_len, delta_len)
    return model


def check_completion_stream(options: ServerOptions, body: DerenderCompletionStreamRequest) -> str:
    """vLLM's pre-checks for a streaming completion body, in its order; returns the model name."""
    model = check_model(options, body.model)
    request = body.completion_request
    if request is not None and request.stop:
        raise RequestError(STREAM_STOP_STRINGS_ERROR)
    check_prompt_ids(options, body.prompt_token_ids)
    choices = body.generate_chunk.choices
    if len(choices) > 1:
        raise RequestError("derender_completion_stream expects at most one choice per chunk")
    prompt_len = len(body.prompt_token_ids) if body.prompt_token_ids is not None else 0
    _check_stream_choices(options, choices, prompt_len, _delta_len(choices))
    return model
