"""What the pipeline adds to time to first token and inter-token latency, against the upstream's own.

    ./run bench latency [--concurrency 1 16 128] [--requests-per-stream 2] [--commit-interval-ms N]

Uses ``KAFKA_BOOTSTRAP_SERVERS`` if set, else starts ``deploy/local/kafka``. Starts the fake vLLM (on a
thread of this process; a token every ``--pace-ms`` 20 ms, ``--tokens`` 128 of them, one per chunk),
one ``ingest``, one worker and one ``gateway`` on the broker, then at each concurrency streams the same
chat twice over:

* **upstream**: straight from the fake, as a client of vLLM's render and generate servers would
  (render, then the generate stream), timing the generate stream's events;
* **pipeline**: through the gateway (gateway -> requests topic -> ingest -> fake -> input topic ->
  worker -> output topic -> gateway), timing its SSE chunks.

Both are timed as ``vllm bench serve --backend openai-chat`` times a stream: TTFT from the request's
start to the first chunk that carries output, ITL between consecutive such chunks; a stream's several
tokens in one chunk count as one arrival. "Added per chunk" is, for each pipeline chunk, its arrival
at the client minus the moment the fake wrote its generate event (one clock: both in this process).
Prints medians, p99 and spread (p10-p90) side by side; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import lzma
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.kafka_harness import bootstrap_address  # noqa: E402
from tests.fake_vllm import Recording  # noqa: E402
from tests.kafka_broker import TopicFactory  # noqa: E402
from tests.kafka_helpers import wait_for_http  # noqa: E402
from tests.pipeline_helpers import COMPLETION_CASE, Pipeline, recording  # noqa: E402

PROMPT = "How much latency does the pipeline add?"


def latency_recording(tokens: int) -> Recording:
    """A streamed chat of ``tokens`` ordinary Qwen3 tokens, one per chunk, finishing on the last."""
    one = recording(COMPLETION_CASE)
    words = [t for c in one.chunks[0] for x in c["choices"] for t in x["token_ids"]]
    chunks: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "token_ids": [words[i % len(words)]]}]} for i in range(tokens)
    ]
    chunks[-1]["choices"][0]["finish_reason"] = "length"
    request = {"model": "test-model", "messages": [{"role": "user", "content": PROMPT}], "stream": True}
    return Recording("latency", "chat", request, one.prompt_token_ids, [chunks])


def vllm_bench_recording(tokens: int) -> Recording:
    """The same generation for the request ``vllm bench serve --backend openai-chat`` sends: its
    ``content`` is a list of parts."""
    plain = latency_recording(tokens)
    content = [{"type": "text", "text": PROMPT}]
    request = {**plain.request, "messages": [{"role": "user", "content": content}]}
    return Recording("latency-vllm-bench", "chat", request, plain.prompt_token_ids, plain.chunks)


def vllm_bench_serve(vllm: str, pipeline: Pipeline, concurrency: int, prompts: int, tokens: int) -> str:
    """``vllm bench serve`` against the gateway: its TTFT and ITL (median, p99), or why it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tokenizer"
        model.mkdir()
        qwen3 = REPO / "samples" / "models" / "qwen3"
        (model / "tokenizer.json").write_bytes(lzma.decompress((qwen3 / "tokenizer.json.xz").read_bytes()))
        for name in ("tokenizer_config.json", "config.json"):
            shutil.copy(qwen3 / name, model / name)
        data = Path(tmp) / "prompts.jsonl"
        data.write_text("\n".join(orjson.dumps({"prompt": PROMPT}).decode() for _ in range(prompts)) + "\n")
        command = [
            vllm, "bench", "serve", "--backend", "openai-chat", "--base-url", pipeline.gateway_url,
            "--endpoint", "/v1/chat/completions", "--model", "test-model", "--tokenizer", str(model),
            "--dataset-name", "custom", "--dataset-path", str(data), "--custom-output-len", str(tokens),
            "--skip-chat-template", "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
            "--percentile-metrics", "ttft,itl", "--metric-percentiles", "10,50,90,99",
            "--save-result", "--result-dir", tmp, "--result-filename", "result.json",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
        result = Path(tmp) / "result.json"
        if done.returncode != 0 or not result.exists():
            return f"vllm bench serve failed ({done.returncode}): {(done.stderr or done.stdout)[-600:]}"
        r = orjson.loads(result.read_bytes())
        cells = [
            f"{r[f'p50_{m}_ms']:.0f} | {r[f'p99_{m}_ms']:.0f} | {r[f'p10_{m}_ms']:.0f}-{r[f'p90_{m}_ms']:.0f}"
            for m in ("ttft", "itl")
        ]
        return f"{cells[0]} | {cells[1]} | {r.get('completed')} of {prompts} completed"


@dataclass
class Timing:
    """One stream as its client saw it."""

    started: float
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each chunk with output
    engine_id: str = ""
    failed: str = ""  # the HTTP status or error event that ended it, when it did not finish

    @property
    def ttft_ms(self) -> float:
        return (self.arrivals[0] - self.started) * 1000

    @property
    def itl_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


def _has_output(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content"):
            return True
        if choice.get("token_ids"):  # a generate event
            return True
    return False


async def _read_sse(response: aiohttp.ClientResponse, timing: Timing) -> None:
    async for line in response.content:
        if not line.startswith(b"data: {"):
            continue
        arrived = time.monotonic()
        chunk = orjson.loads(line[6:])
        if "error" in chunk:
            timing.failed = str(chunk["error"].get("code"))
        if not timing.engine_id:
            timing.engine_id = str(chunk.get("id") or chunk.get("request_id") or "")
        if _has_output(chunk):
            timing.arrivals.append(arrived)


async def through_gateway(session: aiohttp.ClientSession, pipeline: Pipeline, body: dict[str, Any]) -> Timing:
    timing = Timing(time.monotonic())
    async with session.post(f"{pipeline.gateway_url}/v1/chat/completions", json=body) as response:
        if response.status != 200:
            timing.failed = str(response.status)
            return timing
        await _read_sse(response, timing)
    return timing


async def straight_upstream(
    session: aiohttp.ClientSession, pipeline: Pipeline, body: dict[str, Any]
) -> Timing:
    timing = Timing(time.monotonic())
    async with session.post(f"{pipeline.fake.url}/v1/chat/completions/render", json=body) as response:
        generate = await response.json()
    async with session.post(f"{pipeline.fake.url}/inference/v1/generate", json=generate) as response:
        assert response.status == 200, await response.text()
        await _read_sse(response, timing)
    return timing


async def run_level(
    one: Callable[[aiohttp.ClientSession], Awaitable[Timing]], streams: int, concurrency: int
) -> list[Timing]:
    gate = asyncio.Semaphore(concurrency)
    limits = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=limits, timeout=aiohttp.ClientTimeout(total=900)) as session:

        async def gated() -> Timing:
            async with gate:
                return await one(session)

        return await asyncio.gather(*(gated() for _ in range(streams)))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float]) -> str:
    """median, p99 and the p10-p90 spread, in ms."""
    if not values:
        return "- | - | -"
    return (
        f"{statistics.median(values):.0f} | {percentile(values, 0.99):.0f} | "
        f"{percentile(values, 0.1):.0f}-{percentile(values, 0.9):.0f}"
    )


def added_per_chunk(pipeline: Pipeline, timings: list[Timing]) -> list[float]:
    out: list[float] = []
    for timing in timings:
        sent = pipeline.fake.sent_at.get(timing.engine_id) or []
        out += [(arrived - at) * 1000 for arrived, at in zip(timing.arrivals, sent, strict=False)]
    return out


async def _main(args: argparse.Namespace) -> None:
    bootstrap = bootstrap_address()
    factory = TopicFactory(bootstrap)
    commits = ("--commit-interval-ms", str(args.commit_interval_ms)) if args.commit_interval_ms else ()
    top = max(args.concurrency)
    pipeline = Pipeline(
        bootstrap,
        factory,
        max_inflight=max(256, top),
        worker_extra=commits,
        extra_recordings=(latency_recording(args.tokens), vllm_bench_recording(args.tokens)),
    )
    try:
        pipeline.start(workers=1, ingest_extra=commits)
        # A stream that waits minutes for its first token at 128 at once is a figure, not a failure.
        pipeline.start_gateway("--request-timeout-s", "600")
        await wait_for_http(f"{pipeline.gateway_url}/healthz", 200, 60, what="(gateway)")
        pipeline.fake.pace_s = args.pace_ms / 1000  # every stream, vllm bench serve's too
        body = latency_recording(args.tokens).request
        await run_level(lambda s: through_gateway(s, pipeline, body), 4, 4)  # joins, first transactions
        interval = f"{args.commit_interval_ms} ms" if args.commit_interval_ms else "their defaults"
        print(
            f"latency: {args.tokens} tokens a stream, one every {args.pace_ms:g} ms; ingest and the worker "
            f"commit at {interval}; {args.requests_per_stream} streams per concurrent client"
        )
        print(
            "| streams at once | path | TTFT p50 | p99 | p10-p90 | ITL p50 | p99 | p10-p90 "
            "| added per chunk p50 | p99 | p10-p90 |"
        )
        print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for concurrency in args.concurrency:
            streams = concurrency * args.requests_per_stream
            upstream = await run_level(lambda s: straight_upstream(s, pipeline, body), streams, concurrency)
            through = await run_level(lambda s: through_gateway(s, pipeline, body), streams, concurrency)
            for name, timings, added in (
                ("upstream", upstream, []),
                ("pipeline", through, added_per_chunk(pipeline, through)),
            ):
                ttft = [t.ttft_ms for t in timings if t.arrivals]
                itl = [gap for t in timings for gap in t.itl_ms]
                failed = [t.failed for t in timings if t.failed]
                label = (
                    f"{name} ({len(failed)} of {len(timings)} failed: {sorted(set(failed))})"
                    if failed
                    else name
                )
                print(f"| {concurrency} | {label} | {summary(ttft)} | {summary(itl)} | {summary(added)} |")
            if args.vllm:
                row = await asyncio.to_thread(
                    vllm_bench_serve, args.vllm, pipeline, concurrency, streams, args.tokens
                )
                print(f"| {concurrency} | pipeline, `vllm bench serve` | {row} |")
    finally:
        pipeline.stop()
        factory.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.latency", description=__doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--requests-per-stream", type=int, default=2, help="streams per concurrent client")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--pace-ms", type=float, default=20.0)
    parser.add_argument(
        "--commit-interval-ms", type=int, default=0, help="of ingest and the worker (0: their defaults)"
    )
    parser.add_argument(
        "--vllm",
        default="",
        help="a `vllm` executable: also time the gateway with `vllm bench serve --backend openai-chat`",
    )
    asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
