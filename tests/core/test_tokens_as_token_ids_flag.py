"""``--return-tokens-as-token-ids``, vLLM's server flag: with 0.34 it does what the request field
does (the golden probes hold vLLM 0.34.0's answers to the field), a request's own ``false`` wins,
and 0.33 ignores it."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from tests.golden_cases import GOLDEN_034_DIR, GOLDEN_DIR, GoldenCase, load_cases, normalize, settings_for
from tests.stream_builders import written
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.vllm_version import VllmVersion
from worker.runtime.composition import load_derenderer

PROBES = ("chat-stream", "chat-nonstream", "completion-nonstream")


def _probe(directory: Any, kind: str) -> GoldenCase:
    wanted = f"probe-return_tokens_as_token_ids-request-{kind}"
    return next(c for c in load_cases(directory) if c.id == wanted)


def _with_field(case: GoldenCase, value: bool | None) -> list[dict[str, Any]]:
    """The probe's input with the request's ``return_tokens_as_token_ids`` set to ``value`` (None:
    not sent)."""
    envelopes = copy.deepcopy(case.input)
    for envelope in envelopes:
        body = envelope["body"]
        request = body.get("chat_request") or body["completion_request"]
        request.pop("return_tokens_as_token_ids")
        if value is not None:
            request["return_tokens_as_token_ids"] = value
    return envelopes


def _run(case: GoldenCase, envelopes: list[dict[str, Any]], version: VllmVersion, flag: bool) -> list[Any]:
    settings = settings_for(case.config, version).model_copy(update={"return_tokens_as_token_ids": flag})
    processor = EnvelopeProcessor(load_derenderer(settings))
    return normalize([written(processor.process(orjson.dumps(e))) for e in envelopes])


def _tokens(outputs: list[Any]) -> list[str]:
    found: list[str] = []
    for output in outputs:
        body = output["body"]
        for choice in body.get("chunk", body)["choices"]:
            logprobs = choice["logprobs"]
            if "content" in logprobs:
                found += [entry["token"] for entry in logprobs["content"]]
            else:
                found += logprobs["tokens"]
    return found


@pytest.mark.parametrize("kind", PROBES)
def test_the_server_flag_gives_what_the_request_field_gives_on_034(kind: str) -> None:
    case = _probe(GOLDEN_034_DIR, kind)
    got = _run(case, _with_field(case, None), VllmVersion.V0_34, flag=True)
    assert got == normalize(case.expected)
    assert all(token.startswith("token_id:") for token in _tokens(got))


@pytest.mark.parametrize("kind", PROBES)
def test_a_request_that_says_false_wins_over_the_flag(kind: str) -> None:
    case = _probe(GOLDEN_034_DIR, kind)
    said_false = _run(case, _with_field(case, False), VllmVersion.V0_34, flag=True)
    unflagged = _run(case, _with_field(case, None), VllmVersion.V0_34, flag=False)
    assert said_false == unflagged
    assert not any(token.startswith("token_id:") for token in _tokens(said_false))


@pytest.mark.parametrize("kind", PROBES)
def test_033_ignores_the_flag_and_the_field(kind: str) -> None:
    case = _probe(GOLDEN_DIR, kind)
    assert _run(case, case.input, VllmVersion.V0_33, flag=True) == normalize(case.expected)
    assert not any(token.startswith("token_id:") for token in _tokens(normalize(case.expected)))
