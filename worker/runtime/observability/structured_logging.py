"""One JSON object per log line, for log pipelines (Loki, Elasticsearch, Cloud Logging).

``JsonFormatter`` writes ``ts`` (UTC, ISO 8601, ms), ``level``, ``logger``, ``msg`` and ``pid``,
plus ``request_id`` / ``partition`` / ``topic`` / ``offset`` / ``group_id`` when a call passes
them, e.g. ``log.warning("gap", extra={"request_id": rid, "partition": 3, "offset": 17})``,
and ``exc`` (the formatted traceback) for ``log.exception``. Keys are fixed, so a query can
filter on ``partition`` without parsing the message.

``configure_logging(level, json=...)`` replaces the root handlers (stderr) and keeps aiokafka's
INFO chatter out, like ``commands._configure_logging``, unless ``DERENDER_AIOKAFKA_DEBUG=1``.
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

from worker.settings import LogFormat, LoggingSettings

# Context fields a caller may pass with ``extra=``; anything else in ``extra`` is left out so a
# stray attribute can never break the line's schema.
CONTEXT_FIELDS: tuple[str, ...] = ("request_id", "partition", "topic", "offset", "group_id")


class JsonFormatter(logging.Formatter):
    def __init__(self, *, extra_fields: tuple[str, ...] = CONTEXT_FIELDS) -> None:
        super().__init__()
        self.extra_fields = extra_fields

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
        }
        for name in self.extra_fields:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # default=str: an odd extra value (bytes, TopicPartition) becomes text, never an exception.
        return orjson.dumps(line, default=str).decode("utf-8")


def configure_logging(
    level: str | int, json: bool, stream: TextIO | None = None, *, aiokafka_debug: bool = False
) -> None:
    """Root logging to ``stream`` (stderr) in JSON lines or the runtime's text format."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    if json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s [{os.getpid()}] %(name)s: %(message)s")
        )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # aiokafka logs every retry of a broker outage; keep its INFO chatter out.
    if not aiokafka_debug:
        logging.getLogger("aiokafka").setLevel(max(logging.WARNING, root.level))


def configure(settings: LoggingSettings) -> None:
    """Root logging as ``settings`` say (``--log-level``, ``--log-format``, ``--aiokafka-debug``)."""
    configure_logging(
        settings.log_level.value,
        json=settings.log_format is LogFormat.JSON,
        aiokafka_debug=settings.aiokafka_debug,
    )
