"""Property tests of the gateway's request parsing: any body ends as an admitted request that reads
the way the worker's (and vLLM's) models read it, or as a 400/413 in vLLM's error shape, and nothing
else: no exception escapes, no truthiness decides a field."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from schemas.openai import ChatCompletionRequest, CompletionRequest
from worker.pipeline.gateway_admission import Admitted, Endpoint, Refused, admit_body
from worker.settings import GatewayOptions

LIMITS = GatewayOptions(allow_no_api_key=True, max_body_bytes=64 * 1024, max_prompts=8, max_n=4)
MODELS: dict[str, type[BaseModel]] = {"chat": ChatCompletionRequest, "completion": CompletionRequest}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "x", "0", "1", "2", "-1", "true", "false", "True", "yes", "none", "20000"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# The fields the gateway reads, with values of every JSON type; and any others.
fields = {
    "model": values,
    "messages": st.one_of(values, st.just([{"role": "user", "content": "hi"}])),
    "prompt": st.one_of(
        values, st.lists(st.text(max_size=4), max_size=12), st.lists(st.integers(0, 99), max_size=4)
    ),
    "n": values,
    "stream": values,
    "stream_options": st.one_of(values, st.fixed_dictionaries({"include_usage": values})),
    "max_tokens": values,
    "max_completion_tokens": values,
    "logprobs": values,
    "top_logprobs": values,
}
bodies = st.fixed_dictionaries({}, optional=fields).flatmap(
    lambda known: st.dictionaries(st.text(max_size=6), values, max_size=3).map(
        lambda extra: {**extra, **known}
    )
)

# Bodies the models mostly accept (a model and messages or a prompt that validate), so the fields
# the gateway reads are checked on admitted requests too: a random body is seldom admitted. Their
# values are the shapes the models coerce (a string flag, a string or float count).
coerced = st.sampled_from(
    [None, True, False, 0, 1, 2, 2.0, "0", "1", "2", "true", "false", "yes", "off", "x"]
)
read_fields = {
    "n": coerced,
    "stream": coerced,
    "stream_options": st.one_of(coerced, st.fixed_dictionaries({"include_usage": coerced})),
    "max_tokens": coerced,
    "logprobs": coerced,
    "top_logprobs": coerced,
}
admissible = st.fixed_dictionaries(
    {
        "model": st.just("m"),
        "messages": st.just([{"role": "user", "content": "hi"}]),
        "prompt": st.just("hi"),
    },
    optional=read_fields,
)


def _model(endpoint: str, body: Any) -> BaseModel | None:
    try:
        return MODELS[endpoint].model_validate(body)
    except ValidationError:
        return None


def outcome(raw: bytes, endpoint: Endpoint) -> Admitted | Refused:
    try:
        return admit_body(raw, endpoint, LIMITS)
    except Refused as refused:
        return refused


def _as_read(raw: bytes) -> Any:
    """The body as the gateway (and ingest, and the worker) parse it: orjson."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


@settings(max_examples=400, deadline=None)
@given(body=st.one_of(bodies, admissible, values), endpoint=st.sampled_from(["chat", "completion"]))
def test_every_body_is_admitted_as_the_models_read_it_or_refused_as_vllm(
    body: Any, endpoint: Endpoint
) -> None:
    raw = json.dumps(body).encode()  # the standard library writes integers of any size
    result = outcome(raw, endpoint)
    if isinstance(result, Refused):
        assert result.status in (400, 413)
        error = result.body["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == result.status
        assert isinstance(error["message"], str) and error["message"]
        return
    assert result.raw == raw
    model = _model(endpoint, _as_read(raw))
    assert model is not None, "admitted a body the worker would refuse"
    stream = bool(getattr(model, "stream", False))
    assert result.stream is stream
    options = getattr(model, "stream_options", None)
    assert result.include_usage is bool(stream and options is not None and options.include_usage)
    assert result.n == (getattr(model, "n", None) or 1) and 1 <= result.n <= LIMITS.max_n
    assert 1 <= result.prompts <= LIMITS.max_prompts


@settings(max_examples=200, deadline=None)
@given(body=bodies, endpoint=st.sampled_from(["chat", "completion"]))
def test_a_body_the_models_refuse_is_a_400_before_anything_else(
    body: dict[str, Any], endpoint: Endpoint
) -> None:
    raw = json.dumps(body).encode()
    if _model(endpoint, _as_read(raw)) is not None:
        return
    result = outcome(raw, endpoint)
    assert isinstance(result, Refused), "a body the worker's model refuses was admitted"
    assert result.status == 400


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=256))
def test_any_bytes_end_as_an_answer(raw: bytes) -> None:
    result = outcome(raw, "chat")
    assert isinstance(result, Admitted) or result.status == 400
