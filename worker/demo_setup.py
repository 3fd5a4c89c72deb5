"""What both demos (``demo``, ``demo --pipeline``) set up: the bundled samples and the workers'
model arguments, and a Kafka broker, given or started with the local script, waited for and
cleaned up after.

The samples are package data (``worker/demo_samples/``), so an installed wheel has them. The
local broker script is not: it is found in a source tree only, and without one (and without a
given broker) the demo says how to get a broker instead."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from worker.demo_view import DemoView
from worker.errors import DemoError
from worker.settings import DemoOptions, KafkaConnection, env_vars_of

DEMO_SAMPLES = Path(__file__).resolve().parent / "demo_samples"
DEMO_STREAM = DEMO_SAMPLES / "streams" / "demo-qwen3.jsonl"
DEMO_MODEL_DIR = DEMO_SAMPLES / "models" / "qwen3"
DEMO_MODEL_NAME = "qwen3-demo"
# The package's parent is a source tree when the package runs from one (an editable install).
SOURCE_TREE = Path(__file__).resolve().parent.parent
LOCAL_KAFKA_SCRIPT = SOURCE_TREE / "deploy" / "local" / "kafka"
BOOTSTRAP_ENVS = env_vars_of("bootstrap_servers", KafkaConnection.model_fields["bootstrap_servers"])
BROKER_START_TIMEOUT_S = 600.0  # the first start fetches Kafka's jars with Maven
BROKER_ANSWER_TIMEOUT_S = 30.0


def exit_code(run: Callable[[], int]) -> int:
    """Run a demo: its ``DemoError`` or Ctrl-C ends it with a one-line message and exit code."""
    try:
        return run()
    except DemoError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo: interrupted; everything it started was stopped", file=sys.stderr)
        return 130


def worker_model_args(model_dir: str) -> list[str]:
    return [
        "--tokenizer",
        model_dir,
        "--served-model-name",
        DEMO_MODEL_NAME,
        "--reasoning-parser",
        "qwen3",
        "--tool-parser",
        "hermes",
        "--enable-auto-tool-choice",
    ]


def given_bootstrap(args: DemoOptions) -> tuple[str, str] | None:
    if args.bootstrap_servers:
        return args.bootstrap_servers.strip(), "--bootstrap-servers"
    for env in BOOTSTRAP_ENVS:
        if os.environ.get(env, "").strip():
            return os.environ[env].strip(), env
    return None


def cleanup_step(what: str, step: Callable[[], None]) -> Callable[[], None]:
    """A cleanup callback that warns instead of raising, so the later steps still run."""

    def run() -> None:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - cleanup goes on; the failure is printed
            print(f"demo: warning: {what} failed: {exc!r}", file=sys.stderr)

    return run


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


def last_line(path: Path) -> str:
    """The last line of a growing log (Maven's output can be long: read only its end)."""
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
        lines = f.read().decode("utf-8", errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def run_quiet(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False
    )


def in_source_tree() -> bool:
    """Whether the package runs from a source tree (which holds the local broker script)."""
    return LOCAL_KAFKA_SCRIPT.is_file() and (SOURCE_TREE / "pyproject.toml").is_file()


def no_broker_error() -> DemoError:
    """No broker given, and no source tree whose script could start one (an installed package)."""
    return DemoError(
        "no Kafka broker given, and this installation has no local broker script (it is in the "
        "source tree: deploy/local/kafka). Point the demo at a running broker with "
        f"--bootstrap-servers or {' / '.join(BOOTSTRAP_ENVS)}, e.g. one started with "
        "`deploy/local/kafka start` in a clone of the repository (127.0.0.1:19092) or with "
        "`docker run -d -p 9092:9092 apache/kafka:4.1.0` (localhost:9092). "
        "`derender-worker demo --offline` needs no broker."
    )


def start_local_broker(view: DemoView, cleanup: contextlib.ExitStack, log_dir: Path) -> str:
    """``deploy/local/kafka start`` with progress; stopped at the end only if it was not running."""
    if not in_source_tree():
        raise no_broker_error()
    was_running = run_quiet([str(LOCAL_KAFKA_SCRIPT), "status"], 30).returncode == 0
    if not was_running:
        # Registered before starting: a start that fails half-way is still stopped.
        cleanup.callback(cleanup_step("stopping Kafka", lambda: stop_local_broker(view)))
    stdout_path, stderr_path = log_dir / "kafka-start.out", log_dir / "kafka-start.err"
    title = "using the running local Kafka" if was_running else "starting Kafka (deploy/local/kafka start)"
    with view.stage(title) as stage, stdout_path.open("w") as stdout, stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [str(LOCAL_KAFKA_SCRIPT), "start"], stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr
        )
        try:
            deadline = time.monotonic() + BROKER_START_TIMEOUT_S
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise DemoError(
                        f"{LOCAL_KAFKA_SCRIPT} start did not finish in {BROKER_START_TIMEOUT_S:.0f} s"
                    )
                stage.update(last_line(stderr_path))
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        raise DemoError(
            f"the local Kafka broker did not start ({LOCAL_KAFKA_SCRIPT} start exited with "
            f"{proc.returncode}):\n{tail(stderr_path)}"
        )
    lines = stdout_path.read_text().strip().splitlines()
    if not lines:
        raise DemoError(f"{LOCAL_KAFKA_SCRIPT} start printed no bootstrap address")
    return lines[-1].strip()


def stop_local_broker(view: DemoView) -> None:
    with view.stage("stopping Kafka (deploy/local/kafka stop)"):
        done = run_quiet([str(LOCAL_KAFKA_SCRIPT), "stop"], 120)
    if done.returncode != 0:
        print(f"demo: warning: {LOCAL_KAFKA_SCRIPT} stop failed: {done.stderr.strip()}", file=sys.stderr)


async def broker_answers(bootstrap: str) -> str | None:
    """None when a client can bootstrap and sees a broker, else why not."""
    from worker.runtime.kafka_client.aiokafka_backend import broker_problem

    return await broker_problem(bootstrap)


def wait_for_broker(bootstrap: str, origin: str) -> None:
    deadline = time.monotonic() + BROKER_ANSWER_TIMEOUT_S
    while (problem := asyncio.run(broker_answers(bootstrap))) is not None:
        if time.monotonic() > deadline:
            raise DemoError(f"no Kafka broker answers at {bootstrap} ({origin}): {problem}")
        time.sleep(0.5)


async def delete_topics(bootstrap: str, topics: list[str], group: str) -> None:
    # The empty group would otherwise linger on a kept local broker for days.
    from worker.runtime.kafka_client.aiokafka_backend import delete_topics_and_group

    await delete_topics_and_group(bootstrap, topics, group)
