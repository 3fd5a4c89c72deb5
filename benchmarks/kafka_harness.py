"""What the Kafka benchmarks share: the broker address, the workload, the harness's collector
pause and send checks, and topic clean-up (``kafka_throughput`` and ``kafka_scale_out`` use it)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from aiokafka.admin import AIOKafkaAdminClient

REPO = Path(__file__).resolve().parent.parent
MODEL_DIR = REPO / "samples" / "models" / "qwen3"
WORDS = [
    *[
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "tokens",
        "stream",
        "in",
        "order",
    ],
    "日本語",
    "🚀",
    "naïve",
]


def bootstrap_address() -> str:
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if env:
        return env
    out = subprocess.run(
        [str(REPO / "deploy" / "local" / "kafka"), "start"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def collector_held_off() -> Iterator[None]:
    """The harness's own cyclic collector held off while it timestamps sends and arrivals.

    Its heap (the workloads, the send and arrival maps: millions of objects) made a full
    collection stall it, and every chunk sent or read meanwhile was charged with the stall as the
    worker's latency (docs/benchmarks.md, "Kafka, one worker"). What the phase allocates waits for its end;
    the collector is handed back as it was.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def raise_failed_send(futures: list[asyncio.Future[Any]]) -> None:
    """Raise the first failed send among settled ``futures`` (all are, after a flush)."""
    for future in futures:
        future.result()


def make_workload(sequences: int, tokens: int, prefix: str) -> list[tuple[bytes, bytes]]:
    """1-token chunks of ``sequences`` requests, round-robin: all of them open at once."""
    from worker.core.model_dir import load_tokenizer

    tok = load_tokenizer(MODEL_DIR).backend
    ids_per_seq = []
    for i in range(sequences):
        text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(tokens * 2))
        ids_per_seq.append(tok.encode(text).ids[:tokens])
    records = []
    for pos in range(tokens):
        for i, ids in enumerate(ids_per_seq):
            rid = f"{prefix}-{i:05d}"
            endpoint = "chat" if i % 2 == 0 else "completion"
            choice: dict[str, Any] = {"index": 0, "token_ids": [ids[pos]]}
            if pos == tokens - 1:
                choice["finish_reason"] = "length"
            body: dict[str, Any] = {
                "stream": True,
                "generate_chunk": {"request_id": rid, "choices": [choice]},
            }
            if pos == 0:
                body["prompt_tokens"] = 3
                body["prompt_token_ids"] = [1, 2, 3]
                if endpoint == "chat":
                    body["chat_request"] = {
                        "model": "qwen3",
                        "messages": [{"role": "user", "content": "hi"}],
                        "stream": True,
                    }
                else:
                    body["completion_request"] = {"model": "qwen3", "prompt": "hi", "stream": True}
            envelope = {"request_id": rid, "seq": pos, "endpoint": endpoint, "body": body}
            records.append((rid.encode(), orjson.dumps(envelope)))
    return records


async def delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(names)
    except Exception as exc:  # noqa: BLE001 - leftovers only cost disk on a scratch broker
        print(f"  (could not delete {names}: {exc!r})", file=sys.stderr)
    finally:
        await admin.close()
