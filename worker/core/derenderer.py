"""The derender endpoints: one validated body (and the sequence's state) in, OpenAI objects out.

This is the pure core behind both ``replay`` and the Kafka worker, with every
behaviour of vLLM 0.33.0's ``ServingDerender`` + ``OnlineDerenderer``: the
checks (``worker.core.checks``, in vLLM's order with its status codes), the
same decoding, and the responses (``worker.core.responses``) with the same keys
and nulls. A streamed chat choice takes one step whether or not a parser is
configured (``Derenderer._chat_choice``); only how text becomes a delta differs.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from schemas.derender import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
)
from schemas.generate import GenerateTokensStreamChoice
from schemas.openai import ChatCompletionRequest, CompletionRequest, NamedToolChoice
from worker.core.checks import (
    DEFAULT_MAX_LOGPROBS,
    DEFAULT_MAX_N_SEQUENCES,
    PARSER_NEEDS_CHAT_REQUEST,
    ServerOptions,
    check_bounds,
    check_chat_stream,
    check_completion_stream,
    check_model,
    check_prompt_ids,
)
from worker.core.decoding import DecodeWindow, TextDecoder
from worker.core.logprobs import (
    chat_top_limit,
    completion_top_limit,
    context_tail,
    decode_prompt_logprobs,
    resolve_chat_logprobs,
    to_completion_logprobs,
)
from worker.core.model_dir import LoadedTokenizer
from worker.core.parsing import ChatParsing, ParseRequest
from worker.core.responses import (
    chat_chunk,
    chat_stream_choice,
    completion_chunk,
    ids_if,
    message,
    one_shot_prompt_tokens,
    parsed_delta,
    plain_delta,
    prompt_logprobs,
    resolve_finish_reason,
    usage,
)
from worker.core.sequence_state import LiveParser, SequenceState
from worker.core.stopping import StopPolicy, drop_stop_token, find_stop_string
from worker.errors import ParserSetupError, RequestError

__all__ = ["DEFAULT_MAX_LOGPROBS", "DEFAULT_MAX_N_SEQUENCES", "Derenderer", "ServerOptions"]

JsonDict = dict[str, Any]
# A streamed chat choice's new text (stop token left out) and ids -> its delta and finish_reason.
ToDelta = Callable[
    [list[int] | Sequence[int], Sequence[int], GenerateTokensStreamChoice], tuple[JsonDict, str | None]
]


def _skip_special(request: ChatCompletionRequest | CompletionRequest | None, preserve_special: bool) -> bool:
    # Every supported tokenizer is a fast one, so ``spaces_between_special_tokens``
    # never changes the incremental decode; only skipping matters.
    if preserve_special:
        return False
    return request is None or request.skip_special_tokens is not False


def _shows_metadata(request: ChatCompletionRequest | None, *, parsed: bool) -> bool:
    """Whether a chat choice carries logprobs and token ids: vLLM leaves them out of a parsed
    response whose request turned reasoning off, as they would show the hidden reasoning."""
    return not parsed or request is None or bool(request.include_reasoning)


def pin_tool_call_ids(delta: JsonDict, pinned: list[str]) -> None:
    """Give each id-bearing call of ``delta`` the id first sent for its index (also when the
    session was rebuilt); a new index's id is appended to ``pinned``.

    The index is read as a Python list index, as vLLM reads it: ``deepseek_v31`` can send a name
    at index -1 (docs/compatibility.md, item 22). An index before the first pinned id is
    vLLM's ``IndexError``, which its endpoint answers with this 400.
    """
    calls = delta.get("tool_calls")
    if not calls:
        return
    ids = list(pinned)  # taken only if every call pins: a 400 leaves the list as it was
    for call in calls:
        if call["id"] is None:
            continue
        index = call["index"]
        if index >= len(ids):
            ids.append(call["id"])
        elif index < -len(ids):
            raise RequestError("invalid stream_state: derender failed")
        else:
            call["id"] = ids[index]
    pinned[:] = ids


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
        self._policies: dict[
            int, tuple[weakref.ref[ChatCompletionRequest | CompletionRequest], StopPolicy]
        ] = {}

    def parses_differently(
        self, old: ChatCompletionRequest | CompletionRequest, new: ChatCompletionRequest | CompletionRequest
    ) -> bool:
        """Whether a parser session built from ``old`` would parse otherwise with ``new``."""
        if self.parsing is None or not isinstance(old, ChatCompletionRequest):
            return False
        return not isinstance(new, ChatCompletionRequest) or _parse_request(old) != _parse_request(new)

    def check_model(self, model: str | None) -> str:
        """The model name to report; 404 for a name this server does not serve."""
        return check_model(self.options, model)

    # --- shared steps ------------------------------------------------------------------------

    def _tokens_as_token_ids(self, request: ChatCompletionRequest | CompletionRequest | None) -> bool:
        """Whether logprob tokens are ``token_id:N``: the request's ``return_tokens_as_token_ids``,
        else the server flag; never on a version that ignores both (0.33)."""
        if not self.options.behaviour.tokens_as_token_ids:
            return False
        if request is not None and request.return_tokens_as_token_ids is not None:
            return request.return_tokens_as_token_ids
        return self.options.return_tokens_as_token_ids

    def _prompt_logprobs(
        self, value: list[dict[str, Any] | None] | None
    ) -> list[dict[str, Any] | None] | None:
        """A response's ``prompt_logprobs``; vLLM 0.34 decodes a null ``decoded_token``."""
        if self.options.behaviour.decodes_prompt_logprobs:
            value = decode_prompt_logprobs(self.decoder, value)
        return prompt_logprobs(value)

    def _chat_chunk(self, body: DerenderChatStreamRequest, model: str, choices: list[JsonDict]) -> JsonDict:
        omit_null = self.options.behaviour.omits_null_details
        return chat_chunk(body, model, int(self._clock()), choices, omit_null_details=omit_null)

    def _stop_policy(self, request: ChatCompletionRequest | CompletionRequest | None) -> StopPolicy | None:
        """The request's stop policy, built once per request object (every record asks for it)."""
        if request is None:
            return None
        key = id(request)
        known = self._policies.get(key)
        if known is not None and known[0]() is request:
            return known[1]
        policy = StopPolicy(
            ignore_eos=request.ignore_eos,
            stop_token_ids=frozenset(request.stop_token_ids or ()),
            include_stop_str_in_output=request.include_stop_str_in_output,
            stop_strings=tuple(request.stop_strings()),
            min_tokens=request.min_tokens,
        )
        # Held weakly: a closed request's messages and tools must not stay alive for the cache's
        # sake (the memory caps count only open requests); the entry goes with the request.
        self._policies[key] = (weakref.ref(request, functools.partial(self._forget_policy, key)), policy)
        return policy

    def _forget_policy(self, key: int, dead: weakref.ref[ChatCompletionRequest | CompletionRequest]) -> None:
        known = self._policies.get(key)
        if known is not None and known[0] is dead:
            del self._policies[key]

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
        return self.new_state(self.decoder.seed_window(seed_ids, skip_special))

    def new_state(self, window: DecodeWindow | None = None) -> SequenceState:
        """A sequence's first state, written in the configured version's window form."""
        return SequenceState(
            window=window if window is not None else DecodeWindow(),
            form=self.options.behaviour.state_form,
            decoder=self.decoder,
        )

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
        model = check_model(self.options, body.model)
        gen = body.generate_response
        check_bounds(self.options, [gen])
        check_prompt_ids(self.options, body.prompt_token_ids)
        request = body.chat_request
        if self.parsing is not None and request is None:
            raise RequestError(PARSER_NEEDS_CHAT_REQUEST)
        parsing = self.parsing if request is not None else None
        skip_special = _skip_special(request, preserve_special=parsing is not None)
        seed_ids = body.prompt_token_ids if body.prompt_token_ids is not None else gen.prompt_token_ids
        seed = self.decoder.seed_window(seed_ids, skip_special)
        policy = self._stop_policy(request)
        behaviour = self.options.behaviour
        omit_null = behaviour.omits_null_details
        as_token_ids = self._tokens_as_token_ids(request)
        parser_prompt_ids = gen.prompt_token_ids
        if behaviour.one_shot_prompt_ids_fallback:
            # vLLM 0.34: the engine's ids are the whole prompt; the caller's may be a suffix.
            parser_prompt_ids = gen.prompt_token_ids or body.prompt_token_ids
        show_metadata = _shows_metadata(request, parsed=parsing is not None)
        return_token_ids = bool(request is not None and request.return_token_ids and show_metadata)
        top_limit = chat_top_limit(request)
        parse_request = _parse_request(request) if parsing is not None and request is not None else None

        choices: list[JsonDict] = []
        for choice in gen.choices:
            if not choice.token_ids:
                raise RequestError(f"choice {choice.index} has empty or null token_ids")
            logprobs = (
                resolve_chat_logprobs(
                    self.decoder, choice.logprobs, top_limit=top_limit, as_token_ids=as_token_ids
                )
                if choice.logprobs is not None and show_metadata
                else None
            )
            text, stop_reason = self._decode_output(
                choice.token_ids, choice.finish_reason, choice.stop_reason, policy, seed, skip_special
            )
            if parsing is not None and parse_request is not None:
                try:
                    parsed = parsing.parse_full(
                        text, list(choice.token_ids), parse_request, parser_prompt_ids
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
                reply = message(parsed.content, parsed.reasoning, tool_calls, omit_null_details=omit_null)
            else:
                tool_calls = []
                reply = message(text, omit_null_details=omit_null)
            choices.append(
                {
                    "index": choice.index,
                    "message": reply,
                    "logprobs": logprobs,
                    "finish_reason": resolve_finish_reason(choice.finish_reason, request, bool(tool_calls)),
                    "stop_reason": stop_reason,
                    "token_ids": ids_if(return_token_ids, choice.token_ids),
                    "routed_experts": None,
                    "weight_versions": None,
                }
            )

        prompt_tokens = one_shot_prompt_tokens(
            body.prompt_tokens, gen.usage, from_usage=behaviour.prompt_tokens_from_usage
        )
        completion_tokens = sum(len(c.token_ids) for c in gen.choices if c.token_ids)
        return {
            "id": gen.request_id,
            "object": "chat.completion",
            "created": int(self._clock()),
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(prompt_tokens, completion_tokens, omit_null_details=omit_null),
            "prompt_logprobs": self._prompt_logprobs(gen.prompt_logprobs),
            "prompt_token_ids": ids_if(
                request is not None and bool(request.return_token_ids), gen.prompt_token_ids
            ),
            "prompt_text": None,
            "kv_transfer_params": gen.kv_transfer_params,
            "ec_transfer_params": None,
            "metrics": gen.metrics,
        }

    # --- completion, one-shot ----------------------------------------------------------------

    def completion(self, body: DerenderCompletionRequest) -> JsonDict:
        model = check_model(self.options, body.model)
        responses = body.generate_responses
        if not responses:
            raise RequestError("generate_responses must not be empty")
        check_bounds(self.options, responses)
        if body.prompt_token_ids is not None:
            for ids in body.prompt_token_ids:
                check_prompt_ids(self.options, ids)
        request = body.completion_request
        skip_special = _skip_special(request, preserve_special=False)
        policy = self._stop_policy(request)
        top_limit = completion_top_limit(request)
        return_token_ids = bool(request is not None and request.return_token_ids)
        behaviour = self.options.behaviour
        as_token_ids = self._tokens_as_token_ids(request)
        prompt_counts = (
            body.prompt_tokens
            if body.prompt_tokens is not None
            else [
                one_shot_prompt_tokens(None, gen.usage, from_usage=behaviour.prompt_tokens_from_usage)
                for gen in responses
            ]
        )
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
            # vLLM 0.33 sends none on completion choices; 0.34 the response's, decoded.
            choice_prompt_logprobs = (
                self._prompt_logprobs(gen.prompt_logprobs) if behaviour.decodes_prompt_logprobs else None
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
                    resolved = resolve_chat_logprobs(
                        self.decoder, choice.logprobs, top_limit=top_limit, as_token_ids=as_token_ids
                    )
                    logprobs = to_completion_logprobs(resolved, choice.logprobs)
                choices.append(
                    {
                        "index": len(choices),
                        "text": text,
                        "logprobs": logprobs,
                        "finish_reason": choice.finish_reason,
                        "stop_reason": stop_reason,
                        "token_ids": ids_if(return_token_ids, choice.token_ids),
                        "prompt_logprobs": choice_prompt_logprobs,
                        "prompt_token_ids": ids_if(return_token_ids, gen.prompt_token_ids),
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
            "usage": usage(total_prompt, total_completion, omit_null_details=behaviour.omits_null_details),
            "kv_transfer_params": kv_params,
            "ec_transfer_params": None,
            "metrics": first.metrics if len(responses) == 1 else None,
        }

    # --- chat, streaming ---------------------------------------------------------------------

    def check_chat_stream(self, body: DerenderChatStreamRequest, prior_output_len: int) -> str:
        """vLLM's pre-checks for a streaming chat body, in its order; returns the model name."""
        return check_chat_stream(self.options, body, prior_output_len, parsing=self.parsing is not None)

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
            parsed_state = state if state is not None else self.new_state()
            try:
                return self._chat_stream_parsed(body, parsed_state, model)
            except Exception as exc:
                # The session may be half-stepped; the next record rebuilds it from the state.
                parsed_state.live = None
                if isinstance(exc, RequestError):
                    raise
                if isinstance(exc, ParserSetupError | RecursionError) or body.stream_state is not None:
                    # vLLM rebuilds the parser from the caller's state on every call and answers
                    # any failure there with a 400 (also a parser this request cannot use, and
                    # model output nested past what Python's json reads: vLLM's parsers fail on
                    # it where ours do).
                    raise RequestError("invalid stream_state: derender failed") from exc
                # No state came from the caller: the failure is ours, a 500 at the record boundary.
                raise
        skip_special = _skip_special(request, preserve_special=False)
        state = self._seeded(state, body.prompt_token_ids, body.generate_chunk.prompt_token_ids, skip_special)
        window = state.window
        extend = self.decoder.extend
        skip_unknown = state.form.skips_unknown_ids

        def to_delta(
            text_ids: list[int] | Sequence[int], delta_ids: Sequence[int], choice: GenerateTokensStreamChoice
        ) -> tuple[JsonDict, str | None]:
            text = extend(window, text_ids, skip_special, skip_unknown_ids=skip_unknown)
            return plain_delta(text), choice.finish_reason

        return_token_ids = bool(request is not None and request.return_token_ids)
        choices = [
            self._chat_choice(
                choice, state, request, to_delta, show_metadata=True, token_ids=return_token_ids
            )
            for choice in body.generate_chunk.choices
        ]
        return self._chat_chunk(body, model, choices), state

    def _chat_choice(
        self,
        choice: GenerateTokensStreamChoice,
        state: SequenceState,
        request: ChatCompletionRequest | None,
        to_delta: ToDelta,
        *,
        show_metadata: bool,
        token_ids: bool,
    ) -> JsonDict:
        """One streamed chat choice: stop token, delta, logprobs, role, as both chat paths take it.

        ``show_metadata`` false (a parser hiding reasoning's metadata) leaves logprobs out.
        """
        delta_ids = choice.token_ids or []
        text_ids, stop_reason = self._drop_stop(
            delta_ids, choice.finish_reason, choice.stop_reason, self._stop_policy(request)
        )
        delta, finish_reason = to_delta(text_ids, delta_ids, choice)
        logprobs = None
        if choice.logprobs is not None and show_metadata:
            logprobs = resolve_chat_logprobs(
                self.decoder,
                choice.logprobs,
                context=state.logprob_context_token_ids,
                top_limit=chat_top_limit(request),
                as_token_ids=self._tokens_as_token_ids(request),
            )
        state.logprob_context_token_ids = context_tail(state.logprob_context_token_ids, delta_ids)
        if not state.role_sent:
            delta["role"] = "assistant"
            state.role_sent = True
        return chat_stream_choice(
            choice.index, delta, logprobs, finish_reason, stop_reason, ids_if(token_ids, choice.token_ids)
        )

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
        finishes = any(c.finish_reason is not None for c in body.generate_chunk.choices)
        steps = finishes or any(c.token_ids for c in body.generate_chunk.choices)
        live = state.live
        # A held state's session is rebuilt only for a record that steps it (not for a usage-only
        # one after a finish); a carried state's is always, as vLLM replays it on every call.
        if live is None and (steps or body.stream_state is not None):
            live = self._new_live_parser(body, state)
            state.live = live
        extend = self.decoder.extend

        def to_delta(
            text_ids: list[int] | Sequence[int], delta_ids: Sequence[int], choice: GenerateTokensStreamChoice
        ) -> tuple[JsonDict, str | None]:
            parsed, finish_reason = None, None
            if delta_ids or choice.finish_reason is not None:
                assert live is not None  # ``steps``
                text = extend(live.window, text_ids, False) if delta_ids else ""
                parsed, finish_reason = live.session.step(text, list(delta_ids), choice.finish_reason)
            delta = parsed_delta(parsed)
            # Pinned before the state advances: a 400 here leaves the state as the record found it.
            pin_tool_call_ids(delta, state.last_tool_call_ids)
            if delta_ids:
                state.output_token_ids.extend(delta_ids)
                state.output_chunk_lens.append(len(delta_ids))
            return delta, finish_reason

        show_metadata = _shows_metadata(request, parsed=True)
        return_token_ids = bool(request.return_token_ids and show_metadata)
        choices = [
            self._chat_choice(
                choice, state, request, to_delta, show_metadata=show_metadata, token_ids=return_token_ids
            )
            for choice in body.generate_chunk.choices
        ]
        if live is not None:
            state.tools_streamed = live.session.tools_streamed
        if finishes:
            # The session took the finish (flushed, and its window skipped a dropped stop token);
            # vLLM replays a later record's history without it, so one is rebuilt the same way.
            state.live = None
        return self._chat_chunk(body, model, choices), state

    # --- completion, streaming ---------------------------------------------------------------

    def check_completion_stream(self, body: DerenderCompletionStreamRequest) -> str:
        return check_completion_stream(self.options, body)

    def completion_stream(
        self, body: DerenderCompletionStreamRequest, state: SequenceState | None
    ) -> tuple[JsonDict, SequenceState]:
        model = self.check_completion_stream(body)
        request = body.completion_request
        gen = body.generate_chunk
        skip_special = _skip_special(request, preserve_special=False)
        state = self._seeded(state, body.prompt_token_ids, gen.prompt_token_ids, skip_special)
        policy = self._stop_policy(request)
        top_limit = completion_top_limit(request)
        return_token_ids = bool(request is not None and request.return_token_ids)
        choices: list[JsonDict] = []
        for choice in gen.choices:
            delta_ids = choice.token_ids or []
            text_ids, stop_reason = self._drop_stop(
                delta_ids, choice.finish_reason, choice.stop_reason, policy
            )
            text = self.decoder.extend(
                state.window, text_ids, skip_special, skip_unknown_ids=state.form.skips_unknown_ids
            )
            logprobs = None
            next_offset = state.logprob_text_offset + len(text)
            if choice.logprobs is not None:
                resolved = resolve_chat_logprobs(
                    self.decoder,
                    choice.logprobs,
                    context=state.logprob_context_token_ids,
                    top_limit=top_limit,
                    as_token_ids=self._tokens_as_token_ids(request),
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
                    "prompt_token_ids": ids_if(return_token_ids, gen.prompt_token_ids),
                    "token_ids": ids_if(return_token_ids, choice.token_ids),
                    "weight_versions": None,
                }
            )
        omit_null = self.options.behaviour.omits_null_details
        return completion_chunk(body, model, int(self._clock()), choices, omit_null_details=omit_null), state


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
