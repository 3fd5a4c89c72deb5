"""JSON log lines and ``configure_logging``."""

from __future__ import annotations

import argparse
import io
import json
import logging
from collections.abc import Iterator

import pytest

from worker.runtime.observability.structured_logging import JsonFormatter, configure_logging
from worker.settings import (
    LogFormat,
    LoggingSettings,
    add_arguments,
    load,
)


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    aiokafka_level = logging.getLogger("aiokafka").level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("aiokafka").setLevel(aiokafka_level)


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("worker.runtime.worker", logging.WARNING, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def test_one_json_object_with_the_fixed_fields() -> None:
    line = JsonFormatter().format(_record("gap in %s at %d", "req-1", 7))
    assert "\n" not in line
    data = json.loads(line)
    assert set(data) == {"ts", "level", "logger", "msg", "pid"}
    assert data["level"] == "WARNING" and data["logger"] == "worker.runtime.worker"
    assert data["msg"] == "gap in req-1 at 7"
    assert data["ts"].endswith("+00:00") and "T" in data["ts"]


def test_context_fields_from_extra() -> None:
    record = _record("dead-lettered", request_id="req-9", partition=3, topic="in", offset=42, other="ignored")
    data = json.loads(JsonFormatter().format(record))
    assert {k: data[k] for k in ("request_id", "partition", "topic", "offset")} == {
        "request_id": "req-9",
        "partition": 3,
        "topic": "in",
        "offset": 42,
    }
    assert "other" not in data


def test_odd_values_and_newlines_stay_on_one_line() -> None:
    record = _record("multi\nline \u2603", request_id=b"bytes-key", partition=object())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["msg"] == "multi\nline \u2603" and data["request_id"] == "b'bytes-key'"


def test_exceptions_are_one_field() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    data = json.loads(JsonFormatter().format(record))
    assert data["msg"] == "failed"
    assert "Traceback" in data["exc"] and "ValueError: boom" in data["exc"]


def test_configure_logging_json(restore_root: None) -> None:
    stream = io.StringIO()
    configure_logging("info", json=True, stream=stream)
    log = logging.getLogger("worker.test")
    log.debug("hidden")
    log.info("opened partitions", extra={"partition": 1, "topic": "in"})
    logging.getLogger("aiokafka").info("chatter")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert (data["msg"], data["partition"], data["topic"], data["level"]) == (
        "opened partitions",
        1,
        "in",
        "INFO",
    )
    assert len(logging.getLogger().handlers) == 1


def test_configure_logging_text_replaces_handlers(restore_root: None) -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("DEBUG", json=True, stream=first)
    configure_logging(logging.WARNING, json=False, stream=second)
    logging.getLogger("worker.test").warning("plain %s", "text")
    assert first.getvalue() == ""
    assert "WARNING" in second.getvalue() and "worker.test: plain text" in second.getvalue()
    with pytest.raises(json.JSONDecodeError):
        json.loads(second.getvalue())


def test_log_format_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DERENDER_LOG_FORMAT", raising=False)
    parser = argparse.ArgumentParser()
    add_arguments(parser, LoggingSettings)
    assert load(LoggingSettings, parser.parse_args([])).log_format is LogFormat.TEXT
    assert load(LoggingSettings, parser.parse_args(["--log-format", "json"])).log_format is LogFormat.JSON
    monkeypatch.setenv("DERENDER_LOG_FORMAT", "JSON")
    parser = argparse.ArgumentParser()
    add_arguments(parser, LoggingSettings)
    assert load(LoggingSettings, parser.parse_args([])).log_format is LogFormat.JSON
