"""The fake vLLM's wire format and ingest's client for it, without Kafka."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.fake_vllm import FakeVllm
from tests.pipeline_helpers import FAULTS, ONE_SHOT_CASE, STREAM_CASE, recording, recordings, request_of
from worker.errors import UpstreamError
from worker.pipeline.vllm_client import VllmClient


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVllm]:
    server = FakeVllm(recordings(), faults=dict(FAULTS), api_key="k").start()
    try:
        yield server
    finally:
        server.stop()


T = TypeVar("T")


def run(
    fake: FakeVllm,
    work: Callable[[VllmClient, aiohttp.ClientSession], Awaitable[T]],
    idle_timeout_s: float = 5.0,
) -> T:
    """``work`` with a client of ``fake`` (and the client's HTTP session), run to its result."""

    async def go() -> T:
        async with aiohttp.ClientSession() as session:
            return await work(VllmClient(session, fake.url, fake.url, "k", idle_timeout_s), session)

    return asyncio.run(go())


def test_the_sse_framing_is_vllms(fake: FakeVllm) -> None:
    chat = recording(STREAM_CASE)

    async def raw(client: VllmClient, session: aiohttp.ClientSession) -> bytes:
        (rendered,) = await client.render("chat", request_of(chat), "wire")
        headers = {"Authorization": "Bearer k"}
        async with session.post(
            f"{fake.url}/inference/v1/generate", json=rendered, headers=headers
        ) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            return await response.read()

    body = run(fake, raw)
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    chunks = [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert all(e.startswith(b"data: {") for e in events[:-2])
    assert [c["choices"] for c in chunks] == [
        [{**_choice_defaults(), **choice} for choice in c["choices"]] for c in chat.chunks[0]
    ]
    assert {c["request_id"] for c in chunks} == {"generate-tokens-chatcmpl-wire"}
    assert all(c["output_mode"] == "tokens" for c in chunks)


def _choice_defaults() -> dict[str, Any]:
    keys = ("finish_reason", "stop_reason", "token_ids", "routed_experts", "sampling_mask", "weight_versions")
    return {**dict.fromkeys(keys), "logprobs": None}


def test_the_client_yields_each_chunk_and_stops_at_done(fake: FakeVllm) -> None:
    chat = recording(STREAM_CASE)

    async def chunks(client: VllmClient, _: aiohttp.ClientSession) -> list[dict[str, Any]]:
        (rendered,) = await client.render("chat", request_of(chat), "client")
        return [c async for c in client.generate_stream(rendered)]

    got = run(fake, chunks)
    assert [[x["token_ids"] for x in c["choices"]] for c in got] == [
        [x["token_ids"] for x in c["choices"]] for c in chat.chunks[0]
    ]


@pytest.mark.parametrize(
    ("fault", "code", "where"),
    [
        ("render-400", 400, "render"),
        ("generate-503", 503, "generate"),
        ("error-event", 500, "stream"),
        ("cut", 502, "stream"),
        ("stall", 504, "stream"),
    ],
)
def test_every_failure_is_an_upstream_error_with_vllms_status(
    fake: FakeVllm, fault: str, code: int, where: str
) -> None:
    chat = recording(STREAM_CASE)

    async def go(client: VllmClient, _: aiohttp.ClientSession) -> tuple[str, dict[str, Any]]:
        """The step that failed and its error."""
        step = "render"
        try:
            (rendered,) = await client.render("chat", request_of(chat, user=f"fault:{fault}"), f"f-{fault}")
            step = "generate"
            async for _chunk in client.generate_stream(rendered):
                step = "stream"
        except UpstreamError as exc:
            return step, exc.error
        raise AssertionError(f"fault {fault!r} raised no UpstreamError")

    step, error = run(fake, go, idle_timeout_s=1.0)
    assert step == where
    assert error["code"] == code, error
    assert set(error) == {"message", "type", "param", "code"}


def test_unknown_model_and_missing_key_answer_as_vllm(fake: FakeVllm) -> None:
    async def go(client: VllmClient, session: aiohttp.ClientSession) -> None:
        with pytest.raises(UpstreamError) as raised:
            await client.render("chat", {**request_of(recording(STREAM_CASE)), "model": "nope"}, "m")
        assert raised.value.error["code"] == 404 and raised.value.error["type"] == "NotFoundError"
        async with session.post(f"{fake.url}/v1/chat/completions/render", json={}) as response:
            assert response.status == 401

    run(fake, go)


def test_abort_ends_the_stream_with_abort_chunks(fake: FakeVllm) -> None:
    chat = recording(STREAM_CASE)

    async def go(client: VllmClient, _: aiohttp.ClientSession) -> list[dict[str, Any]]:
        (rendered,) = await client.render("chat", request_of(chat, user="fault:stall"), "abort-me")
        got = []
        async for chunk in client.generate_stream(rendered):
            got.append(chunk)
            if len(got) == 2:  # the stream stalls after two chunks: abort it
                await client.abort([chunk["request_id"]])
        return got

    got = run(fake, go)
    assert got[-1]["choices"] == [
        {**_choice_defaults(), "index": 0, "token_ids": [], "finish_reason": "abort"}
    ]
    assert "generate-tokens-chatcmpl-abort-me" in fake.aborted


def test_a_cancelled_reader_reads_no_further() -> None:
    """A read that completes as the reading task is cancelled must not outlive the cancellation:
    Python 3.11's ``wait_for`` returned such a read and dropped the cancel, so an ingest cut off at
    SIGTERM read on and forwarded the ``abort`` chunk that its own abort made vLLM send."""

    class Content:
        def __init__(self) -> None:
            self.pending: asyncio.Future[bytes] | None = None

        def readany(self) -> asyncio.Future[bytes]:
            self.pending = asyncio.get_running_loop().create_future()
            return self.pending

    class Response:
        content = Content()

    async def body() -> list[bytes]:
        client = VllmClient(aiohttp.ClientSession(), "http://render", "http://generate")
        events: list[bytes] = []

        async def read() -> None:
            async for event in client._events(Response()):  # type: ignore[arg-type]
                events.append(event)

        task = asyncio.create_task(read())
        for _ in range(5):  # a few loop steps: the reader starts and waits on its first read
            await asyncio.sleep(0)
        assert Response.content.pending is not None
        # The data arrives and the task is cancelled before it runs again.
        Response.content.pending.set_result(b"data: {}\n\n")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client._session.close()
        return events

    assert asyncio.run(body()) == []


class _Pieces:
    """A response body that arrives in the given pieces (``readany`` returns one at a time)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = iter(pieces)

    async def readany(self) -> bytes:
        return next(self.pieces, b"")


async def _events_of(pieces: list[bytes]) -> list[bytes]:
    class Response:
        content = _Pieces(pieces)

    async with aiohttp.ClientSession() as session:
        client = VllmClient(session, "http://render", "http://generate")
        return [e async for e in client._events(Response())]  # type: ignore[arg-type]


def test_an_event_boundary_split_inside_a_crlf_pair_is_still_two_events() -> None:
    # "\r\n\r\n" cut after its first "\r": the reader once saw "\r" + "\n\r\n" and merged the events.
    pieces = [b'data: {"a": 1}\r', b'\n\r\ndata: {"b": 2}\r\n\r', b"\n"]
    assert asyncio.run(_events_of(pieces)) == [b'{"a": 1}', b'{"b": 2}']
    assert asyncio.run(_events_of([b"data: x\r\rdata: y\n\n"])) == [b"x", b"y"]  # bare CR ends lines too


def test_a_large_event_in_small_reads_costs_linear_time() -> None:
    """15 MiB in 1 KiB reads: copying the buffer at every read took over 5 minutes; now about a second."""
    payload = b"x" * (15 * 1024 * 1024)
    body = b"data: " + payload + b"\n\n"
    pieces = [body[i : i + 1024] for i in range(0, len(body), 1024)]
    started = time.monotonic()
    events = asyncio.run(_events_of(pieces))
    assert time.monotonic() - started < 20
    assert events == [payload]


def test_an_event_over_the_cap_is_a_502() -> None:
    pieces = [b"data: " + b"x" * (1 << 20)] * 17
    with pytest.raises(UpstreamError) as raised:
        asyncio.run(_events_of(pieces))
    assert raised.value.error["code"] == 502


def test_traceparent_reaches_vllm_on_render_and_generate(fake: FakeVllm) -> None:
    chat = recording(STREAM_CASE)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    trace = (("traceparent", parent.encode()), ("baggage", b"k=v"))

    async def go(client: VllmClient, _: aiohttp.ClientSession) -> None:
        (rendered,) = await client.render("chat", request_of(chat), "traced", trace)
        async for _chunk in client.generate_stream(rendered, trace):
            pass

    fake.traceparents.clear()
    run(fake, go)
    assert fake.traceparents == [
        ("/v1/chat/completions/render", parent),
        ("/inference/v1/generate", parent),
    ]


def test_a_one_shot_answer_over_the_read_cap_is_a_413(fake: FakeVllm) -> None:
    one_shot = recording(ONE_SHOT_CASE)
    request = request_of(one_shot, user="fault:bulk", max_tokens=5000, logprobs=True, top_logprobs=5)

    async def go(_: VllmClient, session: aiohttp.ClientSession) -> dict[str, Any]:
        client = VllmClient(session, fake.url, fake.url, "k", max_response_bytes=1 << 20)
        (rendered,) = await client.render("chat", request, "big")
        with pytest.raises(UpstreamError) as raised:
            await client.generate(rendered)
        return raised.value.error

    assert run(fake, go)["code"] == 413


def test_render_that_never_answers_is_a_504() -> None:
    async def silent(request: web.Request) -> web.Response:
        await asyncio.sleep(3)
        return web.Response()

    async def go() -> dict[str, Any]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions/render", silent)
        app.router.add_post("/inference/v1/generate", silent)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{port}"
                client = VllmClient(session, url, url, render_timeout_s=0.5, headers_timeout_s=0.5)
                with pytest.raises(UpstreamError) as render:
                    await client.render("chat", {}, "slow")
                with pytest.raises(UpstreamError) as headers:
                    async for _chunk in client.generate_stream({"request_id": "slow"}):
                        pass
                return {"render": render.value.error["code"], "headers": headers.value.error["code"]}
        finally:
            await runner.cleanup()

    assert asyncio.run(go()) == {"render": 504, "headers": 504}
