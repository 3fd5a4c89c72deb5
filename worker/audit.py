"""``derender-worker audit``: would today's worker write what the output holds, record for record?

The inputs run through the same ``EnvelopeProcessor`` (same core, same state rules) as the
worker's, one processor per input partition as in the worker; each result is paired with the
recorded output for the same input record: by ``source`` (input topic, partition, offset) when
both sides know it, else by ``request_id`` + ``seq``. Per request the pairs are compared in input
order after the two normalizations of docs/compatibility.md and nothing else: ``created`` (a clock) and random
tool-call ids (``chatcmpl-tool-`` + 16 hex digits, and the ``mistral`` parser's 9 alphanumerics),
renamed by order of first appearance on each side. Ids a model wrote (``kimi_k2``) stay as they are.

A request that started before the range is resumed when its first record in the range carries
a ``stream_state``; otherwise it is ``partial``: reported, never compared (its context is unknown).
A request whose comparison itself fails (e.g. a recorded output nested deeper than JSON tools go) is
``error``: reported with why, never counted as a difference.

Exit status: ``EXIT_IDENTICAL`` 0, ``EXIT_DIFFERENCES`` 1 (wins over errors: a difference is a finding),
``EXIT_USAGE`` 2 (usage, connection, an empty or inverted range), ``EXIT_ERRORS`` 3 (no difference,
but some requests could not be compared).

This module is the engine, the report and the file mode; reading and writing Kafka is
``worker.runtime.audit_source``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import orjson

from worker.assembly import origin_name
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.parsing.families.mistral import MISTRAL_TOOL_CALL_ID
from worker.core.parsing.ids import RANDOM_TOOL_CALL_ID
from worker.errors import AuditUsageError
from worker.settings import AuditFiles

JsonDict = dict[str, Any]
Position = tuple[str, int, int]  # input topic, partition, offset

DIFFERING = "differing"
MISSING = "missing_output"
EXTRA = "extra_output"
ERROR_CODE = "error_code_change"
PARTIAL = "partial"
IDENTICAL = "identical"
ERROR = "error"  # the comparison of this request failed: not a difference, not identical
KINDS = (DIFFERING, MISSING, EXTRA, ERROR_CODE)
EXIT_IDENTICAL, EXIT_DIFFERENCES, EXIT_USAGE, EXIT_ERRORS = 0, 1, 2, 3
SHOWN_DIFFERENCES = 10

# The random tool-call id formats; nothing else is renamed.
_RANDOM_IDS = (RANDOM_TOOL_CALL_ID, MISTRAL_TOOL_CALL_ID)
_ABSENT = object()


# --- normalization and comparison (pure) --------------------------------------------------------


class IdRenamer:
    """Renames random tool-call ids by order of first appearance (one per request and side)."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, str) or not any(p.fullmatch(value) for p in _RANDOM_IDS):
            return value
        return self.names.setdefault(value, f"<random-tool-call-id-{len(self.names)}>")


def normalize(record: JsonDict, rename: IdRenamer) -> JsonDict:
    """``record`` without ``source`` (the matching key), ``created`` → 0 and random ids renamed.

    Only where the output format puts them: a chunk's or response's ``created``, the tool calls'
    ``id`` in ``choices[].delta`` / ``choices[].message``, and ``stream_state.last_tool_call_ids``.
    Copies what it changes, nothing else.
    """
    out = {k: v for k, v in record.items() if k != "source"}
    body = out.get("body")
    if not isinstance(body, dict):
        return out
    body = out["body"] = dict(body)
    chunk = body.get("chunk")
    holder, part = body, "message"
    if isinstance(chunk, dict):
        holder = body["chunk"] = dict(chunk)
        part = "delta"
    for where in (body, holder):
        if isinstance(where.get("created"), int):
            where["created"] = 0
    choices = holder.get("choices")
    if isinstance(choices, list):
        holder["choices"] = [_rename_calls(choice, part, rename) for choice in choices]
    state = body.get("stream_state")
    if isinstance(state, dict) and isinstance(state.get("last_tool_call_ids"), list):
        body["stream_state"] = {
            **state,
            "last_tool_call_ids": [rename(i) for i in state["last_tool_call_ids"]],
        }
    return out


def _rename_calls(choice: Any, part: str, rename: IdRenamer) -> Any:
    message = choice.get(part) if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        return choice
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return choice
    renamed = [{**c, "id": rename(c["id"])} if isinstance(c, dict) and "id" in c else c for c in calls]
    return {**choice, part: {**message, "tool_calls": renamed}}


Part = str | int


def first_difference(old: Any, new: Any) -> tuple[str, Any, Any] | None:
    """The first field where ``old`` and ``new`` differ: (JSON path, old, new), ``_ABSENT`` for a gap."""
    found = _first_difference(old, new, ())
    return None if found is None else (_path(found[0]), found[1], found[2])


def _path(parts: tuple[Part, ...]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _at(record: Any, parts: tuple[Part, ...]) -> Any:
    for part in parts:
        try:
            record = record[part]
        except (KeyError, IndexError, TypeError):
            return _ABSENT
    return record


def _first_difference(
    old: Any, new: Any, parts: tuple[Part, ...]
) -> tuple[tuple[Part, ...], Any, Any] | None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key, value in old.items():
            if key not in new:
                return (*parts, key), value, _ABSENT
            found = _first_difference(value, new[key], (*parts, key))
            if found is not None:
                return found
        for key, value in new.items():
            if key not in old:
                return (*parts, key), _ABSENT, value
        return None
    if isinstance(old, list) and isinstance(new, list):
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            found = _first_difference(a, b, (*parts, i))
            if found is not None:
                return found
        if len(old) != len(new):
            i = min(len(old), len(new))
            return (*parts, i), old[i] if i < len(old) else _ABSENT, new[i] if i < len(new) else _ABSENT
        return None
    # JSON types, not Python equality: true is not 1, 1 is not 1.0.
    if type(old) is not type(new) or old != new:
        return parts, old, new
    return None


def _error_code(record: JsonDict) -> int | None:
    error = record.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        return code if isinstance(code, int) else -1
    return None


# --- the engine ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Recorded:
    """One recorded output record and where it sits (``at``: a Kafka position or a file line)."""

    value: bytes
    at: JsonDict
    request_id: str | None = None
    seq: int | None = None


@dataclass(slots=True)
class _Slot:
    """One input record of a request: what the audit derendered for it, what was recorded for it."""

    seq: int
    new: bytes
    recorded: list[Recorded] = field(default_factory=list)


@dataclass(slots=True)
class _Request:
    request_id: str
    endpoint: str | None = None
    origin: JsonDict | None = None  # the API it came in on (Messages, Responses, Batch), when known
    records: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    resumed: bool = False
    partial: bool = False
    recorded_for_partial: int = 0
    slots: list[_Slot] = field(default_factory=list)
    unmatched: list[Recorded] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class InputRange:
    """The Kafka positions read from the input topic: ``partition -> (first, end)`` (end exclusive)."""

    topic: str
    partitions: dict[int, tuple[int, int]]

    def contains(self, topic: Any, partition: Any, offset: Any) -> bool:
        span = self.partitions.get(partition) if topic == self.topic and isinstance(partition, int) else None
        return span is not None and isinstance(offset, int) and span[0] <= offset < span[1]


@dataclass(slots=True)
class AuditCounts:
    inputs: int = 0
    dead_letters: int = 0
    duplicates: int = 0
    derendered: int = 0
    recorded: int = 0
    recorded_ignored: int = 0  # outside the range
    unreadable: int = 0


class Auditor:
    """Feed every input (``add_input``) first, then every recorded output (``add_recorded``), then
    ``finish``. Memory grows with the range: the derendered and the recorded outputs are held (as
    bytes) until the end, because random ids are renamed in order per request.
    """

    def __init__(self, new_processor: Callable[[], EnvelopeProcessor]) -> None:
        self._new_processor = new_processor
        self._processors: dict[int | None, EnvelopeProcessor] = {}
        self.requests: dict[str, _Request] = {}
        self.input_range: InputRange | None = None  # set when the inputs come from Kafka
        # Inputs from a file, outputs from a topic: the topic's other requests are not this audit's.
        self.ignore_unknown_requests = False
        self.counts = AuditCounts()
        self._by_source: dict[Position, tuple[_Request, _Slot]] = {}
        self._by_seq: dict[tuple[str, int], tuple[_Request, _Slot]] = {}
        self.first_timestamp_ms: int | None = None

    # --- inputs ----------------------------------------------------------------------------------

    def add_input(
        self,
        value: bytes,
        key: bytes | None = None,
        source: Position | None = None,
        timestamp_ms: int | None = None,
    ) -> tuple[str, bytes] | None:
        """Derender one input record; the output to emit (with ``source``) and its request id, if any."""
        self.counts.inputs += 1
        if timestamp_ms is not None and (
            self.first_timestamp_ms is None or timestamp_ms < self.first_timestamp_ms
        ):
            self.first_timestamp_ms = timestamp_ms
        partition = source[1] if source is not None else None
        processor = self._processors.get(partition)
        if processor is None:
            processor = self._processors[partition] = self._new_processor()
        at = None if source is None else {"topic": source[0], "partition": source[1], "offset": source[2]}
        result = processor.process(value, key, source=at)
        if result.request_id is None or result.dead_letter is not None:
            self.counts.dead_letters += 1
            return None
        if result.output is None and not result.duplicate:
            return None  # a close record: nothing is written, nothing to compare
        rid = result.request_id
        request = self.requests.get(rid)
        output = result.output
        if request is None:
            request = self.requests[rid] = _Request(rid)
            seq = output.get("seq") if output is not None else None
            if isinstance(seq, int) and seq > 0 and output is not None:
                if _error_code(output) == 409:
                    request.partial = True  # started before the range, no carried state: unknown
                else:
                    body = output.get("body")
                    request.resumed = isinstance(body, dict) and "stream_state" in body
        request.records += 1
        if request.partial:
            if output is not None:
                self._note_seq(request, output)
            return None
        if output is None:
            self.counts.duplicates += 1  # the worker writes nothing for it either
            return None
        self._note_seq(request, output)
        data = result.payload
        assert data is not None  # every output is serialized inside the processor's boundary
        slot = _Slot(output["seq"], data)
        request.slots.append(slot)
        self.counts.derendered += 1
        if source is not None:
            self._by_source[source] = (request, slot)
        self._by_seq.setdefault((rid, output["seq"]), (request, slot))
        return rid, data

    @staticmethod
    def _note_seq(request: _Request, output: JsonDict) -> None:
        seq = output.get("seq")
        if request.endpoint is None:
            request.endpoint = output.get("endpoint")
        if request.origin is None and isinstance(output.get("origin"), dict):
            request.origin = output["origin"]
        if isinstance(seq, int):
            if request.first_seq is None:
                request.first_seq = seq
            request.last_seq = seq

    # --- recorded outputs ------------------------------------------------------------------------

    def add_recorded(self, value: bytes, at: JsonDict, key: bytes | None = None) -> None:
        """Pair one recorded output record with the input it answers (or note it as extra)."""
        try:
            record = orjson.loads(value)
        except orjson.JSONDecodeError:
            record = None
        rid = record.get("request_id") if isinstance(record, dict) else None
        seq = record.get("seq") if isinstance(record, dict) else None
        if not isinstance(record, dict) or not isinstance(rid, str) or not isinstance(seq, int):
            self.counts.unreadable += 1
            name = key.decode("utf-8", errors="replace") if key is not None else "<unreadable>"
            self._request_for_extra(name).unmatched.append(Recorded(value, at))
            return
        recorded = Recorded(value, at, rid, seq)
        source = record.get("source")
        if self.input_range is not None:
            if isinstance(source, dict):
                position = (source.get("topic"), source.get("partition"), source.get("offset"))
                if not self.input_range.contains(*position):
                    self.counts.recorded_ignored += 1
                    return
                self.counts.recorded += 1
                found = self._by_source.get(position)  # type: ignore[arg-type]
                if found is not None:
                    found[1].recorded.append(recorded)
                else:
                    self._unmatched(recorded)
                return
            found = self._by_seq.get((rid, seq))
            if found is None:  # a record without source (a TTL closure) outside the range
                self.counts.recorded_ignored += 1
                return
            self.counts.recorded += 1
            found[1].recorded.append(recorded)
            return
        if self.ignore_unknown_requests and rid not in self.requests:
            self.counts.recorded_ignored += 1
            return
        request = self.requests.get(rid)
        if request is not None and request.first_seq is not None and seq < request.first_seq:
            self.counts.recorded_ignored += 1  # answers a record before the range
            return
        self.counts.recorded += 1
        found = self._by_seq.get((rid, seq))
        if found is not None:
            found[1].recorded.append(recorded)
        else:
            self._unmatched(recorded)

    def _unmatched(self, recorded: Recorded) -> None:
        assert recorded.request_id is not None
        request = self._request_for_extra(recorded.request_id)
        if request.partial:
            request.recorded_for_partial += 1
        else:
            request.unmatched.append(recorded)

    def _request_for_extra(self, rid: str) -> _Request:
        request = self.requests.get(rid)
        if request is None:
            request = self.requests[rid] = _Request(rid)
        return request

    # --- the verdict -----------------------------------------------------------------------------

    def finish(self) -> AuditReport:
        report = AuditReport(counts=self.counts)
        for request in self.requests.values():
            try:
                line = _judge(request)
            except Exception as exc:  # noqa: BLE001 - one request's failure is its own outcome
                line = {
                    "request_id": request.request_id,
                    "endpoint": request.endpoint,
                    "records": request.records,
                    "status": ERROR,
                    "reason": f"could not be compared: {exc!r}"[:1000],
                }
            if request.origin is not None:
                line = {"request_id": line["request_id"], "origin": request.origin, **line}
            report.add(line)
        return report


def _judge(request: _Request) -> JsonDict:
    line: JsonDict = {
        "request_id": request.request_id,
        "endpoint": request.endpoint,
        "records": request.records,
        "seqs": [request.first_seq, request.last_seq] if request.first_seq is not None else None,
    }
    if request.partial:
        line["status"] = PARTIAL
        line["reason"] = (
            f"the range starts at seq {request.first_seq} of this request, whose record carries no "
            "stream_state: its earlier context is not in the range, so it was not compared"
        )
        line["recorded_outputs"] = sum(len(s.recorded) for s in request.slots) + request.recorded_for_partial
        return line
    if request.resumed:
        line["resumed_from_seq"] = request.first_seq
    differences: list[JsonDict] = []
    old_ids, new_ids = IdRenamer(), IdRenamer()
    matched_seqs: set[int] = set()
    for slot in request.slots:
        if not slot.recorded:
            differences.append({"seq": slot.seq, "kind": MISSING})
            # The new side still meets its ids in order.
            normalize(orjson.loads(slot.new), new_ids)
            continue
        first, *rest = slot.recorded
        matched_seqs.add(slot.seq)
        found = _compare(orjson.loads(first.value), orjson.loads(slot.new), old_ids, new_ids)
        if found is not None:
            differences.append({"seq": slot.seq, **found, "at": first.at})
        differences.extend(_extra(r, duplicate=True) for r in rest)
    for recorded in request.unmatched:
        differences.append(_extra(recorded, duplicate=recorded.seq in matched_seqs))
    differences.sort(key=lambda d: d["seq"] if isinstance(d["seq"], int) else -1)
    counts = {kind: 0 for kind in KINDS}
    for difference in differences:
        counts[difference["kind"]] += 1
    line["status"] = differences[0]["kind"] if differences else IDENTICAL
    line["counts"] = counts
    line["differences"] = differences
    return line


def _extra(recorded: Recorded, *, duplicate: bool) -> JsonDict:
    extra = {"seq": recorded.seq, "kind": EXTRA, "duplicate": duplicate, "at": recorded.at}
    if recorded.request_id is None:
        extra["reason"] = "not an output envelope"
    return extra


def _compare(old: Any, new: JsonDict, old_ids: IdRenamer, new_ids: IdRenamer) -> JsonDict | None:
    new_n = normalize(new, new_ids)
    if not isinstance(old, dict):
        return {"kind": DIFFERING, "path": "", "old": old, "new": new_n}
    old_n = normalize(old, old_ids)
    old_code, new_code = _error_code(old_n), _error_code(new_n)
    if old_code != new_code:
        return {"kind": ERROR_CODE, "path": "error.code", "old": old_code, "new": new_code}
    if orjson.dumps(old_n) == orjson.dumps(new_n):  # the common case, without a walk in Python
        return None
    found = _first_difference(old_n, new_n, ())
    if found is None:
        return None
    # Found on the normalized records, quoted from the recorded ones (real ids, real times).
    parts = found[0]
    old_value, new_value = _at(old, parts), _at(new, parts)
    out: JsonDict = {"kind": DIFFERING, "path": _path(parts)}
    if old_value is not _ABSENT:  # an absent key on one side: that side has no value key
        out["old"] = old_value
    if new_value is not _ABSENT:
        out["new"] = new_value
    return out


# --- the report ---------------------------------------------------------------------------------


@dataclass(slots=True)
class AuditReport:
    counts: AuditCounts
    statuses: dict[str, int] = field(
        default_factory=lambda: {s: 0 for s in (IDENTICAL, *KINDS, PARTIAL, ERROR)}
    )
    lines: list[JsonDict] = field(default_factory=list)  # one per non-identical request
    resumed: int = 0

    def add(self, line: JsonDict) -> None:
        self.statuses[line["status"]] += 1
        if "resumed_from_seq" in line:
            self.resumed += 1
        if line["status"] != IDENTICAL:
            self.lines.append(line)

    @property
    def differs(self) -> bool:
        return any(self.statuses[kind] for kind in KINDS)

    @property
    def exit_status(self) -> int:
        if self.differs:
            return EXIT_DIFFERENCES
        return EXIT_ERRORS if self.statuses[ERROR] else EXIT_IDENTICAL

    def write_jsonl(self, out: BinaryIO) -> None:
        for line in self.lines:
            out.write(orjson.dumps(line) + b"\n")

    def summary(self) -> str:
        s, c = self.statuses, self.counts
        total = sum(s.values())
        text = [
            f"audit: {total} requests: {s[IDENTICAL]} identical, {s[DIFFERING]} differing, "
            f"{s[MISSING]} missing output, {s[EXTRA]} extra output, {s[ERROR_CODE]} error-code change, "
            f"{s[PARTIAL]} partial (not compared), {s[ERROR]} could not be compared (error); "
            f"{self.resumed} resumed from a carried stream_state",
            f"audit: {c.inputs} input records ({c.derendered} derendered, {c.duplicates} duplicates, "
            f"{c.dead_letters} not envelopes), {c.recorded} recorded outputs compared"
            + (f", {c.recorded_ignored} outside the range" if c.recorded_ignored else "")
            + (f", {c.unreadable} unreadable" if c.unreadable else ""),
        ]
        differing = [line for line in self.lines if line.get("differences")]
        if differing:
            text.append("first difference per request:")
        for line in differing[:SHOWN_DIFFERENCES]:
            n = len(line["differences"])
            more = f" (and {n - 1} more record{'s' if n > 2 else ''})" if n > 1 else ""
            named = origin_name(line.get("origin"))
            who = line["request_id"] if named is None else f"{line['request_id']} ({named})"
            text.append(f"  {who} {_describe(line['differences'][0])}{more}")
        if len(differing) > SHOWN_DIFFERENCES:
            text.append(f"  ... {len(differing) - SHOWN_DIFFERENCES} more requests differ (see --report)")
        if self.differs:
            verdict = "DIFFERENCES FOUND"
        elif s[ERROR]:
            verdict = f"no difference found, but {s[ERROR]} request(s) could not be compared (see --report)"
        else:
            verdict = "everything compared is identical"
        text.append(f"audit: {verdict}")
        return "\n".join(text)


def _short(value: Any, limit: int = 80) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _describe(difference: JsonDict) -> str:
    where = f"seq {difference['seq']}"
    kind = difference["kind"]
    if kind == EXTRA:
        what = " (duplicate)" if difference["duplicate"] else ""
        if "reason" in difference:
            what = f" ({difference['reason']})"
        return f"{where}: extra output{what} at {difference['at']}"
    if kind == MISSING:
        return f"{where}: missing output"
    old = _short(difference["old"]) if "old" in difference else "(absent)"
    new = _short(difference["new"]) if "new" in difference else "(absent)"
    return f"{where}: {kind.replace('_', ' ')} at {difference['path'] or '<record>'}: {old} -> {new}"


# --- progress -----------------------------------------------------------------------------------


class Progress:
    """A progress bar on stderr while a long range is read (only on a terminal)."""

    MIN_RECORDS = 1000

    def __init__(self, stream: TextIO | None = None, *, force: bool = False) -> None:
        from rich.console import Console

        self.console = Console(
            file=stream if stream is not None else sys.stderr, force_terminal=force or None
        )
        self._bar: Any = None
        self._task: Any = None

    def start(self, label: str, total: float | None) -> None:
        self.stop()
        if not self.console.is_terminal or (total is not None and total < self.MIN_RECORDS):
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import (
            Progress as Bar,
        )

        self._bar = Bar(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(label, total=total)

    def advance(self, amount: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, amount)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


# --- file mode ----------------------------------------------------------------------------------


def file_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines of a JSON Lines file with their 1-based numbers."""
    with open(path, "rb") as source:
        for number, line in enumerate(source, start=1):
            value = line.strip()
            if value:
                yield number, value


def count_lines(path: str) -> int:
    with open(path, "rb") as source:
        return sum(1 for line in source if line.strip())


def feed_input_file(auditor: Auditor, path: str, emit: BinaryIO | None, progress: Progress) -> None:
    progress.start("derendering inputs", count_lines(path))
    for _, value in file_lines(path):
        emitted = auditor.add_input(value)
        if emitted is not None and emit is not None:
            emit.write(emitted[1] + b"\n")
        progress.advance()
    progress.stop()


def feed_output_file(auditor: Auditor, path: str, progress: Progress) -> None:
    progress.start("reading recorded outputs", count_lines(path))
    name = Path(path).name
    for number, value in file_lines(path):
        auditor.add_recorded(value, {"file": name, "line": number})
        progress.advance()
    progress.stop()


def finish(report: AuditReport, options: AuditFiles, err: TextIO) -> int:
    """Write ``--report`` and the summary; the exit status."""
    if options.report:
        with open(options.report, "wb") as out:
            report.write_jsonl(out)
    print(report.summary(), file=err)
    return report.exit_status


def check_files(options: AuditFiles) -> None:
    for path in (options.input_file, options.output_file):
        if path and not Path(path).is_file():
            raise AuditUsageError(f"no such file: {path}")


def audit_files(options: AuditFiles, processor_factory: Callable[[], EnvelopeProcessor], err: TextIO) -> int:
    """The audit of ``--input-file`` against ``--output-file`` (no Kafka)."""
    auditor = Auditor(processor_factory)
    progress = Progress(err)
    assert options.input_file and options.output_file  # both files, or the audit needs Kafka
    emit_file = open(options.emit_file, "wb") if options.emit_file else None  # noqa: SIM115
    try:
        feed_input_file(auditor, options.input_file, emit_file, progress)
    finally:
        if emit_file is not None:
            emit_file.close()
    feed_output_file(auditor, options.output_file, progress)
    return finish(auditor.finish(), options, err)
