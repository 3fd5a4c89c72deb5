"""``audit`` throughput beside ``replay``'s on the same records.

The recorded Qwen3 demo streams (``samples/streams/demo-qwen3.jsonl``: plain, reasoning, tool call,
n=2 completion), copied under new request ids and interleaved, are run through ``replay`` (derender
and write) and through ``audit`` (derender, then pair with and compare against the recorded outputs
replay wrote), with the demo's parsers and without any. Median of 3 rounds, records per second.
"""

from __future__ import annotations

import functools
import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from worker.audit import Auditor
from worker.core.derenderer import Derenderer
from worker.core.vllm_version import VllmVersion
from worker.replay import replay_lines
from worker.runtime.composition import load_derenderer, new_processor
from worker.settings import ModelSettings

ROOT = Path(__file__).resolve().parent.parent
STREAM = ROOT / "samples" / "streams" / "demo-qwen3.jsonl"
COPIES = 60
ROUNDS = 3


def _records() -> list[bytes]:
    envelopes = [orjson.loads(line) for line in STREAM.read_bytes().splitlines() if line.strip()]
    queues: list[list[bytes]] = []
    for copy in range(COPIES):
        by_request: dict[str, list[bytes]] = {}
        for e in envelopes:
            rid = f"{e['request_id']}-{copy}"
            by_request.setdefault(rid, []).append(orjson.dumps({**e, "request_id": rid}))
        queues.extend(by_request.values())
    out: list[bytes] = []
    while any(queues):  # interleaved, each request's order kept
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def _replay(settings: ModelSettings, derenderer: Derenderer, records: list[bytes]) -> bytes:
    out = io.BytesIO()
    replay_lines(records, new_processor(settings, derenderer), out, io.StringIO())
    return out.getvalue()


def _audit(
    settings: ModelSettings, derenderer: Derenderer, records: list[bytes], recorded: list[bytes]
) -> tuple[float, float]:
    """One audit; the seconds spent derendering and comparing."""
    started = time.perf_counter()
    auditor = Auditor(lambda: new_processor(settings, derenderer))
    for value in records:
        auditor.add_input(value)
    derendered = time.perf_counter()
    for line, value in enumerate(recorded, start=1):
        auditor.add_recorded(value, {"file": "recorded", "line": line})
    report = auditor.finish()
    assert not report.differs, report.summary()
    return derendered - started, time.perf_counter() - derendered


def _rate(run: Callable[[], object], count: int) -> float:
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return count / statistics.median(times)


def main(argv: list[str]) -> None:
    records = _records()
    configs = {
        "no parser": ModelSettings(
            vllm_version=VllmVersion.V0_34,
            tokenizer=str(ROOT / "samples" / "models" / "qwen3"),
            served_model_names=("qwen3-demo",),
        ),
        "qwen3 + hermes": ModelSettings(
            vllm_version=VllmVersion.V0_34,
            tokenizer=str(ROOT / "samples" / "models" / "qwen3"),
            served_model_names=("qwen3-demo",),
            reasoning_parser="qwen3",
            tool_parser="hermes",
            enable_auto_tool_choice=True,
        ),
    }
    print(
        f"audit vs replay: {len(records)} records ({COPIES} copies of the demo streams), median of {ROUNDS}"
    )
    print(
        f"{'configuration':<16} {'replay rec/s':>13} {'audit rec/s':>12} {'audit / replay':>15} "
        f"{'derender µs/rec':>16} {'compare µs/rec':>15}"
    )
    for name, settings in configs.items():
        derenderer = load_derenderer(settings)
        recorded = _replay(settings, derenderer, records).splitlines()
        replay_rate = _rate(functools.partial(_replay, settings, derenderer, records), len(records))
        phases = [_audit(settings, derenderer, records, recorded) for _ in range(ROUNDS)]
        derender = statistics.median(p[0] for p in phases)
        compare = statistics.median(p[1] for p in phases)
        audit_rate = len(records) / statistics.median(p[0] + p[1] for p in phases)
        print(
            f"{name:<16} {replay_rate:>13,.0f} {audit_rate:>12,.0f} {audit_rate / replay_rate:>15.2f} "
            f"{derender / len(records) * 1e6:>16.0f} {compare / len(records) * 1e6:>15.0f}"
        )
