"""Added latency and throughput of the pipeline: fake generate -> ingest -> worker -> gateway -> SSE out.

    ./run bench pipeline [--requests 64] [--concurrency 16] [--pace-ms 20]

Uses ``KAFKA_BOOTSTRAP_SERVERS`` if set, else starts ``deploy/local/kafka``. Starts the test suite's
fake vLLM (on a thread of this process), one ``ingest``, one worker and one ``gateway``, then streams
the golden reasoning + tool-call chat (22 chunks) through the gateway with ``concurrency`` clients:

* latency: for every chunk, the time from the fake's write of the generate SSE event to the client's
  read of the gateway's SSE event (one clock: both run in this process), with the fake pacing
  chunks ``--pace-ms`` apart so each chunk travels on its own;
* throughput: requests/s through one gateway + one ingest with no pacing.

Prints the figures side by side; asserts nothing. Everything shares this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.kafka_harness import bootstrap_address  # noqa: E402
from tests.fake_vllm import Fault  # noqa: E402
from tests.kafka_broker import TopicFactory  # noqa: E402
from tests.kafka_helpers import wait_for_http  # noqa: E402
from tests.pipeline_helpers import STREAM_CASE, Pipeline, recording, request_of  # noqa: E402


async def stream_one(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> list[tuple[str, float]]:
    """(chunk id, arrival time) of every chunk of one streamed request."""
    arrivals = []
    async with session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        async for line in response.content:
            if line.startswith(b"data: {"):
                arrivals.append((orjson.loads(line[6:])["id"], time.monotonic()))
    return arrivals


async def run_load(
    pipeline: Pipeline, body: dict[str, Any], requests: int, concurrency: int
) -> tuple[float, list[list[tuple[str, float]]]]:
    url = f"{pipeline.gateway_url}/v1/chat/completions"
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def one() -> list[tuple[str, float]]:
            async with gate:
                return await stream_one(session, url, body)

        started = time.monotonic()
        results = await asyncio.gather(*(one() for _ in range(requests)))
        return time.monotonic() - started, results


def latencies(pipeline: Pipeline, results: list[list[tuple[str, float]]]) -> list[float]:
    out = []
    for arrivals in results:
        sent = pipeline.fake.sent_at.get(arrivals[0][0], [])
        out += [(arrived - at) * 1000 for (_, arrived), at in zip(arrivals, sent, strict=False)]
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _main(args: argparse.Namespace) -> None:
    bootstrap = bootstrap_address()
    factory = TopicFactory(bootstrap)
    # The worker commits as often as ingest does (its default, 100 ms, would dominate the figure).
    worker_commit = ("--commit-interval-ms", str(args.commit_interval_ms))
    pipeline = Pipeline(bootstrap, factory, max_inflight=256, worker_extra=worker_commit)
    try:
        pipeline.start(workers=1, gateway=True, ingest_extra=worker_commit)
        await wait_for_http(f"{pipeline.gateway_url}/healthz", 200, 60, what="(gateway)")
        pipeline.fake.faults["paced"] = Fault(pace_s=args.pace_ms / 1000)
        chat = recording(STREAM_CASE)
        await run_load(pipeline, request_of(chat), 4, 4)  # warm-up: joins, first transactions
        _, paced = await run_load(
            pipeline, request_of(chat, user="fault:paced"), args.requests, args.concurrency
        )
        wall, _ = await run_load(pipeline, request_of(chat), args.requests, args.concurrency)
        added = latencies(pipeline, paced)
        chunks = sum(len(r) for r in paced)
        per = chunks // args.requests
        print(f"pipeline: {args.requests} streamed chats x {per} chunks, {args.concurrency} at once, ")
        print(f"ingest and worker committing every {args.commit_interval_ms} ms")
        print("| added latency per chunk (fake generate → gateway SSE) | p50 | p99 | gateway + ingest |")
        print("| --- | ---: | ---: | ---: |")
        print(
            f"| {len(added)} chunks, paced {args.pace_ms} ms | {statistics.median(added):.0f} ms | "
            f"{percentile(added, 0.99):.0f} ms | {args.requests / wall:.1f} requests/s "
            f"({args.requests * chunks / args.requests / wall:.0f} chunks/s) |"
        )
    finally:
        pipeline.stop()
        factory.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.pipeline", description=__doc__)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pace-ms", type=float, default=20.0)
    parser.add_argument("--commit-interval-ms", type=int, default=20, help="of ingest and the worker")
    asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
