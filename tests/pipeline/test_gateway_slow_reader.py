"""A streaming client that stops reading, through the whole pipeline on the real broker.

A real socket with a small receive buffer asks for a long stream and then reads nothing. The gateway
must not hold that stream's output for it: its mailbox is capped (``--max-queued-bytes``, 4 MiB), so the
request ends (a cancel on the requests topic, the generation aborted upstream) long before the write
timeout, the gateway's memory stays flat, and a client beside it is served as usual.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from openai import AsyncOpenAI

from tests.fake_vllm import Fault, Recording
from tests.kafka_broker import TopicFactory, run_sync
from tests.kafka_helpers import TopicReader, WorkerProcess
from tests.pipeline_helpers import (
    COMPLETION_CASE,
    STREAM_CASE,
    Pipeline,
    assemble,
    case,
    recording,
    request_of,
)

pytestmark = pytest.mark.kafka

LONG_CHUNKS = 4_000
TOKENS_PER_CHUNK = 100
# A Qwen3 token of 113 characters (a space and dashes): ~11 KB of text per output record, ~45 MB in
# all, past the cap and the socket buffers within seconds at little derender cost per byte.
WIDE_TOKEN = 66207
WRITE_TIMEOUT_S = 90  # past the test's window: only the mailbox cap may end the request
SILENT_S = 30  # the client reads nothing for this long at least, and until its request was cancelled
CANCEL_WITHIN_S = 60  # on this shared 2-core machine the pipeline moves ~1 MB/s: ~20 s to the cap


def long_recording() -> Recording:
    """A completion of LONG_CHUNKS chunks of wide tokens, the last one finishing it."""
    one = recording(COMPLETION_CASE)
    ids = [WIDE_TOKEN] * TOKENS_PER_CHUNK
    chunks: list[dict[str, Any]] = [{"choices": [{"index": 0, "token_ids": ids}]} for _ in range(LONG_CHUNKS)]
    chunks[-1] = {"choices": [{"index": 0, "token_ids": ids, "finish_reason": "length"}]}
    request = {"model": "test-model", "prompt": "a long stream", "stream": True}
    return Recording("long-stream", "completion", request, one.prompt_token_ids, [chunks])


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap: str) -> Iterator[Pipeline]:
    factory = TopicFactory(kafka_bootstrap)
    pipeline = Pipeline(kafka_bootstrap, factory, max_inflight=8, extra_recordings=(long_recording(),))
    pipeline.start(workers=1)
    # ~5 ms a chunk: the generation is still running (30 s of it) when the cap ends the request.
    pipeline.fake.faults["long"] = Fault(pace_s=0.005)
    # The default --max-queued-bytes (4 MiB): a smaller cap can be overrun by one commit's burst of
    # records before the first chunk is written, which answers a 503 instead of a stream.
    pipeline.start_gateway("--write-timeout-s", str(WRITE_TIMEOUT_S))
    with pipeline.serving() as ready:
        yield ready


def rss_bytes(process: WorkerProcess) -> int:
    assert process.proc is not None
    with open(f"/proc/{process.proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def silent_client(port: int, body: bytes) -> socket.socket:
    """A connection that sent its request and will read nothing: a 4 KiB receive buffer, set before
    connecting so the window it offers stays small."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def read_all(sock: socket.socket, limit_s: float) -> bytes:
    sock.settimeout(limit_s)
    parts = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        part = sock.recv(1 << 16)
        if not part:
            break
        parts.append(part)
        if b"data: [DONE]" in b"".join(parts[-2:]):
            break
    return b"".join(parts)


def test_a_client_that_stops_reading_a_long_stream_is_ended_and_bounded(pipeline: Pipeline) -> None:
    assert pipeline.gateway is not None
    gateway = pipeline.gateway
    marker = int(time.time() * 1000)  # a seed: ignored by the fake, it names the request on the topic
    body = orjson.dumps({**long_recording().request, "user": "fault:long", "seed": marker})
    before = rss_bytes(gateway)

    async def go() -> tuple[str, float, int, list[Any], float]:
        requests = await TopicReader(pipeline.bootstrap, pipeline.requests_topic).start()
        try:
            sock = await asyncio.to_thread(silent_client, pipeline.gateway_port, body)
            started = time.monotonic()
            request_id = ""
            cancelled_after = -1.0
            peak = before
            # Another client, served while the silent one is stuck: the whole golden stream.
            sdk = AsyncOpenAI(base_url=f"{pipeline.gateway_url}/v1", api_key="x", max_retries=0, timeout=60)
            other = asyncio.create_task(sdk.chat.completions.create(**request_of(recording(STREAM_CASE))))
            while (elapsed := time.monotonic() - started) < SILENT_S or (
                cancelled_after < 0 and elapsed < CANCEL_WITHIN_S
            ):
                peak = max(peak, rss_bytes(gateway))
                for record in requests.records:
                    value = orjson.loads(record.value)
                    if value.get("request", {}).get("seed") == marker:
                        request_id = value["request_id"]
                    elif cancelled_after < 0 and value == {"request_id": request_id, "cancel": True}:
                        cancelled_after = time.monotonic() - started
                await asyncio.sleep(0.2)
            chunks = [c async for c in await other]
            # The client reads again, late: what was buffered, then the error event, then [DONE].
            read_started = time.monotonic()
            text = await asyncio.to_thread(read_all, sock, 20)
            read_took = time.monotonic() - read_started
            sock.close()
            return request_id, cancelled_after, peak, [(c, text) for c in chunks], read_took
        finally:
            await requests.stop()

    request_id, cancelled_after, peak, pairs, read_took = run_sync(go())
    assert request_id, "the silent client's request never reached the requests topic"
    assert 0 <= cancelled_after < CANCEL_WITHIN_S, (
        f"no cancel within {CANCEL_WITHIN_S} s (a write timeout of {WRITE_TIMEOUT_S} s); chunks generated: "
        f"{len(pipeline.fake.sent_at.get(f'generate-tokens-cmpl-{request_id}', []))}\n{pipeline.logs()}"
    )
    assert f"generate-tokens-cmpl-{request_id}" in pipeline.fake.aborted, pipeline.logs()
    assert peak - before < 48 << 20, f"the gateway grew by {(peak - before) >> 20} MiB"

    chunks = [c for c, _ in pairs]
    text = pairs[0][1].decode(errors="replace")
    got = assemble(
        [{"seq": i, "endpoint": "chat", "body": {"chunk": c.model_dump()}} for i, c in enumerate(chunks)]
    )
    want = assemble(case(STREAM_CASE).expected)
    assert [(c.content, c.reasoning, c.finish_reason) for c in got.choices.values()] == [
        (c.content, c.reasoning, c.finish_reason) for c in want.choices.values()
    ]

    assert text.startswith("HTTP/1.1 200"), text[:200]
    assert '"finish_reason":"length"' not in text, "the whole stream was held for the silent client"
    events = [line for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and '"error"' in events[-2], events[-2:]
    assert '"code":503' in events[-2], events[-2]
    assert read_took < 20
