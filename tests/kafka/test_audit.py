"""``derender-worker audit`` against a stream the worker wrote on the real broker.

One ``derender-worker run`` process derenders the recorded Qwen3 demo streams (partition 0: the
streams and a copy that carries ``stream_state`` on every record, interleaved; partition 1: another
copy of the streams); the audits then read those topics, and copies of the output topic that were
tampered with, as an operator would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.async_helpers import run_bounded
from tests.audit_streams import (
    DEMO_FLAGS,
    DEMO_VERSION,
    NO_REASONING_FLAGS,
    OTHER_TOOL_PARSER_FLAGS,
    changed_records,
    demo_envelopes,
    read_jsonl,
    replay_outputs,
    resolve,
    round_robin,
    shared_derenderer,
    tamper,
    with_carried_state,
    write_jsonl,
)
from tests.golden_cases import normalize, sample_config
from tests.kafka_broker import TopicFactory
from tests.kafka_helpers import TopicReader, WorkerGroup, WorkerTopics, make_worker_topics, produce
from worker.cli import main
from worker.commands import audit as audit_command

pytestmark = pytest.mark.kafka

DEMO_CONFIG = sample_config(parsers=True, served_model_name="qwen3-demo")


@pytest.fixture(autouse=True)
def _load_each_tokenizer_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit_command, "load_derenderer", shared_derenderer)


@dataclass
class Recorded:
    bootstrap: str
    topics: WorkerTopics
    partition0: list[dict[str, Any]]  # input envelopes, in offset order
    partition1: list[dict[str, Any]]
    outputs: list[Any]  # the output topic's records
    factory: TopicFactory

    def flags(self, output_topic: str | None = None) -> list[str]:
        return [
            "--bootstrap-servers",
            self.bootstrap,
            "--input-topic",
            self.topics.input,
            "--output-topic",
            output_topic or self.topics.output,
        ]


def _records(envelopes: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    return [(e["request_id"].encode(), orjson.dumps(e)) for e in envelopes]


async def _read_all(bootstrap: str, topic: str, count: int) -> list[Any]:
    reader = await TopicReader(bootstrap, topic).start()
    try:
        await reader.wait_for(count, 120, f"records of {topic}")
        await reader.settle(1.0)
        return sorted(reader.records, key=lambda r: (r.partition, r.offset))
    finally:
        await reader.stop()


@pytest.fixture(scope="module")
def recorded(kafka_bootstrap: str) -> Iterator[Recorded]:
    factory = TopicFactory(kafka_bootstrap)
    try:
        topics = make_worker_topics(factory, partitions=2)
        envelopes = demo_envelopes()
        partition0 = round_robin(envelopes + with_carried_state(envelopes, DEMO_FLAGS))
        partition1 = [
            {**e, "request_id": e["request_id"] + "-p1", "body": {**e["body"]}}
            for e in round_robin(envelopes)
        ]
        group = WorkerGroup(kafka_bootstrap, topics, DEMO_CONFIG, version=DEMO_VERSION)

        async def body() -> list[Any]:
            await produce(kafka_bootstrap, topics.input, _records(partition0), partition=0)
            await produce(kafka_bootstrap, topics.input, _records(partition1), partition=1)
            group.start()
            try:
                return await _read_all(kafka_bootstrap, topics.output, len(partition0) + len(partition1))
            finally:
                assert group.stop_all() == [0], group.logs()

        outputs = run_bounded(body(), 240)
        yield Recorded(kafka_bootstrap, topics, partition0, partition1, outputs, factory)
    finally:
        factory.cleanup()


def audit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(["audit", *argv])
    return status, capsys.readouterr().err


def report_of(path: Path) -> dict[str, dict[str, Any]]:
    return {line["request_id"]: line for line in (read_jsonl(path) if path.exists() else [])}


def test_the_same_configuration_finds_the_worker_stream_identical(
    recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.jsonl"
    status, err = audit([*recorded.flags(), "--report", str(report), *DEMO_FLAGS], capsys)
    assert status == 0, err
    assert report.read_bytes() == b""
    total = len(recorded.partition0) + len(recorded.partition1)
    assert "11 requests: 11 identical" in err
    assert f"{total} recorded outputs compared" in err


@pytest.mark.parametrize(
    "flags", [OTHER_TOOL_PARSER_FLAGS, NO_REASONING_FLAGS], ids=["qwen3_xml", "no-reasoning"]
)
def test_another_configuration_reports_exactly_the_records_whose_output_changes(
    recorded: Recorded, flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.jsonl"
    status, err = audit([*recorded.flags(), "--report", str(report), *flags], capsys)
    assert status == 1, err
    old = [orjson.loads(r.value) for r in recorded.outputs]
    new = replay_outputs(flags, recorded.partition0) + replay_outputs(flags, recorded.partition1)
    expected = changed_records(old, new)
    lines = report_of(report)
    assert {(rid, d["seq"]) for rid, line in lines.items() for d in line["differences"]} == expected
    old_by_key = {(o["request_id"], o["seq"]): o for o in old}
    for rid, line in lines.items():
        assert line["status"] == "differing"
        for difference in line["differences"]:
            # Quoted from the recorded record; located in the output topic by its position.
            record = old_by_key[(rid, difference["seq"])]
            assert resolve(record, difference["path"]) == difference["old"]
            assert difference["at"]["topic"] == recorded.topics.output
            assert record["source"]["topic"] == recorded.topics.input


def _copy_tampered(recorded: Recorded) -> tuple[str, dict[str, int]]:
    """A copy of the output topic with one delta changed, one record deleted, one duplicated."""
    tampered, picked = tamper([orjson.loads(r.value) for r in recorded.outputs])
    topic = recorded.factory("derender-out-tampered", partitions=2)
    values = [(o["request_id"].encode(), orjson.dumps(o)) for o in tampered]
    asyncio.run(produce(recorded.bootstrap, topic, values))
    return topic, picked


def test_tampered_deleted_and_duplicated_outputs_are_each_reported_once_and_files_agree(
    recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, picked = _copy_tampered(recorded)
    report = tmp_path / "kafka.jsonl"
    status, _ = audit([*recorded.flags(topic), "--report", str(report), *DEMO_FLAGS], capsys)
    assert status == 1
    lines = report_of(report)
    assert set(lines) == {"demo-plain", "demo-reasoning", "demo-completion"}
    assert [d["seq"] for d in lines["demo-plain"]["differences"]] == [picked["tampered"]]
    assert lines["demo-plain"]["differences"][0]["path"] == "body.chunk.choices[0].delta.content"
    assert lines["demo-reasoning"]["differences"] == [{"seq": picked["deleted"], "kind": "missing_output"}]
    [duplicate] = lines["demo-completion"]["differences"]
    assert (duplicate["seq"], duplicate["kind"], duplicate["duplicate"]) == (
        picked["duplicated"],
        "extra_output",
        True,
    )
    assert duplicate["at"]["topic"] == topic

    # The same data as JSON Lines files (the topics dumped in offset order): the same findings,
    # under the same configuration and under another.
    copy = asyncio.run(_read_all(recorded.bootstrap, topic, len(recorded.outputs)))
    inputs = write_jsonl(tmp_path / "in.jsonl", recorded.partition0 + recorded.partition1)
    outputs = tmp_path / "out.jsonl"
    outputs.write_bytes(b"".join(r.value + b"\n" for r in copy))
    for flags in (DEMO_FLAGS, NO_REASONING_FLAGS):
        kafka_report, file_report = tmp_path / "k.jsonl", tmp_path / "f.jsonl"
        kafka_status, _ = audit([*recorded.flags(topic), "--report", str(kafka_report), *flags], capsys)
        file_status, _ = audit(
            [
                "--input-file",
                str(inputs),
                "--output-file",
                str(outputs),
                "--report",
                str(file_report),
                *flags,
            ],
            capsys,
        )
        assert kafka_status == file_status == 1
        assert _without_positions(report_of(kafka_report)) == _without_positions(report_of(file_report))


def _without_positions(lines: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Where each recorded output sits (a topic offset, a file line) is all that may differ."""
    out = {}
    for rid, line in lines.items():
        differences = [{k: v for k, v in d.items() if k != "at"} for d in line.get("differences", ())]
        out[rid] = {**line, "differences": differences}
    return out


def test_a_range_starting_mid_request_resumes_from_carried_state_or_reports_partial(
    recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut, stop = 30, 60
    report = tmp_path / "report.jsonl"
    argv = [*recorded.flags(), "--partition", "0", "--from-offset", str(cut), "--to-offset", str(stop)]
    status, err = audit([*argv, "--report", str(report), *DEMO_FLAGS], capsys)
    assert status == 0, err
    in_range = recorded.partition0[cut:stop]
    lines = report_of(report)
    carried = {e["request_id"] for e in in_range if e["request_id"].endswith("-carried")}
    plain = {e["request_id"] for e in in_range} - carried
    assert len(carried) == 3 and len(plain) == 4
    assert set(lines) == plain
    for rid in plain:
        assert lines[rid]["status"] == "partial"
        assert lines[rid]["seqs"][0] == next(e["seq"] for e in in_range if e["request_id"] == rid)
    assert "3 resumed from a carried stream_state" in err
    assert f"{stop - cut} input records" in err
    # Partition 1 joins the range: its requests are cut mid-way too, without carried state.
    status, err = audit([*argv, "--partition", "1", *DEMO_FLAGS], capsys)
    assert status == 0 and "8 partial" in err


def test_emit_topic_backfills_the_rederendered_stream(
    recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emit = recorded.factory("derender-backfill", partitions=2)
    emit_file = tmp_path / "backfill.jsonl"
    argv = [*recorded.flags(), "--emit-topic", emit, "--emit-file", str(emit_file)]
    status, _ = audit([*argv, *NO_REASONING_FLAGS], capsys)
    assert status == 1
    expected = replay_outputs(NO_REASONING_FLAGS, recorded.partition0) + replay_outputs(
        NO_REASONING_FLAGS, recorded.partition1
    )
    backfill = asyncio.run(_read_all(recorded.bootstrap, emit, len(expected)))
    emitted = [orjson.loads(r.value) for r in backfill]
    assert len(emitted) == len(expected)
    key = lambda o: (o["source"]["partition"], o["source"]["offset"])  # noqa: E731
    assert sorted(read_jsonl(emit_file), key=key) == sorted(emitted, key=key)  # the same records
    # Each record keeps the source of the input it answers, as the worker's own records do.
    sources = {
        (o["request_id"], o["seq"]): o["source"] for o in (orjson.loads(r.value) for r in recorded.outputs)
    }
    assert all(o["source"] == sources[(o["request_id"], o["seq"])] for o in emitted)
    by_request: dict[str, list[dict[str, Any]]] = {}
    for o in emitted:
        by_request.setdefault(o["request_id"], []).append({k: v for k, v in o.items() if k != "source"})
    for rid, outputs in by_request.items():
        assert normalize(outputs) == normalize([e for e in expected if e["request_id"] == rid])
    # The backfill is what the new configuration writes: it audits clean.
    status, err = audit([*recorded.flags(emit), *NO_REASONING_FLAGS], capsys)
    assert status == 0, err


def test_range_flags_are_checked(recorded: Recorded, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = audit([*recorded.flags(), "--partition", "5", *DEMO_FLAGS], capsys)
    assert status == 2 and "partitions 0..1" in err
    status, err = audit([*recorded.flags("no-such-topic"), *DEMO_FLAGS], capsys)
    assert status == 2 and "no-such-topic" in err
    # A time range after every record: nothing compared is no verdict (it was exit 0, "identical").
    status, err = audit([*recorded.flags(), "--from", "2999-01-01T00:00:00Z", *DEMO_FLAGS], capsys)
    assert status == 2 and "holds no record" in err and "identical" not in err
    size = len(recorded.partition0)
    assert f"partition 0 [{size}, {size}) of [0, {size})" in err  # the range as resolved
    # Beyond the end of every partition, and inverted: the same.
    status, err = audit([*recorded.flags(), "--from-offset", "100000", *DEMO_FLAGS], capsys)
    assert status == 2 and "holds no record" in err
    status, err = audit([*recorded.flags(), "--from-offset", "9", "--to-offset", "3", *DEMO_FLAGS], capsys)
    assert status == 2 and "inverted" in err
    status, err = audit(
        [*recorded.flags(), "--from", "2026-01-02T00:00:00Z", "--to", "2026-01-01T00:00:00Z", *DEMO_FLAGS],
        capsys,
    )
    assert status == 2 and "inverted" in err
