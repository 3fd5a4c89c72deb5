"""State checkpoints: state records per input record, and the restore time of a partition.

One input partition with 2,000 interleaved open streams (real Qwen3 ids, chat and completion, one
token per record), each sending a record every ``--record-every-s`` seconds of simulated time for a
few minutes, committed every 100 ms. One processor runs the records once; one ``StateChangelog``
per checkpoint interval watches the same commits, on the simulated clock. Printed per interval:

* state records (and bytes) written per input record;
* the restore of the partition at the end: decoding the checkpoints, then the two ways to bring
  them up to the committed offset that the design considered:
  - **re-read input** (implemented): run each restored request's input records after its
    checkpoint through a fresh processor, emitting nothing (``state_changelog.replay_after``);
  - **output stream_state**: take, per request and choice, the ``stream_state`` of its last
    output after the checkpoint (every output envelope carries one), parsing the output records.
  The bytes each would read from Kafka are printed beside: the input range of one partition, vs the
  output records of the same requests (in a real deployment spread over every output partition,
  so a restore would read all of them, other partitions' requests included).
  Whether the restored requests equal the live ones is printed too.

Kafka's own read time is not included (in-process; the bytes are printed instead).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from benchmarks.kafka_harness import make_workload
from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.request_context import RequestContext
from worker.core.sequence_state import SequenceState
from worker.core.vllm_version import VllmVersion
from worker.runtime.composition import load_derenderer
from worker.runtime.kafka_client.base import OutgoingRecord
from worker.runtime.state.changelog import (
    StateChangelog,
    StateKeys,
    encode_context,
    install,
    replay_after,
    restore,
)
from worker.settings import ModelSettings

ROOT = Path(__file__).resolve().parent.parent
COMMIT_S = 0.1
INTERVALS_S = (0.0, 1.0, 5.0, 10.0, 30.0)
KEYS = StateKeys("bench")


@dataclass
class _Record:
    key: bytes
    value: bytes
    offset: int


def _processor() -> EnvelopeProcessor:
    settings = ModelSettings(
        vllm_version=VllmVersion.V0_34,
        tokenizer=str(ROOT / "samples" / "models" / "qwen3"),
        served_model_names=("qwen3",),
        reasoning_parser="qwen3",
        tool_parser="hermes",
        enable_auto_tool_choice=True,
    )
    return EnvelopeProcessor(load_derenderer(settings))


class _Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench state")
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--minutes", type=float, default=1.5)
    parser.add_argument("--record-every-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    tokens = int(args.minutes * 60 / args.record_every_s)
    # The last record of each stream finishes it: leave it out, so all streams stay open.
    workload = [(k, v) for k, v in make_workload(args.streams, tokens + 1, "st") if b"finish_reason" not in v]
    records = [_Record(k, v, offset) for offset, (k, v) in enumerate(workload)]
    per_commit = max(1, round(args.streams / args.record_every_s * COMMIT_S))
    print(
        f"bench state: {args.streams} open streams, a record each every {args.record_every_s:g} s for "
        f"{args.minutes:g} min (simulated): {len(records)} input records, {per_commit} per 100 ms commit"
    )
    clock = _Clock()
    changelogs = {
        interval: StateChangelog("state", 0, KEYS, checkpoint_interval_s=interval, clock=clock)
        for interval in INTERVALS_S
    }
    latest: dict[float, dict[bytes, bytes]] = {interval: {} for interval in INTERVALS_S}
    written = dict.fromkeys(INTERVALS_S, 0)
    written_bytes = dict.fromkeys(INTERVALS_S, 0)
    outputs: list[tuple[int, bytes]] = []  # (input offset, output envelope)
    live = _processor()
    started = time.perf_counter()
    for start in range(0, len(records), per_commit):
        for record in records[start : start + per_commit]:
            result = live.process(record.value, record.key)
            assert result.payload is not None and result.request_id is not None
            outputs.append((record.offset, result.payload))
            for changelog in changelogs.values():
                changelog.changed(result.request_id, record.offset)
        clock.now += COMMIT_S
        for interval, changelog in changelogs.items():
            state: list[OutgoingRecord] = changelog.records(live.requests)
            written[interval] += len(state)
            for out in state:
                assert out.key is not None  # state records are keyed by request
                written_bytes[interval] += len(out.value or b"")
                if out.value is None:
                    latest[interval].pop(out.key, None)
                else:
                    latest[interval][out.key] = out.value
    processing = time.perf_counter() - started
    print(f"processing and {len(INTERVALS_S)} changelogs: {processing:.1f} s")
    expected = {rid: encode_context(ctx) for rid, ctx in live.requests.items()}
    end = len(records)
    print(
        f"{'interval':>9} {'state rec/input':>15} {'state MB':>9} {'re-read':>8} {'input MB':>9} "
        f"{'restore (re-read)':>18} {'output MB':>10} {'restore (outputs)':>18} {'equal':>6}"
    )
    for interval in INTERVALS_S:
        times_a, times_b = [], []
        equal = True
        for _ in range(3):
            t0 = time.perf_counter()
            restored = restore(KEYS, latest[interval], live.derenderer)
            processor = _processor_like(live)
            install(processor, restored.checkpoints, 0.0)
            first = restored.replay_from if restored.replay_from is not None else end
            replay_after(processor, restored.checkpoints, records[first:end])
            times_a.append(time.perf_counter() - t0)
            equal = equal and {r: encode_context(c) for r, c in processor.requests.items()} == expected
            t0 = time.perf_counter()
            restored = restore(KEYS, latest[interval], live.derenderer)
            out_bytes = _from_outputs(restored, outputs[first:end], live.derenderer)
            times_b.append(time.perf_counter() - t0)
        input_bytes = sum(len(r.value) for r in records[first:end])
        per_input = written[interval] / len(records)
        print(
            f"{interval:>8g}s {per_input:>15.3f} {written_bytes[interval] / 1e6:>9.1f} "
            f"{end - first:>8} {input_bytes / 1e6:>9.2f} {statistics.median(times_a) * 1000:>15.0f} ms "
            f"{out_bytes / 1e6:>10.2f} {statistics.median(times_b) * 1000:>15.0f} ms {equal!s:>6}"
        )


def _processor_like(live: EnvelopeProcessor) -> EnvelopeProcessor:
    """A fresh processor (a new owner) sharing the live one's derenderer (its caches warm)."""
    return EnvelopeProcessor(live.derenderer)


def _from_outputs(restored: Any, outputs: list[tuple[int, bytes]], derenderer: Derenderer) -> int:
    """The other option: each checkpointed request's last output ``stream_state`` per choice after
    its checkpoint, parsed from the output records; returns the bytes read."""
    last: dict[tuple[str, int], dict[str, Any]] = {}
    seqs: dict[str, int] = {}
    size = 0
    for offset, payload in outputs:
        size += len(payload)
        envelope = orjson.loads(payload)
        rid = envelope["request_id"]
        checkpoint = restored.checkpoints.get(rid)
        if checkpoint is None or checkpoint.offset is None or offset <= checkpoint.offset:
            continue
        body = envelope.get("body") or {}
        choices = (body.get("chunk") or {}).get("choices") or [{"index": 0}]
        last[(rid, choices[0].get("index", 0))] = body["stream_state"]
        seqs[rid] = envelope["seq"]
    for (rid, index), wire in last.items():
        ctx: RequestContext = restored.checkpoints[rid].ctx
        ctx.sequences[index] = SequenceState.from_wire(
            _validated(wire), derenderer.decoder, derenderer.options.behaviour.state_form, keep_form=False
        )
        ctx.last_seq = seqs[rid]
    return size


def _validated(wire: dict[str, Any]) -> Any:
    from schemas.derender import DerenderStreamState

    return DerenderStreamState.model_validate(wire)


if __name__ == "__main__":
    main()
