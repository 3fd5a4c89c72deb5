"""``derender-worker audit`` on JSON Lines files, and its comparison rules.

Recorded outputs come from the worker's core (``EnvelopeProcessor``, as ``replay`` runs it) on the
real Qwen3 demo streams; the audit's findings are checked against an independent comparison (the
golden cases' normalization, record by record).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.audit_streams import (
    ABSENT,
    DEMO_FLAGS,
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
from tests.golden_cases import normalize as golden_normalize
from tests.paths import REPO_ROOT
from worker.audit import IdRenamer, Progress, first_difference, normalize
from worker.cli import main
from worker.commands import audit as audit_command
from worker.core.parsing.families.mistral import mistral_tool_call_id
from worker.core.parsing.ids import random_tool_call_id


@pytest.fixture(autouse=True)
def _load_each_tokenizer_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit_command, "load_derenderer", shared_derenderer)


def audit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(["audit", *argv])
    return status, capsys.readouterr().err


def report_lines(path: Path) -> dict[str, dict[str, Any]]:
    lines = read_jsonl(path) if path.exists() else []
    return {line["request_id"]: line for line in lines}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[dict[str, Any]]]:
    """The demo streams interleaved, and their outputs under the demo configuration."""
    root = tmp_path_factory.mktemp("audit")
    inputs = round_robin(demo_envelopes())
    outputs = replay_outputs(DEMO_FLAGS, inputs)
    return write_jsonl(root / "in.jsonl", inputs), write_jsonl(root / "out.jsonl", outputs), outputs


def test_same_configuration_is_identical(
    demo: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, outputs, _ = demo
    report = tmp_path / "report.jsonl"
    status, err = audit(
        ["--input-file", str(inputs), "--output-file", str(outputs), "--report", str(report), *DEMO_FLAGS],
        capsys,
    )
    assert status == 0, err
    assert report.read_bytes() == b""  # one line per non-identical request: none
    assert "4 requests: 4 identical" in err
    assert "83 recorded outputs compared" in err


@pytest.mark.parametrize(
    "flags", [OTHER_TOOL_PARSER_FLAGS, NO_REASONING_FLAGS], ids=["qwen3_xml", "no-reasoning"]
)
def test_another_configuration_reports_exactly_the_changed_records(
    demo: Any, flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, outputs, recorded = demo
    report = tmp_path / "report.jsonl"
    status, err = audit(
        ["--input-file", str(inputs), "--output-file", str(outputs), "--report", str(report), *flags], capsys
    )
    rederendered = replay_outputs(flags, read_jsonl(inputs))
    expected = changed_records(recorded, rederendered)
    assert expected, "the configuration change must change some outputs"
    assert status == 1, err
    lines = report_lines(report)
    reported = {(rid, d["seq"]) for rid, line in lines.items() for d in line["differences"]}
    assert reported == expected
    assert {rid for rid, _ in expected} == set(lines)
    old_by_key = {(o["request_id"], o["seq"]): o for o in recorded}
    new_by_key = {(o["request_id"], o["seq"]): o for o in rederendered}
    for rid, line in lines.items():
        assert line["status"] == "differing"
        assert line["counts"] == {
            "differing": len(line["differences"]),
            "missing_output": 0,
            "extra_output": 0,
            "error_code_change": 0,
        }
        for difference in line["differences"]:
            old, new = old_by_key[(rid, difference["seq"])], new_by_key[(rid, difference["seq"])]
            # The path names a field whose values differ; the report quotes both as recorded and
            # as re-derendered (random ids differ anyway: compare those renamed).
            reported_old, reported_new = difference.get("old", ABSENT), difference.get("new", ABSENT)
            assert resolve(old, difference["path"]) == reported_old
            if "tool_calls" not in difference["path"]:
                assert resolve(new, difference["path"]) == reported_new
            assert golden_normalize([{"v": reported_old}]) != golden_normalize([{"v": reported_new}])
    if flags is NO_REASONING_FLAGS:
        # Reasoning becomes content: the first field that differs is the delta's content.
        first = lines["demo-reasoning"]["differences"][0]
        assert first["path"] == "body.chunk.choices[0].delta.content"
        assert first["old"] is None and first["new"].startswith("<think>")
    else:
        # qwen3_xml (an engine parser) defers whitespace-only content, and the hermes call it
        # does not parse stays out of tool_calls.
        reasoning = lines["demo-reasoning"]["differences"][0]
        assert (reasoning["path"], reasoning["old"], reasoning["new"]) == (
            "body.chunk.choices[0].delta.content",
            "\n\n",
            None,
        )
        call = next(d for d in lines["demo-tool"]["differences"] if "tool_calls" in d["path"])
        assert call["path"] == "body.chunk.choices[0].delta.tool_calls" and "new" not in call
        assert call["old"][0]["function"]["name"] == "get_weather"
        assert "demo-plain" not in lines and "demo-completion" not in lines


def test_tampered_deleted_and_duplicated_records_are_each_reported_once(
    demo: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, _, recorded = demo
    tampered, picked = tamper(recorded)
    outputs = write_jsonl(tmp_path / "tampered.jsonl", tampered)
    report = tmp_path / "report.jsonl"
    status, err = audit(
        ["--input-file", str(inputs), "--output-file", str(outputs), "--report", str(report), *DEMO_FLAGS],
        capsys,
    )
    assert status == 1
    lines = report_lines(report)
    assert set(lines) == {"demo-plain", "demo-reasoning", "demo-completion"}
    assert all(len(line["differences"]) == 1 for line in lines.values()), lines

    changed = lines["demo-plain"]
    [difference] = changed["differences"]
    original = next(o for o in recorded if o["request_id"] == "demo-plain" and o["seq"] == picked["tampered"])
    assert changed["status"] == "differing"
    assert difference["seq"] == picked["tampered"]
    assert difference["path"] == "body.chunk.choices[0].delta.content"
    assert difference["new"] == original["body"]["chunk"]["choices"][0]["delta"]["content"]
    assert difference["old"] != difference["new"] and difference["old"][:-1] == difference["new"][:-1]
    line_number = 1 + next(
        i
        for i, o in enumerate(tampered)
        if o["request_id"] == "demo-plain" and o["seq"] == picked["tampered"]
    )
    assert difference["at"] == {"file": "tampered.jsonl", "line": line_number}

    deleted = lines["demo-reasoning"]
    assert deleted["status"] == "missing_output"
    assert deleted["differences"] == [{"seq": picked["deleted"], "kind": "missing_output"}]

    duplicated = lines["demo-completion"]
    [difference] = duplicated["differences"]
    assert duplicated["status"] == "extra_output"
    assert (difference["seq"], difference["kind"], difference["duplicate"]) == (
        picked["duplicated"],
        "extra_output",
        True,
    )
    assert "1 differing, 1 missing output, 1 extra output" in err


def test_a_recorded_line_that_is_no_output_envelope_is_an_extra_output(
    demo: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, outputs, _ = demo
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(outputs.read_bytes() + b"not json\n")
    report = tmp_path / "report.jsonl"
    argv = ["--input-file", str(inputs), "--output-file", str(broken), "--report", str(report)]
    status, err = audit([*argv, *DEMO_FLAGS], capsys)
    assert status == 1
    [line] = read_jsonl(report)
    assert line["status"] == "extra_output"
    assert line["differences"] == [
        {
            "seq": None,
            "kind": "extra_output",
            "duplicate": False,
            "at": {"file": "broken.jsonl", "line": 84},
            "reason": "not an output envelope",
        }
    ]
    assert "1 unreadable" in err


def test_an_error_code_change_is_its_own_kind(
    demo: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, outputs, _ = demo
    report = tmp_path / "report.jsonl"
    # A smaller context window: records past it are rejected (400) where the recording has chunks.
    status, _ = audit(
        [
            "--input-file",
            str(inputs),
            "--output-file",
            str(outputs),
            "--report",
            str(report),
            "--max-model-len",
            "200",
            *DEMO_FLAGS,
        ],
        capsys,
    )
    assert status == 1
    line = report_lines(report)["demo-tool"]  # 175 prompt tokens: the first one to overflow
    assert line["status"] == "error_code_change"
    first = line["differences"][0]
    assert (first["path"], first["old"], first["new"]) == ("error.code", None, 400)


def test_a_range_starting_mid_request_resumes_from_carried_state_or_is_partial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envelopes = demo_envelopes()
    stream = round_robin(envelopes + with_carried_state(envelopes, DEMO_FLAGS))
    outputs = write_jsonl(tmp_path / "out.jsonl", replay_outputs(DEMO_FLAGS, stream))
    cut = 30  # every request is past its first record here
    assert all(e["seq"] > 0 for e in stream[cut : cut + 7])
    inputs = write_jsonl(tmp_path / "in.jsonl", stream[cut:])
    report = tmp_path / "report.jsonl"
    status, err = audit(
        ["--input-file", str(inputs), "--output-file", str(outputs), "--report", str(report), *DEMO_FLAGS],
        capsys,
    )
    assert status == 0, err  # partial requests are reported, not counted as differences
    lines = report_lines(report)
    plain = {e["request_id"] for e in envelopes}
    assert set(lines) == plain  # the carried copies resumed and are identical
    for rid, line in lines.items():
        first = next(e["seq"] for e in stream[cut:] if e["request_id"] == rid)
        assert line["status"] == "partial"
        assert line["seqs"][0] == first
    assert "3 resumed from a carried stream_state" in err
    assert "4 partial" in err


def test_emit_file_writes_the_rederendered_outputs(
    demo: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, outputs, _ = demo
    emitted = tmp_path / "emitted.jsonl"
    status, _ = audit(
        [
            "--input-file",
            str(inputs),
            "--output-file",
            str(outputs),
            "--emit-file",
            str(emitted),
            *NO_REASONING_FLAGS,
        ],
        capsys,
    )
    assert status == 1
    expected = replay_outputs(NO_REASONING_FLAGS, read_jsonl(inputs))
    assert golden_normalize(read_jsonl(emitted)) == golden_normalize(expected)
    # And the corrected stream audits clean under the new configuration.
    status, err = audit(
        ["--input-file", str(inputs), "--output-file", str(emitted), *NO_REASONING_FLAGS], capsys
    )
    assert status == 0, err


def test_usage_errors_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = audit(
        ["--input-file", str(tmp_path / "nope.jsonl"), "--output-file", "x", *DEMO_FLAGS], capsys
    )
    assert status == 2 and err.count("\n") == 1 and "no such file" in err
    status, err = audit(["--input-file", str(tmp_path / "x"), "--from-offset", "3", *DEMO_FLAGS], capsys)
    assert status == 2 and "not of --input-file" in err
    status, err = audit(["--bootstrap-servers", "k:9092", "--from-offset", "notanumber", *DEMO_FLAGS], capsys)
    assert status == 2 and err.count("\n") == 1 and "--from-offset: Input should be a valid integer" in err


def test_unreachable_broker_exits_2_with_one_line(tmp_path: Path) -> None:
    inputs = write_jsonl(tmp_path / "in.jsonl", demo_envelopes()[:2])
    command = [sys.executable, "-m", "worker.cli", "audit", "--input-file", str(inputs)]
    command += ["--bootstrap-servers", "127.0.0.1:9", *DEMO_FLAGS]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("derender-worker audit: Kafka at 127.0.0.1:9: ")


# --- the comparison rules ------------------------------------------------------------------------


def test_only_random_tool_call_ids_and_created_are_normalized() -> None:
    def record(ids: list[str], created: int) -> dict[str, Any]:
        calls = [
            {"index": i, "id": v, "type": "function", "function": {"name": "f"}} for i, v in enumerate(ids)
        ]
        return {
            "request_id": "r",
            "seq": 0,
            "endpoint": "chat",
            "source": {"topic": "t", "partition": 0, "offset": created},
            "body": {
                "chunk": {"created": created, "choices": [{"delta": {"tool_calls": calls}}]},
                "stream_state": {"last_tool_call_ids": ids},
            },
        }

    hermes_a = ["chatcmpl-tool-0123456789abcdef", "chatcmpl-tool-aaaaaaaaaaaaaaaa"]
    hermes_b = ["chatcmpl-tool-fedcba9876543210", "chatcmpl-tool-bbbbbbbbbbbbbbbb"]
    assert normalize(record(hermes_a, 1), IdRenamer()) == normalize(record(hermes_b, 2), IdRenamer())
    mistral = normalize(record(["a1B2c3D4e"], 1), IdRenamer())
    assert mistral == normalize(record(["Zz9Yy8Xx7"], 5), IdRenamer())
    # Ids a model wrote (kimi_k2) are data: a change is a difference.
    kimi_a = normalize(record(["functions.get_weather:0"], 1), IdRenamer())
    kimi_b = normalize(record(["functions.get_weather:1"], 1), IdRenamer())
    assert first_difference(kimi_a, kimi_b) == (
        "body.chunk.choices[0].delta.tool_calls[0].id",
        "functions.get_weather:0",
        "functions.get_weather:1",
    )
    # Renaming follows each side's stream: ids that later come back in another order differ.
    old_ids, new_ids = IdRenamer(), IdRenamer()
    assert normalize(record(hermes_a, 1), old_ids) == normalize(record(hermes_b, 1), new_ids)
    later_old = normalize(record(hermes_a, 1), old_ids)
    later_new = normalize(record(list(reversed(hermes_b)), 1), new_ids)
    found = first_difference(later_old, later_new)
    assert found is not None and found[0] == "body.chunk.choices[0].delta.tool_calls[0].id"


def test_the_renamed_formats_are_the_ones_the_parsers_generate() -> None:
    """Ids made by the generators are renamed (a format change would otherwise show as differences)."""
    for make in (random_tool_call_id, mistral_tool_call_id):
        renamer = IdRenamer()
        made = [make() for _ in range(200)]
        assert [renamer(i) for i in made] == [f"<random-tool-call-id-{n}>" for n in range(200)]


def test_first_difference_compares_json_types_and_absent_fields() -> None:
    assert first_difference({"a": 1}, {"a": 1.0}) == ("a", 1, 1.0)
    assert first_difference({"a": [1, True]}, {"a": [1, 1]}) == ("a[1]", True, 1)
    found = first_difference({"a": {"b": 1}}, {"a": {"b": 1, "c": None}})
    assert found is not None and found[0] == "a.c" and found[2] is None
    found = first_difference({"a": [1, 2]}, {"a": [1]})
    assert found is not None and found[:2] == ("a[1]", 2)
    assert first_difference({"x": [{"y": "é"}]}, {"x": [{"y": "é"}]}) is None


def test_progress_bar_draws_on_a_terminal() -> None:
    stream = io.StringIO()
    progress = Progress(stream, force=True)
    progress.start("derendering inputs", Progress.MIN_RECORDS)
    progress.advance(Progress.MIN_RECORDS)
    progress.stop()
    assert "derendering inputs" in stream.getvalue()
    quiet = io.StringIO()
    short = Progress(quiet, force=True)
    short.start("derendering inputs", 10)  # a short range gets no bar
    short.stop()
    assert quiet.getvalue() == ""


def test_a_request_that_cannot_be_compared_is_an_error_not_a_difference(
    demo: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recorded output nested 300 deep crashed the audit with exit 1, the code for differences."""
    inputs, _, recorded = demo
    deep: Any = "x"
    for _ in range(300):
        deep = {"d": deep}
    target = next(i for i, o in enumerate(recorded) if o["request_id"] == "demo-plain" and o["seq"] == 1)
    nested = [
        {**o, "body": {**o["body"], "chunk": {**o["body"]["chunk"], "deep": deep}}} if i == target else o
        for i, o in enumerate(recorded)
    ]
    outputs = tmp_path / "deep.jsonl"
    outputs.write_text("".join(json.dumps(o) + "\n" for o in nested))  # orjson stops at 255 levels
    report = tmp_path / "report.jsonl"
    argv = ["--input-file", str(inputs), "--output-file", str(outputs), "--report", str(report)]
    status, err = audit([*argv, *DEMO_FLAGS], capsys)
    assert status == 3, err
    line = report_lines(report)["demo-plain"]
    assert line["status"] == "error" and "differences" not in line, line
    assert line["reason"]
    assert "1 could not be compared (error)" in err
    assert "DIFFERENCES FOUND" not in err
