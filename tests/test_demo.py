"""``derender-worker demo``: the Kafka demo end to end, its failure handling, and its record plan."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.paths import REPO_ROOT
from worker import demo, demo_setup

DEMO_STREAM = REPO_ROOT / "samples" / "streams" / "demo-qwen3.jsonl"
INJECTED_INVALID = 2  # the demo adds a truncated JSON line and a non-envelope record
FINAL_LINE = re.compile(r"demo: (\d+) sequences, (\d+) chunks, (\d+) dead-lettered, (\d+\.\d) chunks/s")


def _stream_counts() -> tuple[int, int]:
    """(requests, records) of the bundled stream: every record yields one output chunk."""
    lines = [line for line in DEMO_STREAM.read_bytes().splitlines() if line.strip()]
    return len({orjson.loads(line)["request_id"] for line in lines}), len(lines)


def _demo(env_overrides: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in demo_setup.BOOTSTRAP_ENVS}
    env.update(env_overrides)
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", "demo", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO_ROOT,
        check=False,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (Linux /proc; empty elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.kafka
def test_demo_streams_through_two_workers_and_reports_exact_counts(kafka_bootstrap: str) -> None:
    done = _demo({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap})
    assert done.returncode == 0, done.stderr + done.stdout
    lines = done.stdout.splitlines()
    match = FINAL_LINE.fullmatch(lines[-1])
    assert match, lines[-1]
    requests, records = _stream_counts()
    sequences, chunks, dead, rate = match.groups()
    assert (int(sequences), int(chunks), int(dead)) == (requests, records, INJECTED_INVALID)
    assert float(rate) > 0
    text = done.stdout
    # Not a terminal: no live view (no ANSI escapes), the responses and the dead-letter path in plain text.
    assert "\x1b[" not in text
    assert f"{INJECTED_INVALID} invalid records were injected on purpose" in text
    assert "tool call: get_weather(" in text
    assert "reasoning: '\\nCheck small primes" in text
    assert "北京你好" in text
    assert re.search(r"served by worker [12] \(partition \d\)", text)
    # It used the given broker, so it neither started nor stopped one.
    assert "from KAFKA_BOOTSTRAP_SERVERS" in text
    assert "deploy/local/kafka" not in text
    # Both workers were stopped and reaped; nothing of this run is still running.
    pids = [int(pid) for pid in re.findall(r"^worker \d \(pid (\d+)\)", text, re.MULTILINE)]
    assert len(pids) == 2
    assert not [pid for pid in pids if _alive(pid)]
    group = re.search(r"\(group (derender-demo-[0-9a-f]+)\)", text)
    assert group
    assert _processes_mentioning(group.group(1)) == []


@pytest.mark.kafka
def test_demo_fails_clearly_when_a_worker_exits_early(kafka_bootstrap: str, tmp_path: Path) -> None:
    # An empty model directory: `run` fails at start-up, before joining the group.
    done = _demo({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}, "--tokenizer", str(tmp_path))
    assert done.returncode == 1, done.stdout
    assert "demo: error: worker " in done.stderr
    assert "exited early" in done.stderr
    group = re.search(r"\(group (derender-demo-[0-9a-f]+)\)", done.stdout)
    assert group
    assert _processes_mentioning(group.group(1)) == []


@pytest.mark.kafka
def test_sigterm_mid_stream_stops_the_workers_and_exits_130(kafka_bootstrap: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in demo_setup.BOOTSTRAP_ENVS}
    env["KAFKA_BOOTSTRAP_SERVERS"] = kafka_bootstrap
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "demo", "--pace-ms", "200"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # the plain view flushes every line
            seen.append(line)
            if line.startswith("streaming "):
                break
        text = "".join(seen)
        pids = [int(pid) for pid in re.findall(r"^worker \d \(pid (\d+)\)", text, re.MULTILINE)]
        assert len(pids) == 2, text
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert "stopping 2 workers" in out
    assert not [pid for pid in pids if _alive(pid)]
    group = re.search(r"\(group (derender-demo-[0-9a-f]+)\)", text)
    assert group
    assert _processes_mentioning(group.group(1)) == []


def test_demo_without_a_bootstrap_uses_the_local_script_and_stops_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A stand-in for deploy/local/kafka: reports "stopped", fails to start, records every call.
    calls = tmp_path / "calls"
    script = tmp_path / "kafka"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> {calls}\n'
        'case "$1" in\n'
        "  status) echo stopped; exit 3 ;;\n"
        '  start) echo "kafka: error: missing: maven" >&2; exit 1 ;;\n'
        "  stop) exit 0 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    monkeypatch.setattr(demo_setup, "LOCAL_KAFKA_SCRIPT", script)
    for env in demo_setup.BOOTSTRAP_ENVS:
        monkeypatch.delenv(env, raising=False)
    from worker.cli import build_parser

    assert demo.run_demo(build_parser("demo").parse_args(["demo"])) == 1
    err = capsys.readouterr().err
    assert "the local Kafka broker did not start" in err
    assert "missing: maven" in err
    # The half-started broker is stopped too: the demo did start it.
    assert calls.read_text().split() == ["status", "start", "stop"]


def test_plan_interleaves_requests_and_adds_the_invalid_records() -> None:
    plan = demo.build_plan(DEMO_STREAM)
    requests, records = _stream_counts()
    assert len(plan.records) == records + INJECTED_INVALID
    assert len(plan.invalid) == INJECTED_INVALID
    assert sum(n for _, n in plan.expected.values()) == records
    assert len(plan.expected) == requests
    # Interleaved: the first few records already come from every request.
    first_keys = {r.key for r in plan.records[: requests * 2]}
    assert {rid.encode() for rid in plan.expected} <= first_keys
    # Each request's own records keep their order (seq 0, 1, 2, ...).
    for rid in plan.expected:
        seqs = [
            orjson.loads(r.value)["seq"] for r in plan.records if r.key == rid.encode() and r.invalid is None
        ]
        assert seqs == sorted(seqs)


@pytest.mark.kafka
def test_pipeline_demo_answers_an_openai_client_through_kafka(kafka_bootstrap: str) -> None:
    """`demo --pipeline`: fake vLLM, ingest, two workers and the gateway, with the real openai SDK
    streaming a reasoning answer and a tool call, then Responses (streamed and background), Messages
    and a Batch over the same generations; everything it started is stopped."""
    done = _demo({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}, "--pipeline")
    assert done.returncode == 0, done.stderr + done.stdout
    text = done.stdout
    assert re.search(r"^pipeline demo: 2 requests, \d+ chunks through gateway", text, re.MULTILINE), text
    assert "No. 1001 = 7 × 11 × 13, so it is not prime.  [stop]" in text
    assert '[tool call] get_weather({"city": "Tokyo", "unit": "c"})  [tool_calls]' in text
    # The same generations through the Responses and Messages APIs.
    assert "  response.output_text.done: No. 1001 = 7 × 11 × 13, so it is not prime." in text
    assert "  response.completed" in text
    assert '  tool_use get_weather({"city":"Tokyo","unit":"c"})\n  stop_reason: tool_use' in text
    # A background response, queued then retrieved; the two chats as one batch, in input order.
    assert "  created: queued\n" in text or "  created: in_progress\n" in text, text
    assert "  retrieved: completed: No. 1001 = 7 × 11 × 13, so it is not prime." in text
    answered = "  line-0: 200 [stop]\n  line-1: 200 [tool_calls]\n  batch completed: 2 of 2 lines answered"
    assert answered in text
    pids = [int(pid) for pid in re.findall(r"^  started \S+ \(pid (\d+)\)", text, re.MULTILINE)]
    assert len(pids) == 4  # two workers, ingest, gateway
    assert not [pid for pid in pids if _alive(pid)]
