"""``derender-worker demo --pipeline``: the whole pipeline, with a real OpenAI client at the front.

A local fake vLLM (render + generate, serving the recorded Qwen3 streams of the Kafka demo),
``ingest``, two workers and ``gateway`` on a local Kafka; then the ``openai`` SDK streams a reasoning
answer and a tool call through the gateway, printed as they arrive. Everything it started is
stopped at the end, and its topics are deleted.

The fake vLLM is a test double, ``tests/fake_vllm.py`` of the source tree, not part of the
installed package (docs/decisions/0025-demo-packaging.md), and its client is the ``openai`` SDK, a
dev dependency: this demo runs from a source tree (``./run demo --pipeline``), and says so elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import orjson

from worker.demo_setup import (
    DEMO_MODEL_DIR,
    DEMO_STREAM,
    SOURCE_TREE,
    delete_topics,
    exit_code,
    given_bootstrap,
    in_source_tree,
    start_local_broker,
    wait_for_broker,
    worker_model_args,
)
from worker.demo_view import make_view
from worker.errors import DemoError
from worker.pipeline.connection import Connection
from worker.runtime.security.kafka_security import KafkaSecurity
from worker.settings import DemoOptions

if TYPE_CHECKING:
    from tests.fake_vllm import Recording

PARTITIONS = 4
PACE_S = 0.03
SERVED_MODEL = "qwen3-demo"
SHOWN = ("demo-reasoning", "demo-tool")  # the recorded requests the client sends
_COLOUR = sys.stdout.isatty()
DIM, BOLD, RESET = ("\033[2m", "\033[1m", "\033[0m") if _COLOUR else ("", "", "")


def fake_vllm() -> ModuleType:
    """The source tree's fake vLLM (``tests/fake_vllm.py``), imported from there; a ``DemoError``
    saying what to do when the package is not run from a source tree."""
    path = SOURCE_TREE / "tests" / "fake_vllm.py"
    if not (in_source_tree() and path.is_file()):
        raise DemoError(
            "demo --pipeline serves its requests from a fake vLLM, a test double that is not "
            "installed with the package: run it from a clone of the repository (`./run demo "
            "--pipeline`, or `pip install -e '.[dev]'` there). `derender-worker demo` and "
            "`demo --offline` run from the installed package."
        )
    if str(SOURCE_TREE) not in sys.path:
        sys.path.insert(0, str(SOURCE_TREE))
    module = importlib.import_module("tests.fake_vllm")
    if Path(module.__file__ or "").resolve() != path:
        raise DemoError(f"`tests.fake_vllm` was imported from {module.__file__}, not from {path}")
    return module


def recordings(stream: Path) -> list[Recording]:
    """One recording per request of a file of input envelopes (lines that are not envelopes skipped)."""
    recording = fake_vllm().Recording
    by_request: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in stream.read_bytes().splitlines():
        with contextlib.suppress(orjson.JSONDecodeError):
            value = orjson.loads(line)
            if isinstance(value, dict) and isinstance(value.get("body"), dict) and "seq" in value:
                by_request[value["request_id"]].append(value)
    return [
        recording.from_envelopes(rid, sorted(envelopes, key=lambda e: e["seq"]))
        for rid, envelopes in by_request.items()
    ]


class Processes:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.running: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str]) -> None:
        with open(self.log_dir / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.running.append((name, proc))
        print(f"  started {name} (pid {proc.pid})")

    def check(self) -> None:
        for name, proc in self.running:
            if proc.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
                raise DemoError(f"{name} exited with {proc.returncode}:\n" + "\n".join(tail))

    def stop(self) -> None:
        for _, proc in reversed(self.running):
            if proc.poll() is None:
                proc.terminate()
        for _, proc in self.running:
            try:
                proc.wait(45)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_gateway(url: str, processes: Processes) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + 90
    while True:
        processes.check()
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
            urllib.request.urlopen(f"{url}/healthz", timeout=2) as response,
        ):
            if response.status == 200:
                return
        if time.monotonic() > deadline:
            raise DemoError("the gateway did not become healthy within 90 s")
        time.sleep(0.2)


def _chat(base_url: str, request: dict[str, Any]) -> int:
    """Stream one chat through the gateway with the openai SDK, printing it as it arrives."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="demo", max_retries=0, timeout=60)
    question = request["messages"][-1]["content"]
    print(f"\n{BOLD}user:{RESET} {question}\n{BOLD}assistant:{RESET} ", end="", flush=True)
    body = {k: v for k, v in request.items() if k != "stream"}
    chunks = 0
    in_reasoning = False
    for chunk in client.chat.completions.create(**body, stream=True):
        chunks += 1
        for choice in chunk.choices:
            delta = choice.delta
            reasoning = (delta.model_extra or {}).get("reasoning")
            if reasoning:
                if not in_reasoning:
                    print(f"{DIM}[reasoning] ", end="")
                    in_reasoning = True
                print(reasoning, end="", flush=True)
            if delta.content:
                if in_reasoning:
                    print(f"{RESET}\n", end="")
                    in_reasoning = False
                print(delta.content, end="", flush=True)
            for call in delta.tool_calls or ():
                if call.function and call.function.name:
                    print(f"{RESET}\n[tool call] {call.function.name}(", end="", flush=True)
                    in_reasoning = False
                if call.function and call.function.arguments:
                    print(call.function.arguments, end="", flush=True)
            if choice.finish_reason:
                print(
                    f"{RESET}{')' if choice.finish_reason == 'tool_calls' else ''}  [{choice.finish_reason}]"
                )
    return chunks


def _responses(base_url: str, request: dict[str, Any]) -> None:
    """The same question through the Responses API (openai SDK), its events summed up as they arrive."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="demo", max_retries=0, timeout=60)
    question = request["messages"][-1]["content"]
    print(f"\n{BOLD}responses API:{RESET} {question}")
    for event in client.responses.create(model=request["model"], input=question, stream=True):
        if event.type == "response.output_text.done":
            print(f"  {event.type}: {event.text.strip()}")
        elif event.type.endswith(".done") or event.type in ("response.created", "response.completed"):
            print(f"  {event.type}")


def _messages(base_url: str, request: dict[str, Any]) -> None:
    """The tool-call question through the Anthropic Messages API (anthropic SDK), its final message."""
    try:
        import anthropic
    except ImportError:
        print("\nmessages API: the anthropic SDK is not installed; not shown")
        return
    client = anthropic.Anthropic(base_url=base_url, api_key="demo", max_retries=0, timeout=60)
    tools: Any = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in request["tools"]
    ]
    question = request["messages"][-1]["content"]
    print(f"\n{BOLD}messages API:{RESET} {question}")
    with client.messages.stream(
        model=request["model"], max_tokens=1024, tools=tools, messages=[{"role": "user", "content": question}]
    ) as stream:
        message = stream.get_final_message()
    for block in message.content:
        if block.type == "tool_use":
            print(f"  tool_use {block.name}({orjson.dumps(block.input).decode()})")
        else:
            print(f"  {block.type}")
    print(f"  stop_reason: {message.stop_reason}")


def _background(base_url: str, request: dict[str, Any]) -> None:
    """The same question as a background response: queued at once, retrieved until it has ended."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="demo", max_retries=0, timeout=60)
    question = request["messages"][-1]["content"]
    print(f"\n{BOLD}responses API, background:{RESET} {question}")
    response = client.responses.create(model=request["model"], input=question, background=True)
    print(f"  created: {response.status}")
    deadline = time.monotonic() + 120
    while response.status in ("queued", "in_progress"):
        if time.monotonic() > deadline:
            raise DemoError(f"background response {response.id} still {response.status} after 120 s")
        time.sleep(0.2)
        response = client.responses.retrieve(response.id)
    print(f"  retrieved: {response.status}: {response.output_text.strip()[:80]}")


def _batch(base_url: str, requests: list[dict[str, Any]]) -> None:
    """The chat requests as one Batch: a JSON Lines file uploaded, the batch run, its output read."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="demo", max_retries=0, timeout=60)
    one_shot = [{k: v for k, v in r.items() if k not in ("stream", "stream_options")} for r in requests]
    lines = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i, body in enumerate(one_shot)
    ]
    upload = client.files.create(file=("demo.jsonl", b"\n".join(map(orjson.dumps, lines))), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    print(f"\n{BOLD}batch API:{RESET} {len(lines)} lines, {batch.status}")
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        if time.monotonic() > deadline:
            raise DemoError(f"batch {batch.id} still {batch.status} after 120 s")
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    if batch.output_file_id is None:
        errors = client.files.content(batch.error_file_id).text[:500] if batch.error_file_id else ""
        raise DemoError(f"batch {batch.id} ended {batch.status} with no output file: {errors}")
    rows = [orjson.loads(line) for line in client.files.content(batch.output_file_id).content.splitlines()]
    for row in rows:
        choice = row["response"]["body"]["choices"][0]
        print(f"  {row['custom_id']}: {row['response']['status_code']} [{choice['finish_reason']}]")
    print(f"  batch {batch.status}: {len(rows)} of {len(lines)} lines answered")


def run_pipeline_demo(args: DemoOptions) -> int:

    def run() -> int:
        with tempfile.TemporaryDirectory(prefix="derender-pipeline-demo-") as tmp:
            return _demo(args, Path(tmp))

    return exit_code(run)


def _demo(args: DemoOptions, tmp: Path) -> int:
    stream = Path(args.stream) if args.stream else DEMO_STREAM
    model_dir = args.tokenizer or str(DEMO_MODEL_DIR)
    served = recordings(stream)
    requests = [r.request for r in served if r.name in SHOWN and r.endpoint == "chat"]
    if not requests:
        raise DemoError(f"{stream} has none of the requests {SHOWN}")
    prefix = f"derender-pipeline-demo-{uuid.uuid4().hex[:8]}"
    topics = {
        name: f"{prefix}-{name}"
        for name in (
            "openai-requests",
            "requests",
            "responses",
            "state",
            "dlq",
            "stored-responses",
            "batches",
        )
    }
    cli = [sys.executable, "-m", "worker.cli"]
    started = time.monotonic()
    with contextlib.ExitStack() as cleanup:
        given = given_bootstrap(args)
        bootstrap = given[0] if given else start_local_broker(make_view(), cleanup, tmp)
        wait_for_broker(bootstrap, given[1] if given else "deploy/local/kafka")
        print(f"pipeline demo: Kafka at {bootstrap}")
        kafka = ["--bootstrap-servers", bootstrap]
        worker_topics = [
            *("--input-topic", topics["requests"], "--output-topic", topics["responses"]),
            *("--state-topic", topics["state"], "--dlq-topic", topics["dlq"]),
        ]
        cleanup.callback(
            lambda: asyncio.run(delete_topics(bootstrap, list(topics.values()), f"{prefix}-ingest"))
        )
        created = subprocess.run(
            [*cli, "topics", "create", *kafka, *worker_topics, "--partitions", str(PARTITIONS)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if created.returncode != 0:
            raise DemoError(f"`topics create` failed:\n{created.stderr.strip()}")
        # Before ingest and the gateway start: the gateway needs it, and ingest may not have made it yet.
        requests_connection = Connection(bootstrap, f"{prefix}-setup", KafkaSecurity())
        asyncio.run(requests_connection.ensure_topic(topics["openai-requests"], PARTITIONS))
        for store in ("stored-responses", "batches"):  # the gateway's own compacted tables
            asyncio.run(
                requests_connection.ensure_topic(topics[store], 1, config={"cleanup.policy": "compact"})
            )

        fake = fake_vllm().FakeVllm(served, served_model_names=(SERVED_MODEL,), pace_s=PACE_S).start()
        cleanup.callback(fake.stop)
        print(f"  fake vLLM (render + generate) on {fake.url}: {len(served)} recorded generations")
        processes = Processes(tmp)
        cleanup.callback(processes.stop)
        for n in (1, 2):
            processes.start(
                f"worker-{n}",
                [
                    *cli,
                    "run",
                    *kafka,
                    *worker_topics,
                    *("--group-id", prefix, "--client-id", f"{prefix}-worker-{n}", "--metrics-port", "0"),
                    *("--commit-interval-ms", "20"),
                    *worker_model_args(model_dir),
                ],
            )
        processes.start(
            "ingest",
            [
                *cli,
                "ingest",
                *kafka,
                *("--requests-topic", topics["openai-requests"], "--input-topic", topics["requests"]),
                *("--output-topic", topics["responses"], "--group-id", f"{prefix}-ingest"),
                *("--render-url", fake.url),
            ],
        )
        port = _free_port()
        processes.start(
            "gateway",
            [
                *cli,
                "gateway",
                *kafka,
                *("--requests-topic", topics["openai-requests"], "--output-topic", topics["responses"]),
                *("--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_MODEL),
                *("--responses-topic", topics["stored-responses"], "--batch-topic", topics["batches"]),
                *("--reply-group-id", f"{prefix}-gateway"),
                "--allow-no-api-key",  # bound to loopback, for the demo's own client
            ],
        )
        base_url = f"http://127.0.0.1:{port}"
        _wait_for_gateway(base_url, processes)
        print(f"  gateway: {base_url}/v1 (OpenAI-compatible); client: the openai SDK")
        chunks = sum(_chat(base_url, request) for request in requests)
        by_name = {r.name: r.request for r in served}
        _responses(base_url, by_name["demo-reasoning"])  # the same generations, through the other APIs
        _messages(base_url, by_name["demo-tool"])
        _background(base_url, by_name["demo-reasoning"])
        _batch(base_url, [by_name["demo-reasoning"], by_name["demo-tool"]])
        processes.check()
    print(
        f"\npipeline demo: {len(requests)} requests, {chunks} chunks through gateway -> ingest -> "
        f"2 workers -> gateway in {time.monotonic() - started:.0f} s"
    )
    return 0
