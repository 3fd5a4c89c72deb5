"""The gateway's admission, edge and delivery pieces on their own (no broker): what a request may ask
for, who may ask, what trace context passes, and how outputs wait for a client."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from aiohttp import web

from tests.async_helpers import serving_app
from worker.core.vllm_version import VllmVersion
from worker.errors import ConfigurationError
from worker.pipeline.gateway_admission import Admitted, Budget, Refused, admit_body
from worker.pipeline.gateway_delivery import Delivery, Mailbox, SseWriter
from worker.pipeline.gateway_edge import ANONYMOUS, ApiKeys, allowed_baggage, edge_trace, unsampled
from worker.settings import GatewayOptions

CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def options(**changes: Any) -> GatewayOptions:
    return GatewayOptions(allow_no_api_key=True, **changes)


def admit(body: Any, endpoint: str = "chat", **limits: Any) -> Admitted:
    return admit_body(orjson.dumps(body), endpoint, options(**limits))  # type: ignore[arg-type]


def refused(body: Any, endpoint: str = "chat", **limits: Any) -> Refused:
    with pytest.raises(Refused) as raised:
        admit(body, endpoint, **limits)
    return raised.value


# --- the shapes vLLM coerces or refuses --------------------------------------------------------------


def test_a_string_include_usage_is_read_as_vllm_reads_it() -> None:
    # Truthiness took "false" as true, and the gateway waited 600 s for a usage chunk never sent.
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": "false"}}
    assert admit(body).include_usage is False
    assert admit({**body, "stream_options": {"include_usage": "true"}}).include_usage is True


def test_a_string_n_is_the_number_vllm_reads() -> None:
    # A string n was taken as 1: choice 1 never reached the client.
    assert admit({**CHAT, "n": "2"}).n == 2


def test_a_malformed_stream_options_is_vllms_400() -> None:
    error = refused({**CHAT, "stream": True, "stream_options": "x"})
    assert error.status == 400
    assert error.body["error"]["type"] == "BadRequestError"
    assert "stream_options" in error.body["error"]["message"]
    rule = refused({**CHAT, "stream_options": {"include_usage": True}})  # without stream
    # Worded as the worker (and vLLM's handler) word a broken request rule.
    assert "Stream options can only be defined when `stream=True`." in rule.body["error"]["message"]
    assert rule.body["error"]["param"] == "stream_options"


def test_empty_tools_follow_the_configured_vllm_version() -> None:
    """vLLM 0.34 reads ``tools: []`` as no tools; 0.33 refuses it. The gateway checks a request by the
    rules of the version its workers derender as, or it would refuse what they accept."""
    body = {**CHAT, "tools": [], "tool_choice": "auto"}
    assert admit(body, vllm_version=VllmVersion.V0_34).endpoint == "chat"
    assert refused(body, vllm_version=VllmVersion.V0_33).status == 400


def test_a_string_stream_flag_is_the_boolean_vllm_reads() -> None:
    assert admit({**CHAT, "stream": "false"}).stream is False
    assert admit({**CHAT, "stream": "true"}).stream is True


@pytest.mark.parametrize("raw", [b"", b"{", b"[1]", b'"x"', b"null"])
def test_a_body_that_is_no_json_object_is_a_400(raw: bytes) -> None:
    with pytest.raises(Refused) as raised:
        admit_body(raw, "chat", options())
    assert raised.value.status == 400


# --- per-request limits ----------------------------------------------------------------------------


def test_a_body_over_the_limit_is_a_413() -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
    assert refused(body, max_body_bytes=1000).status == 413
    assert admit(body, max_body_bytes=4000).size < 4000


def test_prompts_and_n_are_capped() -> None:
    completion = {"model": "m", "prompt": ["a", "b", "c"]}
    assert admit(completion, "completion").prompts == 3
    assert admit({**completion, "prompt": [1, 2, 3]}, "completion").prompts == 1  # one prompt of ids
    error = refused(completion, "completion", max_prompts=2)
    assert (error.status, error.body["error"]["param"]) == (400, "prompt")
    error = refused({**CHAT, "n": 9}, max_n=8)
    assert (error.status, error.body["error"]["param"]) == (400, "n")


def test_a_one_shot_answer_that_cannot_fit_a_record_is_refused() -> None:
    # The request: 20000 tokens with 20 alternatives each is one input record past 16 MiB.
    big = {**CHAT, "max_tokens": 20000, "logprobs": True, "top_logprobs": 20}
    error = refused(big)
    assert (error.status, error.body["error"]["param"]) == (400, "max_tokens")
    assert refused({**big, "max_tokens": None, "max_completion_tokens": "20000"}).status == 400
    assert refused({**big, "max_tokens": 5000, "n": 2}).status == 400  # n multiplies it
    assert admit({**big, "max_tokens": 5000}).stream is False  # 105,000 entries fit
    assert admit({**big, "stream": True}).stream  # streamed: each chunk is its own record
    assert admit({**big, "logprobs": False, "top_logprobs": 0}).n == 1  # no logprobs asked
    completion = {"model": "m", "prompt": "p", "max_tokens": 20000, "logprobs": 20}
    assert refused(completion, "completion").status == 400


# --- what is open at once --------------------------------------------------------------------------


def test_open_requests_and_bytes_per_key_and_in_total() -> None:
    budget = Budget(
        options(
            max_open_requests=3,
            max_open_requests_per_key=2,
            max_bytes_in_flight=1000,
            max_bytes_in_flight_per_key=600,
        )
    )
    a1, a2 = budget.admit("a", 10), budget.admit("a", 10)
    with pytest.raises(Refused) as raised:
        budget.admit("a", 10)
    assert (raised.value.status, raised.value.retry_after_s) == (429, 1)
    b1 = budget.admit("b", 10)
    with pytest.raises(Refused) as raised:
        budget.admit("c", 10)
    assert raised.value.status == 503
    a1.release()
    a3 = budget.admit("a", 10)
    a3.add(580)  # outputs queued for its client count too
    a2.release()
    with pytest.raises(Refused) as raised:
        budget.admit("a", 100)
    assert raised.value.status == 429
    for ticket in (a3, b1):
        ticket.release()
    assert (budget.total.requests, budget.total.bytes, budget.by_key) == (0, 0, {})


# --- API keys ------------------------------------------------------------------------------------


def test_several_api_keys_and_none() -> None:
    keys = ApiKeys(("old", "new"))
    assert keys.identify("Bearer old") == "key-0"
    assert keys.identify("Bearer new") == "key-1"
    for wrong in (None, "", "Bearer ", "Bearer ol", "Bearer old2", "old", "Basic old", "Bearer \udcff"):
        assert keys.identify(wrong) is None
    assert ApiKeys(()).identify(None) == ANONYMOUS


def test_the_gateway_fails_closed_without_a_key() -> None:
    with pytest.raises(ConfigurationError, match="--allow-no-api-key"):
        GatewayOptions()
    assert GatewayOptions(api_keys=("k",)).api_keys == ("k",)
    with pytest.raises(ConfigurationError):
        GatewayOptions(api_keys=("",))


def test_keys_and_baggage_keys_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DERENDER_API_KEY", "one two")
    monkeypatch.setenv("DERENDER_BAGGAGE_KEYS", "tenant")
    settings = GatewayOptions()
    assert (settings.api_keys, settings.baggage_keys) == (("one", "two"), ("tenant",))


# --- trace context at the edge ---------------------------------------------------------------------

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_baggage_is_dropped_unless_allowed_and_capped() -> None:
    baggage = ",".join(f"k{i}=v{i}" for i in range(1000))[:8000]
    assert dict(edge_trace({"baggage": baggage}, options())) == {}
    kept = dict(edge_trace({"baggage": baggage}, options(baggage_keys=("k1", "k7"))))
    assert kept == {"baggage": b"k1=v1,k7=v7"}
    assert allowed_baggage(b"a=1, b=22 ,c=3", ("a", "b", "c"), 8) == b"a=1,b=22"
    assert allowed_baggage(b"a=1", ("a",), 0) == b""


def test_a_clients_sampled_flag_is_cleared_unless_trusted() -> None:
    assert dict(edge_trace({"traceparent": PARENT}, options()))["traceparent"] == PARENT[:-2].encode() + b"00"
    trusted = dict(edge_trace({"traceparent": PARENT}, options(trust_client_sampling=True)))
    assert trusted["traceparent"] == PARENT.encode()
    assert (
        unsampled(b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-03")
        == b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-02"
    )


# --- delivery ----------------------------------------------------------------------------------------


def test_a_mailbox_past_its_bytes_ends_and_gives_everything_back() -> None:
    held: list[int] = []
    overruns: list[bool] = []
    mailbox = Mailbox(100, held.append, lambda: overruns.append(True))
    mailbox.put("r", b"x" * 500)  # one record is always taken, however large
    assert (mailbox.ended, mailbox.queued, overruns) == (None, 500, [])
    mailbox = Mailbox(100, held.append, lambda: overruns.append(True))
    mailbox.put("r", b"y" * 45)
    mailbox.put("r", b"y" * 45)
    assert (mailbox.ended, overruns) == (None, [])
    mailbox.put("r", b"z" * 11)  # past 100 bytes with records waiting
    assert mailbox.ended is not None and mailbox.ended["code"] == 503 and overruns == [True]
    assert sum(held) == 500  # the second mailbox's bytes were handed back to the budget
    mailbox.put("r", b"late")
    assert sum(held) == 500 and mailbox.queued == 0


def _chunk(request_id: str, seq: int, index: int, finish: str | None) -> bytes:
    choice = {"index": index, "text": "t", "logprobs": None, "finish_reason": finish}
    body = {"chunk": {"id": "c", "object": "text_completion", "choices": [choice]}}
    return orjson.dumps({"request_id": request_id, "seq": seq, "endpoint": "completion", "body": body})


def test_thousands_of_prompts_cost_each_record_the_same() -> None:
    """Each record's cost does not grow with the prompt count: the scans over every prompt per record
    (``ids.index``, ``all()``) made a 20k-prompt completion hold the loop for 18 s. Here 4096 prompts
    of two records each: some 67 million steps for those scans, a few thousand dict lookups now."""
    prompts = 4096
    admitted = Admitted("completion", b"{}", True, 1, False, prompts)

    async def run() -> tuple[int, float]:
        mailbox = Mailbox(1 << 30, lambda _: None, lambda: None)
        delivery = Delivery("r", admitted, mailbox, 5.0)
        for sid in delivery.stream_ids:
            for seq in range(2):
                mailbox.put(sid, _chunk(sid, seq, 0, "length" if seq == 1 else None))
        started = time.perf_counter()
        events = [event async for event in delivery.events()]
        assert [e["choices"][0]["index"] for e in events[:4]] == [0, 0, 1, 1]  # prompt i is choice i
        return len(events), time.perf_counter() - started

    count, took = asyncio.run(run())
    assert count == prompts * 2
    assert took < 10.0, f"{took:.2f}s for {count} records"  # well under 1 s on an idle machine


def test_an_error_record_waits_for_the_outputs_before_it() -> None:
    admitted = Admitted("completion", b"{}", True, 1, False, 1)
    error = {
        "request_id": "r",
        "seq": 2,
        "error": {"message": "cut off", "type": "x", "param": None, "code": 502},
    }

    async def run() -> list[dict[str, Any]]:
        mailbox = Mailbox(1 << 20, lambda _: None, lambda: None)
        delivery = Delivery("r", admitted, mailbox, 5.0)
        for value in (_chunk("r", 1, 0, None), orjson.dumps(error), _chunk("r", 0, 0, None)):
            mailbox.put("r", value)
        return [event async for event in delivery.events()]

    events = asyncio.run(run())
    assert [("error" in e) for e in events] == [False, False, True]
    assert events[-1]["error"]["message"] == "cut off"


def test_a_terminal_error_ends_the_stream_whatever_its_seq() -> None:
    """An ingest that took over after a crash writes its error at seq 0, already shown: it was
    dropped as a duplicate and the client waited for the request timeout."""
    admitted = Admitted("completion", b"{}", True, 1, False, 1)
    error = {"request_id": "r", "seq": 0, "terminal": True, "error": {"message": "restarted", "code": 503}}

    async def run() -> list[dict[str, Any]]:
        mailbox = Mailbox(1 << 20, lambda _: None, lambda: None)
        delivery = Delivery("r", admitted, mailbox, 5.0)
        for value in (_chunk("r", 0, 0, None), orjson.dumps(error)):
            mailbox.put("r", value)
        async with asyncio.timeout(2):
            return [event async for event in delivery.events()]

    events = asyncio.run(run())
    assert events[-1] == {"error": error["error"]}


def test_a_client_that_reads_nothing_is_ended_by_the_write_timeout() -> None:
    """A client that stopped reading held its request (and its queued outputs) until the request
    timeout; each write now has its own timeout."""

    async def run() -> tuple[str, float]:
        ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def handler(request: web.Request) -> web.StreamResponse:
            writer = await SseWriter.open(request, 1.0)
            try:
                while True:
                    await writer.data(b"x" * 65536)
            except TimeoutError:
                ended.set_result("timeout")
                raise
            return writer.response

        app = web.Application()
        app.router.add_get("/", handler)
        async with serving_app(app) as port:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # then never reads
            started = time.monotonic()
            async with asyncio.timeout(30):
                outcome = await ended
            took = time.monotonic() - started
            writer.close()
            return outcome, took

    outcome, took = asyncio.run(run())
    assert outcome == "timeout" and took < 15
