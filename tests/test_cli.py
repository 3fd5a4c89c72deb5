"""The command line: start-up errors are clear, replay reads stdin, the offline demo shows its streams."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.golden_cases import GOLDEN_034_DIR, GOLDEN_DIR, MODELS_DIR, load_cases

QWEN3 = str(MODELS_DIR / "qwen3")


def _cli(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        input=stdin,
        env={**os.environ, **(env or {})},
        capture_output=True,
        timeout=180,
        check=False,
    )


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--reasoning-parser", "nope"], [b"qwen3", b"deepseek_r1"]),
        (["--tool-parser", "nope", "--enable-auto-tool-choice"], [b"hermes"]),
    ],
)
def test_unknown_parser_names_fail_at_start_up_listing_the_known_ones(
    flags: list[str], names: list[bytes]
) -> None:
    done = _cli("replay", "-", "--tokenizer", QWEN3, *flags, stdin=b"")
    assert done.returncode == 2
    assert b"nope" in done.stderr
    for name in names:
        assert name in done.stderr


def test_missing_tokenizer_directory_is_a_configuration_error() -> None:
    done = _cli("replay", "-", "--tokenizer", str(MODELS_DIR / "no-such-model"), stdin=b"")
    assert done.returncode == 2
    assert b"does not exist" in done.stderr


@pytest.mark.parametrize(
    ("version", "directory"), [("0.33", GOLDEN_DIR), ("0.34", GOLDEN_034_DIR)], ids=["0.33", "0.34"]
)
def test_replay_from_stdin_matches_the_golden_case(version: str, directory: Path) -> None:
    case = next(c for c in load_cases(directory) if c.id == "plain-chat-qwen3-multibyte")
    stdin = b"\n".join(orjson.dumps(r) for r in case.input)
    args = (
        "replay",
        "-",
        "--tokenizer",
        QWEN3,
        "--served-model-name",
        "test-model",
        "--vllm-version",
        version,
    )
    done = _cli(*args, stdin=stdin)
    assert done.returncode == 0, done.stderr
    outputs = [orjson.loads(line) for line in done.stdout.splitlines()]
    for output in outputs:
        output["body"]["chunk"]["created"] = 0
    assert outputs == case.expected


def test_the_vllm_version_comes_from_the_environment_too_and_is_checked() -> None:
    case = next(c for c in load_cases() if c.id == "plain-chat-qwen3-multibyte")
    stdin = b"\n".join(orjson.dumps(r) for r in case.input)
    args = ("replay", "-", "--tokenizer", QWEN3, "--served-model-name", "test-model")
    done = _cli(*args, stdin=stdin, env={"DERENDER_VLLM_VERSION": "0.33"})
    unknown = _cli(*args, stdin=stdin, env={"DERENDER_VLLM_VERSION": "0.35"})
    assert done.returncode == 0, done.stderr
    assert b'"prev_tokens"' in done.stdout and b'"prev_token_ids"' not in done.stdout
    assert unknown.returncode == 2 and b"0.35" in unknown.stderr, unknown.stderr


@pytest.mark.parametrize("command", ["run", "replay", "audit"])
def test_help_documents_the_vllm_version_and_its_default(command: str) -> None:
    done = _cli(command, "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.decode().split())
    assert "--vllm-version" in text and "DERENDER_VLLM_VERSION" in text
    assert "one of: 0.33, 0.34" in text and "default: 0.34, the newest supported" in text
    assert "--return-tokens-as-token-ids" in text


def test_offline_demo_shows_reasoning_content_and_tool_calls_apart() -> None:
    done = _cli("demo", "--offline")
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert "reasoning: '\\nCheck small primes" in text
    assert "tool call: get_weather(" in text
    assert "北京你好" in text
    assert "[1] content:   '分区里的消息" in text


def test_offline_demo_shows_a_gpt_oss_answer_with_reasoning_and_a_tool_call() -> None:
    stream = MODELS_DIR.parent / "streams" / "demo-gptoss.jsonl"
    done = _cli("demo", "--offline", "--tokenizer", str(MODELS_DIR / "gpt-oss"), "--stream", str(stream))
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert "reasoning: 'User wants the current weather in São Paulo" in text
    assert 'tool call: get_weather({"city":"São Paulo","unit":"celsius"})' in text
    assert "finish_reason: tool_calls" in text


def test_run_without_a_reachable_broker_says_so_in_one_line() -> None:
    """A newcomer's first `run` with no broker: one line naming the address and how to start one,
    exit 2 (a usage problem), no traceback."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket is closed
    address = f"127.0.0.1:{port}"
    done = _cli(
        "run", "--bootstrap-servers", address, "--tokenizer", QWEN3, "--served-model-name", "m",
        "--metrics-port", "0",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    last = done.stderr.decode().strip().splitlines()[-1]
    assert last.startswith(f"derender-worker: configuration error: cannot reach Kafka at {address};")
    assert "deploy/local/kafka start" in last
    assert b"Traceback" not in done.stderr
    # Asked before the data-path clients start: no client retries and logs each failed connect.
    noise = [line for line in done.stderr.decode().splitlines() if " INFO " not in line]
    assert noise == [last]


def test_a_tool_parser_without_auto_tool_choice_is_warned_about() -> None:
    # As in vLLM the parser then does nothing; saying so beats a silently ignored flag.
    done = _cli("replay", "-", "--tokenizer", QWEN3, "--tool-parser", "hermes", stdin=b"")
    assert done.returncode == 0, done.stderr
    assert b"--tool-parser hermes does nothing without --enable-auto-tool-choice" in done.stderr
    quiet = _cli(
        "replay", "-", "--tokenizer", QWEN3, "--tool-parser", "hermes", "--enable-auto-tool-choice", stdin=b""
    )
    assert b"does nothing" not in quiet.stderr
