"""The derender step itself: one validated body (and the sequence's state) in, OpenAI objects out.

This is the pure core behind both ``replay`` and the Kafka worker, with every
behaviour of vLLM 0.33.0's ``ServingDerender`` + ``OnlineDerenderer``:
the same checks in the same order with the same status codes, the same
decoding, and responses with the same keys and nulls. Responses are built as
plain dicts (the per-token hot path); ``schemas.openai`` holds the matching
models and the tests check the two agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from schemas.bounds import INT64_MAX, INT64_MIN
from schemas.derender import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
)
from schemas.generate import GenerateTokensResponse, GenerateTokensStreamChoice, UsageInfo
from schemas.openai import ChatCompletionRequest, CompletionRequest, NamedToolChoice
from worker.core.decoding import DecodeWindow, TextDecoder
from worker.core.logprobs import (
    chat_top_limit,
    completion_top_limit,
    context_tail,
    resolve_chat_logprobs,
    to_completion_logprobs,
)
from worker.core.model_dir import LoadedTokenizer
from worker.core.parsing import ChatParsing, DeltaOut, ParseRequest
from worker.core.sequence_state import LiveParser, SequenceState
from worker.core.stopping import StopPolicy, drop_stop_token, find_stop_string
from worker.errors import ModelNotFoundError, ParserSetupError, RequestError

JsonDict = dict[str, Any]

DEFAULT_MAX_LOGPROBS = 20
DEFAULT_MAX_N_SEQUENCES = 16384

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

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


def _ids_if(wanted: bool, ids: Sequence[int] | None) -> list[int] | None:
    """A copy of ``ids`` when the request asked for token ids, else null."""
    return list(ids) if wanted and ids is not None else None


def _usage(prompt_tokens: int, completion_tokens: int) -> JsonDict:
    total = prompt_tokens + completion_tokens
    if not INT64_MIN <= total <= INT64_MAX:  # each count fits; their sum must be writable too
        raise RequestError(f"token counts add up to {total}, past the 64-bit range", param="usage")
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": total,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def _chunk_usage(usage: UsageInfo | None, prompt_tokens: int | None) -> JsonDict | None:
    if usage is None:
        return None
    prompt = prompt_tokens if prompt_tokens is not None else (usage.prompt_tokens or 0)
    return _usage(prompt, usage.completion_tokens or 0)


def _stop_policy(request: ChatCompletionRequest | CompletionRequest | None) -> StopPolicy | None:
    if request is None:
        return None
    return StopPolicy(
        ignore_eos=request.ignore_eos,
        stop_token_ids=frozenset(request.stop_token_ids or ()),
        include_stop_str_in_output=request.include_stop_str_in_output,
        stop_strings=tuple(request.stop_strings()),
        min_tokens=request.min_tokens,
    )


def _skip_special(request: ChatCompletionRequest | CompletionRequest | None, preserve_special: bool) -> bool:
    # Every supported tokenizer is a fast one, so ``spaces_between_special_tokens``
    # never changes the incremental decode; only skipping matters.
    if preserve_special:
        return False
    return request is None or request.skip_special_tokens is not False


def _resolve_finish_reason(
    finish_reason: str | None, request: ChatCompletionRequest | None, tool_calls: bool
) -> str:
    reason = finish_reason or "stop"
    named = request is not None and isinstance(request.tool_choice, NamedToolChoice)
    if tool_calls and reason == "stop" and not named:
        return "tool_calls"
    return reason


def _message(
    content: str | None, reasoning: str | None = None, tool_calls: list[JsonDict] | None = None
) -> JsonDict:
    message: JsonDict = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    message["reasoning"] = reasoning
    return message


def _prompt_logprobs(value: list[dict[str, Any] | None] | None) -> list[dict[str, Any] | None] | None:
    """vLLM re-validates each entry as a ``Logprob``, so missing fields come back as null."""
    if value is None:
        return None
    out: list[dict[str, Any] | None] = []
    for position in value:
        if position is None:
            out.append(None)
            continue
        out.append(
            {
                str(token): {
                    "logprob": entry.get("logprob") if isinstance(entry, dict) else entry,
                    "rank": entry.get("rank") if isinstance(entry, dict) else None,
                    "decoded_token": entry.get("decoded_token") if isinstance(entry, dict) else None,
                }
                for token, entry in position.items()
            }
        )
    return out


class Derenderer:
    """vLLM's derender endpoints as methods; raises ``RequestError`` where vLLM answers with an error."""

    def __init__(
        self,
        tokenizer: LoadedTokenizer,
        options: ServerOptions,
        parsing: ChatParsing | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tokenizer = tokenizer
        self.decoder = TextDecoder(tokenizer)
        self.options = options
        self.parsing = parsing
        self._clock = clock

    # --- shared checks -----------------------------------------------------------------------

    def check_model(self, model: str | None) -> str:
        """The model name to report; 404 for a name this server does not serve."""
        if model and model not in self.options.served_model_names:
            raise ModelNotFoundError(model, ", ".join(self.options.served_model_names))
        return model or self.options.model_name

    def _check_prompt_ids(self, prompt_token_ids: Sequence[int] | None) -> None:
        limit = self.options.max_model_len
        if prompt_token_ids is not None and len(prompt_token_ids) > limit:
            raise RequestError(
                f"prompt_token_ids length ({len(prompt_token_ids)}) exceeds max_model_len ({limit})."
            )

    def _check_bounds(self, responses: Sequence[GenerateTokensResponse]) -> None:
        max_n = self.options.max_n_sequences
        limit = self.options.max_model_len
        max_logprobs = self.options.max_logprobs
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

    def _check_stream_choices(self, choices: Sequence[GenerateTokensStreamChoice], prompt_len: int) -> None:
        """Bounds vLLM 0.33.0 leaves off streamed chunks, so one record's work stays O(its tokens).

        A completion chunk's delta is bounded by ``max_model_len`` as chat's is, logprob
        positions by the chunk's own tokens, candidates by ``max_logprobs``.
        """
        limit = self.options.max_model_len
        max_logprobs = self.options.max_logprobs
        delta_len = sum(len(c.token_ids) for c in choices if c.token_ids)
        if prompt_len + delta_len > limit:
            raise RequestError(
                f"prompt_token_ids length ({prompt_len}) plus delta ({delta_len}) "
                f"exceeds max_model_len ({limit})."
            )
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

    def _drop_stop(
        self,
        token_ids: Sequence[int],
        finish_reason: str | None,
        stop_reason: int | str | None,
        policy: StopPolicy | None,
    ) -> tuple[Sequence[int], int | str | None]:
        return drop_stop_token(
            token_ids,
            finish_reason,
            stop_reason,
            policy,
            eos_token_id=self.tokenizer.eos_token_id,
            model_eos_ids=self.tokenizer.model_eos_ids,
        )

    def _seeded(
        self,
        state: SequenceState | None,
        prompt_token_ids: Sequence[int] | None,
        chunk_prompt_token_ids: Sequence[int] | None,
        skip_special: bool,
    ) -> SequenceState:
        """``state``, or a new one seeded from the prompt tail on a sequence's first record.

        A carried state already holds the prompt; the request-level ids win over the chunk's.
        """
        if state is not None:
            return state
        seed_ids = prompt_token_ids if prompt_token_ids is not None else chunk_prompt_token_ids
        return SequenceState(window=self.decoder.seed_window(seed_ids, skip_special))

    def _decode_choice(
        self,
        window: DecodeWindow,
        choice: GenerateTokensStreamChoice,
        policy: StopPolicy | None,
        skip_special: bool,
    ) -> tuple[str, int | str | None]:
        """One streamed choice's new text (stop token left out) and its ``stop_reason``."""
        text_ids, stop_reason = self._drop_stop(
            choice.token_ids or [], choice.finish_reason, choice.stop_reason, policy
        )
        return self.decoder.extend(window, text_ids, skip_special), stop_reason

    def _decode_output(
        self,
        token_ids: Sequence[int],
        finish_reason: str | None,
        stop_reason: int | str | None,
        policy: StopPolicy | None,
        seed: DecodeWindow,
        skip_special: bool,
    ) -> tuple[str, int | str | None]:
        """A complete output's text: stop token dropped, then cut at the stop string that ended it."""
        reported = stop_reason
        kept, stop_reason = self._drop_stop(token_ids, finish_reason, stop_reason, policy)
        if finish_reason != "stop" or isinstance(reported, int):
            stop_strings: Sequence[str] = ()
        elif isinstance(reported, str):
            stop_strings = (reported,)
        else:
            stop_strings = policy.stop_strings if policy is not None else ()
        min_tokens = policy.min_tokens if policy is not None else 0
        window = seed.copy()
        # A stop string only counts once it ends past the first min_tokens tokens.
        head = self.decoder.extend(window, kept[:min_tokens], skip_special)
        tail = self.decoder.extend(window, kept[min_tokens:], skip_special)
        text = head + tail
        include = policy is not None and policy.include_stop_str_in_output
        match = find_stop_string(text, len(tail), stop_strings, include)
        if match is None:
            return text, stop_reason
        matched, cut = match
        return (text if cut == -1 else text[:cut]), matched

    # --- chat, one-shot ----------------------------------------------------------------------

    def chat(self, body: DerenderChatRequest) -> JsonDict:
        model = self.check_model(body.model)
        gen = body.generate_response
        self._check_bounds([gen])
        self._check_prompt_ids(body.prompt_token_ids)
        request = body.chat_request
        if self.parsing is not None and request is None:
            raise RequestError(PARSER_NEEDS_CHAT_REQUEST)
        parsing = self.parsing if request is not None else None
        skip_special = _skip_special(request, preserve_special=parsing is not None)
        seed_ids = body.prompt_token_ids if body.prompt_token_ids is not None else gen.prompt_token_ids
        seed = self.decoder.seed_window(seed_ids, skip_special)
        policy = _stop_policy(request)
        hide_metadata = parsing is not None and request is not None and not request.include_reasoning
        return_token_ids = bool(request is not None and request.return_token_ids and not hide_metadata)
        top_limit = chat_top_limit(request)
        parse_request = _parse_request(request) if parsing is not None and request is not None else None

        choices: list[JsonDict] = []
        for choice in gen.choices:
            if not choice.token_ids:
                raise RequestError(f"choice {choice.index} has empty or null token_ids")
            logprobs = (
                resolve_chat_logprobs(self.decoder, choice.logprobs, top_limit=top_limit)
                if choice.logprobs is not None and not hide_metadata
                else None
            )
            text, stop_reason = self._decode_output(
                choice.token_ids, choice.finish_reason, choice.stop_reason, policy, seed, skip_special
            )
            if parsing is not None and parse_request is not None:
                try:
                    parsed = parsing.parse_full(
                        text, list(choice.token_ids), parse_request, gen.prompt_token_ids
                    )
                except ParserSetupError as exc:
                    # vLLM builds the parser inside the handler, so this escapes as a 500.
                    raise RequestError(str(exc), code=500, error_type="InternalServerError") from exc
                tool_calls = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call in parsed.tool_calls
                ]
                message = _message(parsed.content, parsed.reasoning, tool_calls)
            else:
                tool_calls = []
                message = _message(text)
            choices.append(
                {
                    "index": choice.index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": _resolve_finish_reason(choice.finish_reason, request, bool(tool_calls)),
                    "stop_reason": stop_reason,
                    "token_ids": _ids_if(return_token_ids, choice.token_ids),
                    "routed_experts": None,
                    "weight_versions": None,
                }
            )

        prompt_tokens = body.prompt_tokens if body.prompt_tokens is not None else 0
        completion_tokens = sum(len(c.token_ids) for c in gen.choices if c.token_ids)
        return {
            "id": gen.request_id,
            "object": "chat.completion",
            "created": int(self._clock()),
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": _usage(prompt_tokens, completion_tokens),
            "prompt_logprobs": _prompt_logprobs(gen.prompt_logprobs),
            "prompt_token_ids": _ids_if(
                request is not None and bool(request.return_token_ids), gen.prompt_token_ids
            ),
            "prompt_text": None,
            "kv_transfer_params": gen.kv_transfer_params,
            "ec_transfer_params": None,
            "metrics": gen.metrics,
        }

    # --- completion, one-shot ----------------------------------------------------------------

    def completion(self, body: DerenderCompletionRequest) -> JsonDict:
        model = self.check_model(body.model)
        responses = body.generate_responses
        if not responses:
            raise RequestError("generate_responses must not be empty")
        self._check_bounds(responses)
        if body.prompt_token_ids is not None:
            for ids in body.prompt_token_ids:
                self._check_prompt_ids(ids)
        request = body.completion_request
        skip_special = _skip_special(request, preserve_special=False)
        policy = _stop_policy(request)
        top_limit = completion_top_limit(request)
        return_token_ids = bool(request is not None and request.return_token_ids)
        prompt_counts = body.prompt_tokens if body.prompt_tokens is not None else [0] * len(responses)
        seed_overrides = (
            body.prompt_token_ids if body.prompt_token_ids is not None else [None] * len(responses)
        )

        choices: list[JsonDict] = []
        total_prompt = 0
        total_completion = 0
        for gen, prompt_count, override in zip(responses, prompt_counts, seed_overrides, strict=True):
            seed = self.decoder.seed_window(
                override if override is not None else gen.prompt_token_ids, skip_special
            )
            for choice in gen.choices:
                if not choice.token_ids:
                    raise RequestError(
                        f"choice {choice.index} in response {gen.request_id} has empty or null token_ids"
                    )
                text, stop_reason = self._decode_output(
                    choice.token_ids, choice.finish_reason, choice.stop_reason, policy, seed, skip_special
                )
                logprobs = None
                if choice.logprobs is not None:
                    resolved = resolve_chat_logprobs(self.decoder, choice.logprobs, top_limit=top_limit)
                    logprobs = to_completion_logprobs(resolved, choice.logprobs)
                choices.append(
                    {
                        "index": len(choices),
                        "text": text,
                        "logprobs": logprobs,
                        "finish_reason": choice.finish_reason,
                        "stop_reason": stop_reason,
                        "token_ids": _ids_if(return_token_ids, choice.token_ids),
                        "prompt_logprobs": None,
                        "prompt_token_ids": _ids_if(return_token_ids, gen.prompt_token_ids),
                        "routed_experts": None,
                        "weight_versions": None,
                    }
                )
                total_completion += len(choice.token_ids)
            total_prompt += prompt_count

        first = responses[0]
        kv_params = first.kv_transfer_params
        if any(r.kv_transfer_params != kv_params for r in responses[1:]):
            kv_params = None
        return {
            "id": first.request_id,
            "object": "text_completion",
            "created": int(self._clock()),
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": _usage(total_prompt, total_completion),
            "kv_transfer_params": kv_params,
            "ec_transfer_params": None,
            "metrics": first.metrics if len(responses) == 1 else None,
        }

    # --- chat, streaming ---------------------------------------------------------------------

    def check_chat_stream(self, body: DerenderChatStreamRequest, prior_output_len: int) -> str:
        """vLLM's pre-checks for a streaming chat body, in its order; returns the model name."""
        model = self.check_model(body.model)
        request = body.chat_request
        if request is not None and request.stop:
            raise RequestError(STREAM_STOP_STRINGS_ERROR)
        if self.parsing is not None and request is None:
            raise RequestError(PARSER_NEEDS_CHAT_REQUEST)
        if self.parsing is not None and body.prompt_token_ids is None:
            raise RequestError(PARSER_NEEDS_PROMPT_IDS)
        choices = body.generate_chunk.choices
        if len(choices) > 1:
            raise RequestError(
                f"derender_chat_stream expects at most one choice per chunk (got {len(choices)})."
            )
        prompt_len = len(body.prompt_token_ids) if body.prompt_token_ids is not None else 0
        delta_len = sum(len(c.token_ids) for c in choices if c.token_ids)
        limit = self.options.max_model_len
        if prompt_len + prior_output_len + delta_len > limit:
            raise RequestError(
                f"prompt_token_ids length ({prompt_len}) plus output_token_ids length ({prior_output_len}) "
                f"plus delta ({delta_len}) exceeds max_model_len ({limit})."
            )
        self._check_stream_choices(choices, prompt_len)
        return model

    def chat_stream(
        self, body: DerenderChatStreamRequest, state: SequenceState | None
    ) -> tuple[JsonDict, SequenceState]:
        """One generate chunk to one ``chat.completion.chunk``; ``state`` is mutated and returned.

        ``state`` None means the first record of the sequence: it is seeded from the prompt.
        """
        prior = len(state.output_token_ids) if state is not None else 0
        model = self.check_chat_stream(body, prior)
        request = body.chat_request
        if self.parsing is not None and request is not None:
            parsed_state = state if state is not None else SequenceState()
            try:
                return self._chat_stream_parsed(body, parsed_state, model)
            except Exception as exc:  # e.g. replaying a malformed caller-carried state: vLLM answers 400
                # The session may be half-stepped; the next record rebuilds it from the state.
                parsed_state.live = None
                if isinstance(exc, RequestError):
                    raise
                raise RequestError("invalid stream_state: derender failed") from exc
        gen = body.generate_chunk
        skip_special = _skip_special(request, preserve_special=False)
        state = self._seeded(state, body.prompt_token_ids, gen.prompt_token_ids, skip_special)
        policy = _stop_policy(request)
        return_token_ids = bool(request is not None and request.return_token_ids)
        top_limit = chat_top_limit(request)
        choices: list[JsonDict] = []
        for choice in gen.choices:
            delta_ids = choice.token_ids or []
            text, stop_reason = self._decode_choice(state.window, choice, policy, skip_special)
            logprobs = None
            if choice.logprobs is not None:
                logprobs = resolve_chat_logprobs(
                    self.decoder,
                    choice.logprobs,
                    context=state.logprob_context_token_ids,
                    top_limit=top_limit,
                )
            include_role = not state.role_sent
            state.role_sent = True
            state.logprob_context_token_ids = context_tail(state.logprob_context_token_ids, delta_ids)
            choices.append(
                {
                    "index": choice.index,
                    "delta": {
                        "role": "assistant" if include_role else None,
                        "content": text or None,
                        "reasoning": None,
                    },
                    "logprobs": logprobs,
                    "finish_reason": choice.finish_reason,
                    "stop_reason": stop_reason,
                    "token_ids": _ids_if(return_token_ids, choice.token_ids),
                    "weight_versions": None,
                }
            )
        return self._chat_chunk(body, model, choices), state

    def _chat_chunk(self, body: DerenderChatStreamRequest, model: str, choices: list[JsonDict]) -> JsonDict:
        gen = body.generate_chunk
        request = body.chat_request
        return {
            "id": gen.request_id,
            "object": "chat.completion.chunk",
            "created": int(self._clock()),
            "model": model,
            "choices": choices,
            "usage": _chunk_usage(gen.usage, body.prompt_tokens),
            "system_fingerprint": None,
            "prompt_token_ids": _ids_if(
                request is not None and bool(request.return_token_ids), gen.prompt_token_ids
            ),
            "prompt_text": None,
            "metrics": gen.metrics,
            "kv_transfer_params": None,
        }

    def _new_live_parser(self, body: DerenderChatStreamRequest, state: SequenceState) -> LiveParser:
        """A parser session for this sequence, brought up to date by replaying its carried history."""
        assert self.parsing is not None and body.chat_request is not None
        session = self.parsing.new_stream(_parse_request(body.chat_request), body.prompt_token_ids)
        live = LiveParser(session=session, window=self.decoder.seed_window(body.prompt_token_ids, False))
        start = 0
        for length in state.output_chunk_lens:
            chunk = state.output_token_ids[start : start + length]
            start += length
            text = self.decoder.extend(live.window, chunk, False)
            session.step(text, chunk, None)
        session.tools_streamed = state.tools_streamed
        return live

    def _chat_stream_parsed(
        self, body: DerenderChatStreamRequest, state: SequenceState, model: str
    ) -> tuple[JsonDict, SequenceState]:
        request = body.chat_request
        assert request is not None
        gen = body.generate_chunk
        live = state.live
        if live is None:
            live = self._new_live_parser(body, state)
            state.live = live
        session = live.session
        hide_metadata = session.hide_metadata
        return_token_ids = bool(request.return_token_ids and not hide_metadata)
        top_limit = chat_top_limit(request)
        choices: list[JsonDict] = []
        if gen.choices:
            choice = gen.choices[0]
            delta_ids = choice.token_ids or []
            text_ids, stop_reason = self._drop_stop(
                delta_ids, choice.finish_reason, choice.stop_reason, _stop_policy(request)
            )
            delta: JsonDict | None = None
            finish_reason: str | None = None
            if delta_ids or choice.finish_reason is not None:
                text = self.decoder.extend(live.window, text_ids, False) if delta_ids else ""
                parsed, finish_reason = session.step(text, list(delta_ids), choice.finish_reason)
                if parsed is not None:
                    delta = _delta_dict(parsed)
            if delta_ids:
                state.output_token_ids.extend(delta_ids)
                state.output_chunk_lens.append(len(delta_ids))
            logprobs = None
            if choice.logprobs is not None and not hide_metadata:
                logprobs = resolve_chat_logprobs(
                    self.decoder,
                    choice.logprobs,
                    context=state.logprob_context_token_ids,
                    top_limit=top_limit,
                )
            state.logprob_context_token_ids = context_tail(state.logprob_context_token_ids, delta_ids)
            if delta is None:
                delta = {"role": None, "content": None, "reasoning": None}
            for call in delta.get("tool_calls", ()):
                if call["id"] is None:
                    continue
                if call["index"] < len(state.last_tool_call_ids):
                    call["id"] = state.last_tool_call_ids[call["index"]]
                else:
                    state.last_tool_call_ids.append(call["id"])
            if not state.role_sent:
                delta["role"] = "assistant"
                state.role_sent = True
            choices.append(
                {
                    "index": choice.index,
                    "delta": delta,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason,
                    "stop_reason": stop_reason,
                    "token_ids": _ids_if(return_token_ids, choice.token_ids),
                    "weight_versions": None,
                }
            )
        state.tools_streamed = session.tools_streamed
        return self._chat_chunk(body, model, choices), state

    # --- completion, streaming ---------------------------------------------------------------

    def check_completion_stream(self, body: DerenderCompletionStreamRequest) -> str:
        model = self.check_model(body.model)
        request = body.completion_request
        if request is not None and request.stop:
            raise RequestError(STREAM_STOP_STRINGS_ERROR)
        self._check_prompt_ids(body.prompt_token_ids)
        if len(body.generate_chunk.choices) > 1:
            raise RequestError("derender_completion_stream expects at most one choice per chunk")
        prompt_len = len(body.prompt_token_ids) if body.prompt_token_ids is not None else 0
        self._check_stream_choices(body.generate_chunk.choices, prompt_len)
        return model

    def completion_stream(
        self, body: DerenderCompletionStreamRequest, state: SequenceState | None
    ) -> tuple[JsonDict, SequenceState]:
        model = self.check_completion_stream(body)
        request = body.completion_request
        gen = body.generate_chunk
        skip_special = _skip_special(request, preserve_special=False)
        state = self._seeded(state, body.prompt_token_ids, gen.prompt_token_ids, skip_special)
        policy = _stop_policy(request)
        top_limit = completion_top_limit(request)
        return_token_ids = bool(request is not None and request.return_token_ids)
        choices: list[JsonDict] = []
        for choice in gen.choices:
            delta_ids = choice.token_ids or []
            text, stop_reason = self._decode_choice(state.window, choice, policy, skip_special)
            logprobs = None
            next_offset = state.logprob_text_offset + len(text)
            if choice.logprobs is not None:
                resolved = resolve_chat_logprobs(
                    self.decoder,
                    choice.logprobs,
                    context=state.logprob_context_token_ids,
                    top_limit=top_limit,
                )
                logprobs = to_completion_logprobs(resolved, choice.logprobs, state.logprob_text_offset)
                if logprobs["tokens"]:
                    next_offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
            state.logprob_context_token_ids = context_tail(state.logprob_context_token_ids, delta_ids)
            state.logprob_text_offset = next_offset
            choices.append(
                {
                    "index": choice.index,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": choice.finish_reason,
                    "stop_reason": stop_reason,
                    "prompt_token_ids": _ids_if(return_token_ids, gen.prompt_token_ids),
                    "token_ids": _ids_if(return_token_ids, choice.token_ids),
                    "weight_versions": None,
                }
            )
        chunk = {
            "id": gen.request_id,
            "object": "text_completion",
            "created": int(self._clock()),
            "model": model,
            "choices": choices,
            "usage": _chunk_usage(gen.usage, body.prompt_tokens),
            "system_fingerprint": None,
            "metrics": gen.metrics,
            "kv_transfer_params": None,
        }
        return chunk, state


def _delta_dict(parsed: DeltaOut) -> JsonDict:
    """A parser's delta as vLLM serializes ``DeltaMessage`` (no ``tool_calls`` key when empty)."""
    delta: JsonDict = {"role": None, "content": parsed.content, "reasoning": parsed.reasoning}
    if parsed.tool_calls:
        delta["tool_calls"] = [
            {
                "id": call.id,
                "type": call.type,
                "index": call.index,
                "function": (
                    None
                    if call.function is None
                    else {"name": call.function.name, "arguments": call.function.arguments}
                ),
            }
            for call in parsed.tool_calls
        ]
    return delta


def _parse_request(request: ChatCompletionRequest) -> ParseRequest:
    """The fields parsing reads, from the wire model (``tool_choice`` already defaulted like vLLM)."""
    choice = request.tool_choice
    return ParseRequest(
        tools=[tool.model_dump(mode="json", exclude_none=True) for tool in request.tools]
        if request.tools
        else None,
        tool_choice=choice.model_dump(mode="json") if isinstance(choice, NamedToolChoice) else choice,
        parallel_tool_calls=request.parallel_tool_calls,
        include_reasoning=request.include_reasoning,
        chat_template_kwargs=_template_kwargs(request),
        messages=list(request.messages),
    )


def _template_kwargs(request: ChatCompletionRequest) -> dict[str, Any]:
    """The chat template kwargs vLLM resolves for the request (``build_chat_params``).

    The request's own ``chat_template_kwargs``, overridden by the request-level
    template fields that are set; a reasoning effort also switches
    ``enable_thinking`` unless the request set it itself.
    """
    extra = request.model_extra or {}
    user = dict(request.chat_template_kwargs or {})
    overrides: dict[str, Any] = {
        "add_generation_prompt": extra.get("add_generation_prompt", True),
        "continue_final_message": extra.get("continue_final_message", False),
        "documents": extra.get("documents"),
        "reasoning_effort": request.reasoning_effort,
    }
    if request.reasoning_effort is not None and "enable_thinking" not in user:
        overrides["enable_thinking"] = request.reasoning_effort != "none"
    return user | {k: v for k, v in overrides.items() if v is not None and v != "auto"}
