"""A memory flood against the caps shipped in ``deploy/kubernetes/``: peak RSS vs the pod limit.

One worker owning every partition (the worst case: a group of one), with the ConfigMap's caps
(``DERENDER_MAX_STATE_BYTES``, ``DERENDER_MAX_OPEN_REQUESTS``, ``DERENDER_MAX_LIVE_PARSERS``) and
parsers (Qwen3: reasoning ``qwen3``, tools ``hermes``), as the ConfigMap configures them, in-process
(owned partitions, the worker's budget and parser pool; outputs are discarded instead of sent).

* phase 1, **max-size prompts**: requests whose first record carries ``max_model_len`` prompt ids,
  opened until the state-bytes cap refuses them, each kept going with a few more records;
* phase 2, **open requests up to the cap**: small chat requests with parsers on, until the
  open-request cap refuses them; every one keeps a live parser as long as the pool allows.

Prints, per phase, the requests open, the accounted bytes against the cap, the live parsers and
the process's peak RSS against the pod limit. The Kafka clients (one consumer, one producer per
partition) add their buffers on top; their size is printed from ``delivery``'s settings.
"""

from __future__ import annotations

import asyncio
import random
import re
import resource
import time
from pathlib import Path
from typing import Any

import orjson
from aiokafka import TopicPartition

from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.live_parsers import LiveParserPool
from worker.core.vllm_version import VllmVersion
from worker.runtime.composition import load_derenderer
from worker.runtime.delivery import PRODUCER_BATCH_BYTES
from worker.runtime.kafka_client.base import OutgoingRecord
from worker.runtime.memory import MemoryBudget
from worker.runtime.observability.metrics import Metrics
from worker.runtime.partition import OwnedPartition
from worker.runtime.state.changelog import StateChangelog, StateKeys
from worker.runtime.topics import TopicNames
from worker.settings import ModelSettings

ROOT = Path(__file__).resolve().parent.parent
CONFIGMAP = ROOT / "deploy" / "kubernetes" / "configmap.yaml"
DEPLOYMENT = ROOT / "deploy" / "kubernetes" / "deployment.yaml"
PARTITIONS = 12
MIB = 1024 * 1024


def _configmap() -> dict[str, str]:
    return dict(re.findall(r'^\s+(DERENDER_\w+):\s*"([^"]*)"', CONFIGMAP.read_text(), re.M))


def _pod_limit() -> int:
    text = DEPLOYMENT.read_text()
    worker = text[text.index("name: worker") :]
    value = re.search(r"limits:\s*\n(?:\s+\w+:.*\n)*?\s+memory:\s*(\d+)(Mi|Gi)", worker)
    assert value is not None, "no memory limit for the worker container"
    return int(value.group(1)) * (MIB if value.group(2) == "Mi" else 1024 * MIB)


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


class _NullSink:
    async def start(self) -> None:
        pass

    async def send(self, record: OutgoingRecord) -> None:
        self.last = record

    async def commit(self, state_records: Any, offsets: Any) -> None:
        pass

    async def abort(self) -> None:
        pass

    async def close(self) -> None:
        pass


class _Record:
    def __init__(self, partition: int, offset: int, rid: str, value: bytes) -> None:
        self.topic, self.partition, self.offset = "in", partition, offset
        self.key, self.value = rid.encode(), value
        self.headers: list[Any] = []
        self.timestamp = int(time.time() * 1000)


def _records(rid: str, rng: random.Random, prompt: int, records: int) -> list[bytes]:
    out = []
    for seq in range(records):
        body: dict[str, Any] = {
            "stream": True,
            "generate_chunk": {
                "request_id": rid,
                "choices": [{"index": 0, "token_ids": [rng.randrange(300, 150_000) for _ in range(4)]}],
            },
        }
        if seq == 0:
            body["prompt_token_ids"] = [rng.randrange(300, 150_000) for _ in range(prompt)]
            body["prompt_tokens"] = prompt
            body["chat_request"] = {
                "model": "qwen3",
                "messages": [{"role": "user", "content": "hello " * 20}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            }
        out.append(orjson.dumps({"request_id": rid, "seq": seq, "endpoint": "chat", "body": body}))
    return out


class Flood:
    def __init__(self, config: dict[str, str]) -> None:
        settings = ModelSettings(
            vllm_version=VllmVersion.V0_34,
            tokenizer=str(ROOT / "samples" / "models" / "qwen3"),
            served_model_names=(config.get("DERENDER_SERVED_MODEL_NAME", "qwen3"),),
            reasoning_parser=config.get("DERENDER_REASONING_PARSER"),
            tool_parser=config.get("DERENDER_TOOL_PARSER"),
            enable_auto_tool_choice=config.get("DERENDER_ENABLE_AUTO_TOOL_CHOICE") == "true",
        )
        derenderer = load_derenderer(settings)
        self.max_model_len = derenderer.options.max_model_len
        self.budget = MemoryBudget(
            int(config["DERENDER_MAX_OPEN_REQUESTS"]), int(config["DERENDER_MAX_STATE_BYTES"])
        )
        self.pool = LiveParserPool(int(config["DERENDER_MAX_LIVE_PARSERS"]))
        topics = TopicNames("in", "out", "state", "dlq")
        self.tasks = [
            OwnedPartition(
                TopicPartition("in", p),
                EnvelopeProcessor(derenderer, live_parsers=self.pool, admission=self.budget),
                _NullSink(),
                topics,
                Metrics(),
                position=0,
                changelog=StateChangelog(topics.state, p, StateKeys("bench-flood")),
                budget=self.budget,
            )
            for p in range(PARTITIONS)
        ]
        self.offsets = [0] * PARTITIONS
        self.refused = 0

    async def request(self, i: int, prompt: int, records: int) -> None:
        p = i % PARTITIONS
        task = self.tasks[p]
        for value in _records(f"flood-{prompt}-{i}", random.Random(i), prompt, records):
            await task.handle(_Record(p, self.offsets[p], f"flood-{prompt}-{i}", value))
            self.offsets[p] += 1
            last = getattr(task.sink, "last", None)
            if last is not None and b'"code":503' in (last.value or b""):
                self.refused += 1
                return

    async def until_refused(self, prompt: int, records: int, limit: int) -> None:
        i = 0
        self.refused = 0
        while self.refused < 20 and i < limit:
            await self.request(i, prompt, records)
            i += 1

    def report(self, phase: str, pod: int) -> None:
        open_requests = sum(len(t.processor.requests) for t in self.tasks)
        rss = _rss()
        print(
            f"{phase:<34} {open_requests:>8} {self.budget.state_bytes / MIB:>9.0f} "
            f"{self.budget.max_state_bytes / MIB:>6.0f} {len(self.pool):>7} {rss / MIB:>9.0f} "
            f"{pod / MIB:>6.0f} {100 * (1 - rss / pod):>8.0f}%"
        )


def main(argv: list[str]) -> None:
    config = _configmap()
    pod = _pod_limit()
    print(
        f"flood: deploy/kubernetes caps: --max-state-bytes {config['DERENDER_MAX_STATE_BYTES']}, "
        f"--max-open-requests {config['DERENDER_MAX_OPEN_REQUESTS']}, "
        f"--max-live-parsers {config['DERENDER_MAX_LIVE_PARSERS']}; {PARTITIONS} partitions on one worker"
    )
    flood = Flood(config)
    print(f"after loading the tokenizer: peak RSS {_rss() / MIB:.0f} MiB")
    print(
        f"{'phase':<34} {'open':>8} {'acct MiB':>9} {'cap':>6} {'parsers':>7} "
        f"{'RSS MiB':>9} {'pod':>6} {'headroom':>9}"
    )
    asyncio.run(flood.until_refused(flood.max_model_len - 64, 3, 100_000))
    flood.report(f"max-size prompts ({flood.max_model_len - 64} ids)", pod)
    for task in flood.tasks:  # the big ones end (as at their TTL); the small flood starts from empty
        asyncio.run(task.expire(-1.0))
    asyncio.run(flood.until_refused(200, 3, 200_000))
    flood.report("open requests up to the cap", pod)
    kafka = (PARTITIONS + 1) * PRODUCER_BATCH_BYTES * 2
    print(f"plus Kafka client buffers: about {kafka / MIB:.0f} MiB ({PARTITIONS} producers and a consumer)")
