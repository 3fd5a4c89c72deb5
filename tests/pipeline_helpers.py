"""The whole pipeline for the tests: fake vLLM, ``ingest``, workers and ``gateway`` on the real broker.

Every process runs the real CLI (so SIGKILL is real); the fake vLLM runs on a thread of the test
process, so tests can look at what it was asked (aborts, concurrent streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.fake_vllm import FakeVllm, Fault, Recording
from tests.golden_cases import GoldenCase, derenderer_for, load_cases, normalize, sample_config
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import (
    TopicReader,
    WorkerGroup,
    WorkerProcess,
    WorkerTopics,
    free_port,
    make_worker_topics,
    wait_for_http,
)
from tests.paths import REPO_ROOT
from tests.stream_builders import written
from worker.assembly import AssembledResponse, Assembler
from worker.core.envelope_processor import EnvelopeProcessor

# One worker configuration serves every recording: Qwen3 with its reasoning parser and hermes tools.
CONFIG = sample_config(parsers=True)
STREAM_CASE = "qwen3+hermes-stream-reasoning-then-tool"
ONE_SHOT_CASE = "qwen3+hermes-nonstream-reasoning-then-tool"
COMPLETION_CASE = "plain-completion-qwen3-length"
N2_CASE = "n2-chat-qwen3"
FAULTS = {
    "render-400": Fault(render_status=400),
    "generate-500": Fault(generate_status=500),
    "generate-503": Fault(generate_status=503),
    "error-event": Fault(error_event_after=3),
    "cut": Fault(cut_after=4),
    "stall": Fault(stall_after=2),
    "slow": Fault(pace_s=0.05),
    "slower": Fault(pace_s=0.15),
    "bulk": Fault(bulk=True),
    "no-finish": Fault(no_finish=True),
    "crawl": Fault(pace_s=2.0),  # under the tests' 5 s idle timeout, 44 s for a whole stream
    "second-prompt-fails": Fault(error_event_after=2, only_prompt=1, pace_s=0.1),
}


@functools.cache
def _cases() -> dict[str, GoldenCase]:
    return {c.id: c for c in load_cases()}


def case(case_id: str) -> GoldenCase:
    return copy.deepcopy(_cases()[case_id])


def recording(case_id: str) -> Recording:
    """The fake vLLM's recording of a golden case: its prompt and generated ids."""
    return Recording.from_envelopes(case_id, case(case_id).input)


def two_prompt_recording(stream: bool = True) -> Recording:
    """A completion with two prompts (vLLM renders one GenerateRequest per prompt)."""
    one = recording(COMPLETION_CASE)
    request = {**one.request, "prompt": ["first prompt", "second prompt"], "stream": stream}
    return Recording("two-prompts", "completion", request, one.prompt_token_ids * 2, one.chunks * 2)


def three_prompt_recording() -> Recording:
    """A streamed completion with three prompts."""
    one = recording(COMPLETION_CASE)
    request = {**one.request, "prompt": ["one", "two", "three"], "stream": True}
    return Recording("three-prompts", "completion", request, one.prompt_token_ids * 3, one.chunks * 3)


def recordings() -> list[Recording]:
    return [recording(c) for c in (STREAM_CASE, ONE_SHOT_CASE, COMPLETION_CASE, N2_CASE)] + [
        two_prompt_recording(),
        two_prompt_recording(stream=False),
        three_prompt_recording(),
    ]


def request_of(recording: Recording, **changes: Any) -> dict[str, Any]:
    """The OpenAI request body a client sends for ``recording``."""
    body = copy.deepcopy(recording.request)
    body.update(changes)
    return body


def reference_outputs(recording: Recording, request: dict[str, Any], prompt: int = 0) -> list[dict[str, Any]]:
    """What the worker must answer: the input envelopes ingest makes, through the core in-process."""
    processor = EnvelopeProcessor(derenderer_for(CONFIG))
    key = "chat_request" if recording.endpoint == "chat" else "completion_request"
    ids = recording.prompt_token_ids[prompt]
    outputs = []
    for seq, chunk in enumerate(recording.chunks[prompt]):
        if not request.get("stream_options", {}).get("include_usage") and not chunk.get("choices"):
            continue
        body: dict[str, Any] = {"stream": True, "generate_chunk": {"request_id": "r", **chunk}}
        if seq == 0:
            body.update(
                model=request.get("model"), prompt_tokens=len(ids), prompt_token_ids=ids, **{key: request}
            )
        envelope = {"request_id": "r", "seq": seq, "endpoint": recording.endpoint, "body": body}
        result = processor.process(orjson.dumps(envelope), b"r")
        assert result.output is not None
        outputs.append(written(result))
    return outputs


def same_answer(got: AssembledResponse, want: AssembledResponse) -> None:
    """The same choices with the same content, reasoning and finish reason (ids and times aside)."""
    assert sorted(got.choices) == sorted(want.choices)
    for index, choice in want.choices.items():
        mine = got.choices[index]
        assert (mine.content, mine.reasoning, mine.finish_reason) == (
            choice.content,
            choice.reasoning,
            choice.finish_reason,
        )


def assemble(outputs: Sequence[dict[str, Any]]) -> AssembledResponse:
    assembler = Assembler()
    response = None
    for output in outputs:
        response = assembler.add({**output, "request_id": "r"})
    assert response is not None
    return response


def comparable(outputs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Outputs without what differs by run: request and chunk ids, ``created``, random tool-call ids."""
    stripped = []
    for output in outputs:
        o = {k: v for k, v in output.items() if k not in ("source", "request_id")}
        body = o.get("body")
        if isinstance(body, dict):
            body = dict(body)
            if isinstance(body.get("chunk"), dict):
                body["chunk"] = {**body["chunk"], "id": "-"}
            elif "id" in body:
                body["id"] = "-"
            o["body"] = body
        stripped.append(o)
    return normalize(stripped)


@dataclass
class Pipeline:
    """Topics, fake vLLM, ingest, workers and (optionally) a gateway, with helpers to drive them."""

    bootstrap: str
    factory: TopicFactory
    partitions: int = 3
    max_inflight: int = 4
    ingest_client: str = "confluent"  # ingest's --kafka-client
    worker_extra: tuple[str, ...] = ()
    extra_recordings: tuple[Recording, ...] = ()  # served too (one with the same request replaces its own)
    topics: WorkerTopics = field(init=False)
    requests_topic: str = field(init=False)
    fake: FakeVllm = field(init=False)
    workers: WorkerGroup = field(init=False)
    ingests: list[WorkerProcess] = field(default_factory=list)
    gateway: WorkerProcess | None = None
    gateway_port: int = 0

    def start(self, workers: int = 1, gateway: bool = False, ingest_extra: Sequence[str] = ()) -> Pipeline:
        self.topics = make_worker_topics(self.factory, self.partitions)
        self.requests_topic = self.factory("openai-requests", self.partitions)
        self.fake = FakeVllm([*recordings(), *self.extra_recordings], faults=dict(FAULTS)).start()
        self.workers = WorkerGroup(self.bootstrap, self.topics, CONFIG, extra=self.worker_extra)
        for _ in range(workers):
            self.workers.start()
        self.start_ingest(*ingest_extra)
        if gateway:
            self.start_gateway()
        return self

    def _command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "worker.cli", *args, "--bootstrap-servers", self.bootstrap]

    def start_ingest(self, *extra: str) -> WorkerProcess:
        name = f"ingest-{len(self.ingests)}"
        command = self._command(
            "ingest",
            "--requests-topic",
            self.requests_topic,
            "--input-topic",
            self.topics.input,
            "--output-topic",
            self.topics.output,
            "--group-id",
            f"ingest-{self.requests_topic}",
            "--render-url",
            self.fake.url,
            "--max-inflight",
            str(self.max_inflight),
            "--session-timeout-ms",
            "6000",
            "--stream-idle-timeout-s",
            "5",
            "--abort-grace-s",
            "3",
            "--client-id",
            name,
            "--kafka-client",
            self.ingest_client,
            *extra,
        )
        process = WorkerProcess(name, command, self.workers.log_dir / f"{name}.log").start()
        self.ingests.append(process)
        return process

    def start_gateway(self, *extra: str) -> WorkerProcess:
        self.gateway_port = free_port()
        command = self._command(
            "gateway",
            "--requests-topic",
            self.requests_topic,
            "--output-topic",
            self.topics.output,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.gateway_port),
            "--served-model-name",
            "test-model",
            "--request-timeout-s",
            "30",
            "--allow-no-api-key",
            # The replicas of this pipeline share its output partitions; other tests' gateways, in
            # this session or in parallel ones, must not join their group (each join rebalances all).
            "--reply-group-id",
            f"gateway-{self.topics.output}",
            *extra,
        )
        self.gateway = WorkerProcess("gateway", command, self.workers.log_dir / "gateway.log").start()
        return self.gateway

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def logs(self) -> str:
        parts = [self.workers.logs(), *(p.log_tail() for p in self.ingests)]
        if self.gateway is not None:
            parts.append(self.gateway.log_tail())
        return "\n".join(parts)

    @contextlib.contextmanager
    def serving(self) -> Iterator[Pipeline]:
        """The started pipeline once its gateway answers ``/healthz``; stopped, its topics deleted, after."""
        try:
            asyncio.run(wait_for_http(f"{self.gateway_url}/healthz", 200, 60, what="(gateway)"))
            yield self
        finally:
            self.stop()
            self.factory.cleanup()

    def stop(self) -> None:
        for process in [*self.ingests, *([self.gateway] if self.gateway else [])]:
            if process.alive:
                process.terminate()
        self.workers.kill_all()
        self.fake.stop()

    async def send(self, records: Sequence[dict[str, Any]]) -> None:
        from tests.kafka_helpers import produce

        await produce(
            self.bootstrap,
            self.requests_topic,
            [(r["request_id"].encode(), orjson.dumps(r)) for r in records],
        )

    async def wait_for_count(self, reader: TopicReader, request_ids: Sequence[str], count: int) -> None:
        """Until ``count`` output records of ``request_ids`` arrived."""
        wanted = {rid.encode() for rid in request_ids}
        deadline = time.monotonic() + 60
        while sum(1 for r in reader.records if r.key in wanted) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"fewer than {count} outputs arrived within 60s\n{self.logs()}")
            await asyncio.sleep(0.05)

    async def outputs(
        self, reader: TopicReader, request_ids: Sequence[str], timeout: float = 60.0
    ) -> dict[str, list[dict[str, Any]]]:
        """Each request's output records once it ended (all choices finished, or an error)."""
        deadline = time.monotonic() + timeout
        while True:
            grouped: dict[str, list[dict[str, Any]]] = {rid: [] for rid in request_ids}
            for record in reader.records:
                rid = record.key.decode()
                if rid in grouped:
                    grouped[rid].append(orjson.loads(record.value))
            if all(ended(outputs) for outputs in grouped.values()):
                return grouped
            if time.monotonic() > deadline:
                waiting = [rid for rid, outputs in grouped.items() if not ended(outputs)]
                raise AssertionError(f"requests {waiting} did not end within {timeout:.0f}s\n{self.logs()}")
            await asyncio.sleep(0.1)


def ended(outputs: Sequence[dict[str, Any]]) -> bool:
    """The request's last record arrived: an error, a one-shot body, or every choice finished."""
    if not outputs:
        return False
    seqs = {o["seq"] for o in outputs if o.get("error") is None}
    for o in outputs:  # ingest's error record with seq k comes after the worker's outputs 0..k-1
        if o.get("error") is not None and all(s in seqs for s in range(o["seq"])):
            return True
    if any(o.get("body") and "chunk" not in o["body"] for o in outputs):
        return True
    finished: dict[int, bool] = {}
    for o in outputs:
        if o.get("error") is not None:
            continue
        for choice in o["body"]["chunk"]["choices"]:
            finished[choice["index"]] = (
                finished.get(choice["index"], False) or choice["finish_reason"] is not None
            )
    return bool(finished) and all(finished.values())


def new_id(prefix: str = "req") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def cli(bootstrap: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """``derender-worker ARGS`` (``produce``, ``consume``, ...) against ``bootstrap``, output captured."""
    command = [sys.executable, "-m", "worker.cli", *args, "--bootstrap-servers", bootstrap]
    return subprocess.run(command, cwd=REPO_ROOT, input=stdin, capture_output=True, timeout=60, check=False)
