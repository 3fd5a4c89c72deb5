"""``derender-worker ingest``: the requests topic -> vLLM render + generate -> the worker's input topic.

One consumer-group member. For each ``RequestEnvelope`` it calls render, then generate, and turns
every SSE chunk into one input envelope (``seq`` 0, 1, 2, ...; the first carries ``model``,
``prompt_tokens``, ``prompt_token_ids`` and the request) keyed by ``request_id``. A non-streaming
request is one one-shot envelope. vLLM errors become the request's error record on the output topic.

Exactly-once, per requests partition ``p``: one transactional producer (``{group}-{topic}-{p}``, so
the next owner fences a zombie), committing every ``--commit-interval-ms`` the envelopes, error
records and markers produced since the last commit together with the partition's offset. That offset
is the oldest request still running, so a crash re-reads every unfinished request. The group member,
the producers and the restore's reader are the worker's client layer (``--kafka-client``), with the
worker's per-partition transactions (``delivery.Transaction``).

Resumability (the attempt rule): a request is generated at most once in a visible way. The
transaction that makes its first envelope visible also writes an ``IngestMarker`` ``started`` to
the requests topic, and the one with its last envelope a ``done`` marker. A restarted owner reads
the partition from the committed offset to its end before it starts: a request marked ``done`` is
skipped; one marked ``started`` but not ``done`` ends with an error record (503, "cut off") and is
not generated again, because a second generation would differ from the tokens already shown; one
without a marker was never visible and is generated (again) from scratch.

Every request ends (see the request-lifecycle docs): with its answer, or with one terminal error
record per stream that has records (``IngestErrorRecord``, at the stream's next ``seq``). A record
that would not fit ``--max-record-bytes`` is never sent: the request ends with a 413 instead, and a
record the producer refuses at commit time ends only its own request. ``--max-inflight`` counts
generate streams; requests read beyond it wait in a backlog (``--max-backlog``, ``--max-backlog-bytes``)
so cancels behind them are still read. A request's streams run as one task group: the first failure
cancels and aborts the others.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import aiohttp
import orjson
from pydantic import ValidationError

from schemas.envelope import Origin
from schemas.pipeline import CancelRecord, IngestMarker, RequestEnvelope
from worker import stop_signals
from worker.errors import PartitionNotAssignedError, RecordTooLargeError, UpstreamError
from worker.pipeline.connection import Connection, add_connection_arguments, wait_for_topics
from worker.pipeline.ingest_health import serving_health
from worker.pipeline.vllm_client import VllmClient
from worker.runtime.delivery import Transaction
from worker.runtime.kafka_client.base import (
    AssignmentStrategy,
    ClientKind,
    ConsumerConfig,
    GroupConsumer,
    KafkaClient,
    OutgoingRecord,
    Partitions,
    RebalanceCallbacks,
    TopicPartition,
)
from worker.runtime.kafka_client.ranges import RangeReader
from worker.runtime.observability.genai_metrics import request_start_header
from worker.runtime.observability.structured_logging import configure
from worker.runtime.observability.tracing import Headers, propagated
from worker.settings import IngestOptions, LoggingSettings, MetricsServerSettings, add_arguments, load

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
CANCELLED_CODE = 499  # nginx's "client closed request": nobody waits for this answer any more
# Bounded memory of cancels for requests not seen yet (a cancel may overtake nothing, but is cheap).
# Most are cancels of requests that already ended (an error answer is cancelled too): the oldest
# goes, so the set never fills with those and refuses the one whose request is still to come.
MAX_EARLY_CANCELS = 10_000


# A record's key, headers and batch framing on top of its value, with room to spare.
RECORD_OVERHEAD_BYTES = 1024
# An upstream error message is copied into the error record up to this many characters.
MAX_ERROR_MESSAGE_CHARS = 4096
# The group member: a revocation commits at once, but an assignment first reads the partition's tail
# (the restore), which may take this long; it is also the longest gap between polls.
REBALANCE_TIMEOUT_MS = 300_000
HEARTBEAT_INTERVAL_MS = 1_000
METADATA_MAX_AGE_MS = 30_000
POLL_MS = 100
PAUSED_POLL_MS = 10  # a paused member still polls: the group's liveness and its rebalance callbacks
# An assigned partition whose opening failed is opened again this often.
REOPEN_INTERVAL_S = 1.0


def error_record(
    request_id: str, seq: int, endpoint: str, error: JsonDict, origin: Origin | None = None
) -> bytes:
    """An ``IngestErrorRecord``: it ends its stream, whatever its seq."""
    message = error.get("message")
    if isinstance(message, str) and len(message) > MAX_ERROR_MESSAGE_CHARS:
        error = {**error, "message": message[:MAX_ERROR_MESSAGE_CHARS] + "..."}
    record: JsonDict = {
        "request_id": request_id,
        "seq": seq,
        "endpoint": endpoint,
        "body": None,
        "error": error,
        "terminal": True,
    }
    if origin is not None:
        record["origin"] = origin.model_dump(exclude_none=True)
    return orjson.dumps(record)


def close_record(stream_id: str) -> bytes:
    """A ``CloseRecord`` for the worker's input topic."""
    return orjson.dumps({"request_id": stream_id, "close": True})


def record_bytes(key: str, value: bytes, headers: Headers) -> int:
    """What a record counts against ``--max-record-bytes``."""
    return len(key) + len(value) + sum(len(n) + len(v) for n, v in headers) + RECORD_OVERHEAD_BYTES


def _error(code: int, message: str, type_: str) -> JsonDict:
    return {"message": message, "type": type_, "param": None, "code": code}


@dataclass
class _Outgoing:
    topic: str
    key: bytes
    value: bytes
    partition: int | None = None
    headers: Headers = ()
    request: _Request | None = None  # the request an input envelope belongs to
    seq: int | None = None  # an input envelope's seq (its stream is its key)

    def record(self) -> OutgoingRecord:
        return OutgoingRecord(self.topic, self.key, self.value, self.partition, self.headers)


@dataclass
class _Restored:
    """What a partition's tail says about the requests to come (see the attempt rule)."""

    started: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)


class _Request:
    """One running request: its generations and what it has produced."""

    def __init__(
        self, owner: _Partition, offset: int, envelope: RequestEnvelope, trace: Headers, size: int
    ) -> None:
        self.owner = owner
        self.offset = offset
        self.envelope = envelope
        self.trace = trace  # carried to every record the request causes
        self.size = size  # of its request record, counted against --max-backlog-bytes
        self.cancelled = asyncio.Event()
        self.engine_ids: set[str] = set()
        self.seqs: dict[str, int] = {}  # each stream's next seq
        self.started = False
        self.failed = False  # a commit refused one of its records and ended it: send nothing more
        self.task: asyncio.Task[None] | None = None


class _Partition:
    """One owned requests partition: its transaction, its running requests and its uncommitted records."""

    def __init__(
        self, ingest: Ingest, tp: TopicPartition, transaction: Transaction, restored: _Restored
    ) -> None:
        self.ingest = ingest
        self.tp = tp
        self.transaction = transaction
        self.restored = restored
        self.running: dict[int, _Request] = {}  # by offset
        self.by_id: dict[str, _Request] = {}
        self.early_cancels: dict[str, None] = {}  # in arrival order, oldest first
        self.pending: list[_Outgoing] = []
        self.next_offset: int | None = None  # past the last record read; earlier ones are skipped
        self.committed: int | None = None
        self.lock = asyncio.Lock()

    def emit(
        self,
        topic: str,
        key: str,
        value: bytes,
        partition: int | None = None,
        headers: Headers = (),
        request: _Request | None = None,
        seq: int | None = None,
    ) -> None:
        if request is not None and request.failed:
            return
        self.pending.append(_Outgoing(topic, key.encode(), value, partition, headers, request, seq))

    def mark(self, request_id: str, state: Literal["started", "done"]) -> None:
        marker = IngestMarker(request_id=request_id, ingest=state)
        self.emit(self.tp.topic, request_id, marker.model_dump_json().encode(), self.tp.partition)

    def offset_to_commit(self) -> int | None:
        if self.running:
            return min(self.running)
        return self.next_offset

    async def commit(self, offset_floor: int | None = None) -> None:
        async with self.lock:
            offset = self.offset_to_commit()
            if offset_floor is not None and (offset is None or offset > offset_floor):
                offset = offset_floor
            records, self.pending = self.pending, []  # taken with the offset, without an await between
            if not records and offset == self.committed:
                return
            try:
                for index, record in enumerate(records):
                    if record.request is not None and record.request.failed:
                        continue  # its request ended at an earlier record of this batch
                    try:
                        await self.transaction.send(record.record())
                    except (RecordTooLargeError, TypeError, ValueError) as exc:
                        # Refused before it joined the transaction: only its request ends.
                        for replacement in self.ingest.record_refused(
                            self, record, records[index + 1 :], exc
                        ):
                            await self.transaction.send(replacement.record())
                offsets = {self.tp: offset} if offset is not None and offset != self.committed else {}
                await self.transaction.commit((), offsets)
            except BaseException:
                await self.transaction.abort()  # logs, never raises: the caller sees the first error
                raise
            self.committed = offset


class Ingest:
    def __init__(self, settings: IngestOptions, connection: Connection) -> None:
        self.settings = settings
        self.connection = connection
        self.partitions: dict[TopicPartition, _Partition] = {}
        self._stop = asyncio.Event()
        self._kafka: KafkaClient | None = None
        self._consumer: GroupConsumer | None = None
        self._restorer: RangeReader | None = None
        self._opening = asyncio.Lock()  # an assignment and a reopen never open one partition twice
        self._next_reopen_at = 0.0
        self._client: VllmClient | None = None
        self._slots = asyncio.Semaphore(settings.max_inflight)  # one per open generate stream or call
        self._held = 0  # requests read and not ended (generating or waiting for a slot)
        self._held_bytes = 0
        self._paused = False
        self.failed: BaseException | None = None

    def request_stop(self) -> None:
        self._stop.set()

    # --- the consumer loop --------------------------------------------------------------------------

    async def run(self) -> int:
        s = self.settings
        # Without end while the topics do not exist: a stop meanwhile does not wait for them.
        topics = asyncio.ensure_future(wait_for_topics(self.connection, s.input_topic, s.output_topic))
        if not await stop_signals.finished_before(topics, self._stop):
            log.info("stopped before joining the group")
            return 0
        counts = topics.result()
        if await self.connection.ensure_topic(s.requests_topic, counts[s.input_topic]):
            log.info("created the requests topic %s (%d partitions)", s.requests_topic, counts[s.input_topic])
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=0)  # --max-inflight bounds the streams
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            self._client = VllmClient(
                session,
                s.render_url,
                s.generate_endpoint,
                s.api_key or None,
                s.stream_idle_timeout_s,
                render_timeout_s=s.render_timeout_s,
                generate_timeout_s=s.generate_timeout_s,
                headers_timeout_s=s.headers_timeout_s,
            )
            self._kafka = self.connection.client(s.kafka_client)
            self._restorer = RangeReader(self._kafka, self.connection.reader_config("restore"))
            committer: asyncio.Task[None] | None = None
            try:
                await self._restorer.start()
                self._consumer = self._kafka.consumer(self._consumer_config())
                await self._consumer.start()
                callbacks = RebalanceCallbacks(
                    self._partitions_assigned, self._partitions_revoked, self._partitions_lost
                )
                self._consumer.subscribe([s.requests_topic], callbacks)
                committer = asyncio.create_task(self._commit_loop())
                await self._poll_loop()
                await self._drain()
            finally:
                if committer is not None:
                    committer.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await committer
                await self._shutdown()
        if self.failed is not None:
            log.error("ingest stopped: %r", self.failed)
            return 1
        return 0

    def _consumer_config(self) -> ConsumerConfig:
        s = self.settings
        # aiokafka has no cooperative assignor: its own eager default, without the fallback warning.
        strategy = (
            AssignmentStrategy.ROUNDROBIN
            if s.kafka_client is ClientKind.AIOKAFKA
            else AssignmentStrategy.COOPERATIVE_STICKY
        )
        return ConsumerConfig(
            bootstrap_servers=self.connection.bootstrap_servers,
            client_id=self.connection.client_id,
            group_id=s.group_id,
            session_timeout_ms=s.session_timeout_ms,
            rebalance_timeout_ms=REBALANCE_TIMEOUT_MS,
            heartbeat_interval_ms=max(100, min(s.session_timeout_ms // 4, HEARTBEAT_INTERVAL_MS)),
            max_poll_records=s.max_inflight + s.max_backlog,
            metadata_max_age_ms=METADATA_MAX_AGE_MS,
            security=self.connection.security,
            assignment_strategy=strategy,
        )

    async def _poll_loop(self) -> None:
        assert self._consumer is not None
        s = self.settings
        while not self._stop.is_set() and self.failed is None:
            # Reading goes on past --max-inflight (requests wait for a slot, cancels are seen) up to
            # the backlog's bounds.
            room = s.max_inflight + s.max_backlog - self._held
            self._set_paused(room <= 0 or self._held_bytes >= s.max_backlog_bytes)
            batches = await self._consumer.poll(PAUSED_POLL_MS if self._paused else POLL_MS, max(1, room))
            for tp, records in batches.items():
                partition = self.partitions.get(tp)
                if partition is None:  # not ours any more, or not open yet: its opening seeks
                    continue
                for record in records:
                    if partition.next_offset is not None and record.offset < partition.next_offset:
                        continue  # fetched before a seek back (see GroupConsumer.poll)
                    if self._paused or self._held_bytes >= s.max_backlog_bytes:
                        # Fetched before the pause took effect, or past the bytes: read again later.
                        with contextlib.suppress(PartitionNotAssignedError):  # revoked meanwhile
                            self._consumer.seek(tp, record.offset)
                        break
                    partition.next_offset = record.offset + 1
                    # W3C trace context of the request record, and its time for the worker's TTFT.
                    trace = (*propagated(record.headers), request_start_header(record.timestamp))
                    self._handle(partition, record.offset, record.key, record.value, trace)
            await self._reopen()

    def _set_paused(self, paused: bool) -> None:
        assert self._consumer is not None
        if paused == self._paused:
            return
        self._paused = paused
        for tp in self._consumer.assignment():
            if paused:
                self._consumer.pause(tp)
            else:
                self._consumer.resume(tp)
        if paused:
            log.info("pausing the requests topic: %d requests (%d bytes) held", self._held, self._held_bytes)

    async def _reopen(self) -> None:
        """Open assigned partitions whose opening failed (a restore that timed out, a broker away)."""
        if self._consumer is None or time.monotonic() < self._next_reopen_at:
            return
        self._next_reopen_at = time.monotonic() + REOPEN_INTERVAL_S
        missing = self._consumer.assignment() - set(self.partitions)
        if missing:
            await self._partitions_assigned(missing)

    async def _commit_loop(self) -> None:
        interval = self.settings.commit_interval_ms / 1000
        started = time.monotonic()
        while True:
            # An interval between commit starts, not after each commit: a slow commit is not added.
            await asyncio.sleep(max(0.0, started + interval - time.monotonic()))
            started = time.monotonic()
            # Partitions commit side by side: each has its own producer and transaction.
            results = await asyncio.gather(
                *(p.commit() for p in list(self.partitions.values())), return_exceptions=True
            )
            failures = [r for r in results if isinstance(r, BaseException)]
            if failures:  # fenced or broken: the next owner resumes by the attempt rule
                self.failed = failures[0]
                self._stop.set()
                return

    async def _drain(self) -> None:
        """On stop: let running requests finish within the shutdown timeout (still committing)."""
        running = [r.task for p in self.partitions.values() for r in p.running.values() if r.task]
        if running and self.failed is None:
            await asyncio.wait(running, timeout=self.settings.shutdown_timeout_s)

    async def _shutdown(self) -> None:
        """Abort what still runs (the attempt rule covers it), commit, leave the group."""
        for partition in list(self.partitions.values()):
            await self._close_partition(partition, commit=self.failed is None)
        for client in (self._consumer, self._restorer):
            if client is not None:
                try:
                    await client.stop()
                except Exception as exc:  # noqa: BLE001 - closing goes on; the failure is logged
                    log.warning("closing %r failed: %r", client, exc)

    # --- records -------------------------------------------------------------------------------------

    def _handle(
        self, partition: _Partition, offset: int, key: bytes | None, value: bytes | None, trace: Headers = ()
    ) -> None:
        try:
            raw = orjson.loads(value or b"")
        except orjson.JSONDecodeError:
            raw = None
        if isinstance(raw, dict) and "ingest" in raw:
            return  # our own marker: read at restore, nothing to do now
        if isinstance(raw, dict) and "cancel" in raw:
            with contextlib.suppress(ValidationError):
                self._cancel(partition, CancelRecord.model_validate(raw).request_id)
                return
        try:
            envelope = RequestEnvelope.model_validate(raw)
        except ValidationError as exc:
            self._reject(partition, key, raw, trace, f"not a request envelope: {_first_error(exc)}")
            return
        if key is not None and key != envelope.request_id.encode():
            self._reject(partition, key, raw, trace, "the record key differs from request_id")
            return
        rid = envelope.request_id
        restored = partition.restored
        if rid in restored.done or rid in partition.by_id:
            log.info("request %s: already handled, skipped", rid)
            return
        if rid in restored.started:
            log.warning("request %s: cut off by an earlier ingest, ended with an error record", rid)
            self._finish_with_error(
                partition,
                envelope,
                0,
                _error(
                    503,
                    "the request was cut off: its generation stopped mid-stream "
                    "when the ingest process serving it died",
                    "ServiceUnavailableError",
                ),
                trace,
            )
            # The worker holds the streams' state: free it now (a close for a stream it never saw
            # does nothing). The dead process's stream ids follow render's naming.
            for sid in _stream_ids(envelope):
                partition.emit(self.settings.input_topic, sid, close_record(sid), headers=trace)
            return
        if rid in restored.cancelled or rid in partition.early_cancels:
            partition.early_cancels.pop(rid, None)
            cancelled = _error(CANCELLED_CODE, "the request was cancelled", "CancelledError")
            self._finish_with_error(partition, envelope, 0, cancelled, trace)
            return
        if _too_late_to_start(envelope):
            self._finish_with_error(partition, envelope, 0, _expired_error(), trace)
            return
        request = _Request(partition, offset, envelope, trace, len(value or b""))
        partition.running[offset] = request
        partition.by_id[rid] = request
        self._held += 1
        self._held_bytes += request.size
        request.task = asyncio.create_task(self._run_request(request))

    def _cancel(self, partition: _Partition, request_id: str) -> None:
        request = partition.by_id.get(request_id)
        if request is None:
            early = partition.early_cancels
            early.pop(request_id, None)
            early[request_id] = None
            if len(early) > MAX_EARLY_CANCELS:
                del early[next(iter(early))]
            return
        log.info("request %s: cancelled", request_id)
        request.cancelled.set()

    def _reject(
        self, partition: _Partition, key: bytes | None, raw: Any, trace: Headers, reason: str
    ) -> None:
        """A record that is not a request: an error record when someone may wait for its key, else skip."""
        request_id = key.decode(errors="replace") if key else None
        log.warning("requests record skipped (%s), key %r", reason, request_id)
        if request_id:
            given = raw.get("endpoint") if isinstance(raw, dict) else None
            endpoint = given if isinstance(given, str) and given in ("chat", "completion") else "chat"
            value = error_record(request_id, 0, endpoint, _error(400, reason, "BadRequestError"))
            partition.emit(self.settings.output_topic, request_id, value, headers=trace)

    def _finish_with_error(
        self, partition: _Partition, envelope: RequestEnvelope, seq: int, error: JsonDict, trace: Headers
    ) -> None:
        rid = envelope.request_id
        value = error_record(rid, seq, envelope.endpoint, error, envelope.origin)
        partition.emit(self.settings.output_topic, rid, value, headers=trace)
        partition.mark(rid, "done")

    # --- one request ---------------------------------------------------------------------------------

    async def _run_request(self, request: _Request) -> None:
        partition, envelope = request.owner, request.envelope
        try:
            async with asyncio.timeout(_seconds_left(envelope)):
                await self._generate(request)
            partition.mark(envelope.request_id, "done")
        except UpstreamError as exc:
            await self._abort_upstream(request)  # siblings of the failed stream may still generate
            self._upstream_failed(request, exc.error)
        except TimeoutError:  # the envelope's deadline: nobody waits any more
            await self._abort_upstream(request)
            self._upstream_failed(request, _expired_error())
        except asyncio.CancelledError:
            await self._abort_upstream(request)  # the partition moved or we stop: the rule takes over
            raise
        except Exception as exc:  # a bug must not leave the request silent
            log.exception("request %s failed", envelope.request_id)
            await self._abort_upstream(request)
            self._upstream_failed(request, _error(500, f"ingest failed: {exc!r}", "InternalServerError"))
        finally:
            partition.running.pop(request.offset, None)
            partition.by_id.pop(envelope.request_id, None)
            self._held -= 1
            self._held_bytes -= request.size

    def _upstream_failed(self, request: _Request, error: JsonDict) -> None:
        rid = request.envelope.request_id
        # The error goes to each stream that has records, at its next seq (no seq is used twice).
        targets = [sid for sid, seq in request.seqs.items() if seq > 0] or [rid]
        for sid in targets:
            seq = request.seqs.get(sid, 0)
            value = error_record(sid, seq, request.envelope.endpoint, error, request.envelope.origin)
            # Tagged with the request: should a commit refuse one of its records, its own error wins.
            request.owner.emit(self.settings.output_topic, sid, value, headers=request.trace, request=request)
            if seq > 0:  # the worker holds state for it: free it now, not at its TTL
                close = close_record(sid)
                request.owner.emit(
                    self.settings.input_topic, sid, close, headers=request.trace, request=request
                )
        request.owner.mark(rid, "done")

    def record_refused(
        self, partition: _Partition, record: _Outgoing, rest: list[_Outgoing], exc: Exception
    ) -> list[_Outgoing]:
        """The producer refused ``record`` (too large, not serializable): end its request only.

        Its later records (in ``rest`` of this batch and still pending) are dropped; each stream of
        the request gets its error at the first seq not sent; the running task is cancelled.
        """
        request = record.request
        if request is None:  # an error record or marker: small by construction, so a bug
            log.error("a record for %r was refused by the producer: %r", record.key, exc)
            return []
        request.failed = True
        if request.task is not None and not request.task.done():
            request.task.cancel()
        envelope = request.envelope
        rid = envelope.request_id
        log.warning("request %s: a record was refused by the producer (%r), the request ends", rid, exc)
        code, kind = (
            (413, "PayloadTooLargeError")
            if isinstance(exc, RecordTooLargeError)
            else (500, "InternalServerError")
        )
        error = _error(code, f"an answer record of this request could not be sent: {exc}", kind)
        unsent: dict[str, int] = {}
        for later in [record, *rest, *partition.pending]:
            if later.request is request and later.seq is not None:
                stream = later.key.decode()
                unsent[stream] = min(unsent.get(stream, later.seq), later.seq)
        partition.pending = [p for p in partition.pending if p.request is not request]
        streams = {**{sid: seq for sid, seq in request.seqs.items() if seq > 0}, **unsent} or {rid: 0}
        replacements = []
        for sid, seq in streams.items():
            value = error_record(sid, seq, envelope.endpoint, error, envelope.origin)
            replacements.append(
                _Outgoing(self.settings.output_topic, sid.encode(), value, headers=request.trace)
            )
            if seq > 0:  # the worker holds state for it
                replacements.append(
                    _Outgoing(
                        self.settings.input_topic, sid.encode(), close_record(sid), headers=request.trace
                    )
                )
        marker = IngestMarker(request_id=rid, ingest="done").model_dump_json().encode()
        replacements.append(_Outgoing(partition.tp.topic, rid.encode(), marker, partition.tp.partition))
        return replacements

    async def _generate(self, request: _Request) -> None:
        assert self._client is not None
        envelope = request.envelope
        rendered = await self._until_cancelled(
            request,
            self._client.render(envelope.endpoint, envelope.request, envelope.request_id, request.trace),
        )
        if rendered is None or request.cancelled.is_set():
            raise UpstreamError(CANCELLED_CODE, "the request was cancelled", "CancelledError")
        if envelope.request.get("stream"):
            ids = (
                [envelope.request_id]
                if len(rendered) == 1
                else [f"{envelope.request_id}-{i}" for i in range(len(rendered))]
            )
            for sid in ids:
                request.seqs[sid] = 0
            # One task group: the first stream that fails cancels the others (then all are aborted).
            await _first_failure(
                self._stream(request, sid, gen) for sid, gen in zip(ids, rendered, strict=True)
            )
        else:
            await self._one_shot(request, rendered)

    async def _slot(self, request: _Request) -> None:
        """A generate slot (``--max-inflight``); a cancel or an expired deadline while waiting ends it."""
        if await self._until_cancelled(request, self._slots.acquire()) is None:
            raise UpstreamError(CANCELLED_CODE, "the request was cancelled", "CancelledError")
        if _too_late_to_start(request.envelope):
            self._slots.release()
            raise TimeoutError

    async def _until_cancelled(self, request: _Request, work: Awaitable[Any]) -> Any:
        task = asyncio.ensure_future(work)
        cancel = asyncio.create_task(request.cancelled.wait())
        try:
            await asyncio.wait([task, cancel], return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return None
        return task.result()

    def _first_body(self, envelope: RequestEnvelope, generate_request: JsonDict) -> JsonDict:
        prompt = generate_request["token_ids"]
        key = "chat_request" if envelope.endpoint == "chat" else "completion_request"
        return {
            "model": envelope.request.get("model"),
            "prompt_tokens": len(prompt),
            "prompt_token_ids": prompt,
            key: envelope.request,
        }

    async def _stream(self, request: _Request, sid: str, generate_request: JsonDict) -> None:
        """Read one generation; a cancel aborts it upstream and gives it ``--abort-grace-s`` to end."""
        await self._slot(request)
        try:
            await self._stream_in_slot(request, sid, generate_request)
        finally:
            self._slots.release()

    async def _stream_in_slot(self, request: _Request, sid: str, generate_request: JsonDict) -> None:
        request.engine_ids.add(f"generate-tokens-{generate_request.get('request_id')}")
        reader = asyncio.create_task(self._read_stream(request, sid, generate_request))
        cancel = asyncio.create_task(request.cancelled.wait())
        try:
            await asyncio.wait([reader, cancel], return_when=asyncio.FIRST_COMPLETED)
            if not reader.done():
                await self._abort_upstream(request)  # vLLM ends the stream with finish_reason "abort"
                await asyncio.wait([reader], timeout=self.settings.abort_grace_s)
            if not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                raise UpstreamError(CANCELLED_CODE, "the request was cancelled", "CancelledError")
            reader.result()
        finally:
            cancel.cancel()
            if not reader.done():
                reader.cancel()

    async def _read_stream(self, request: _Request, sid: str, generate_request: JsonDict) -> None:
        assert self._client is not None
        partition, envelope, seqs = request.owner, request.envelope, request.seqs
        expected = _choices_of(generate_request)
        finished: set[Any] = set()
        try:
            async for chunk in self._client.generate_stream(generate_request, request.trace):
                if isinstance(chunk.get("request_id"), str):
                    request.engine_ids.add(chunk["request_id"])
                for choice in chunk.get("choices") or ():
                    if isinstance(choice, dict) and choice.get("finish_reason") is not None:
                        finished.add(choice.get("index"))
                body: JsonDict = {"stream": True, "generate_chunk": chunk}
                first = seqs[sid] == 0
                if first:
                    body.update(self._first_body(envelope, generate_request))
                origin = envelope.origin if first else None
                value = self._envelope(sid, seqs[sid], envelope.endpoint, body, request.trace, origin)
                partition.emit(
                    self.settings.input_topic,
                    sid,
                    value,
                    headers=request.trace,
                    request=request,
                    seq=seqs[sid],
                )
                seqs[sid] += 1
                if not request.started:
                    request.started = True
                    partition.mark(envelope.request_id, "started")
        except UpstreamError as exc:
            if exc.error["code"] == 504:  # stalled: free the engine's slot too
                await self._abort_upstream(request)
            raise
        if len(finished) < expected:  # [DONE] with a choice unfinished: its reader would wait forever
            raise UpstreamError(
                502,
                f"generate ended the stream with {expected - len(finished)} of {expected} choice(s) "
                "unfinished (no finish_reason)",
            )

    def _envelope(
        self, sid: str, seq: int, endpoint: str, body: JsonDict, trace: Headers, origin: Origin | None = None
    ) -> bytes:
        """An input envelope that fits ``--max-record-bytes``, or the request's 413. ``origin`` goes on a
        stream's first record only, as the request's other context does."""
        record: JsonDict = {"request_id": sid, "seq": seq, "endpoint": endpoint, "body": body}
        if origin is not None:
            record["origin"] = origin.model_dump(exclude_none=True)
        try:
            value = orjson.dumps(record)
        except orjson.JSONEncodeError as exc:
            raise UpstreamError(502, f"generate's answer cannot be serialized: {exc}") from exc
        size = record_bytes(sid, value, trace)
        limit = self.settings.max_record_bytes
        if size > limit:
            raise UpstreamError(
                413,
                f"the answer needs a record of {size} bytes, over the limit of {limit}: ask for fewer "
                "tokens, logprobs or choices",
                "PayloadTooLargeError",
            )
        return value

    async def _abort_upstream(self, request: _Request) -> None:
        if self._client is not None and request.engine_ids:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._client.abort(sorted(request.engine_ids)))

    async def _one_shot(self, request: _Request, rendered: list[JsonDict]) -> None:
        responses = await self._until_cancelled(
            request, _first_failure(self._generate_one(request, gen) for gen in rendered)
        )
        if responses is None:
            raise UpstreamError(CANCELLED_CODE, "the request was cancelled", "CancelledError")
        envelope = request.envelope
        body: JsonDict = {"stream": False, "model": envelope.request.get("model")}
        if envelope.endpoint == "chat":
            body.update(
                generate_response=responses[0],
                prompt_tokens=len(rendered[0]["token_ids"]),
                prompt_token_ids=rendered[0]["token_ids"],
                chat_request=envelope.request,
            )
        else:
            body.update(
                generate_responses=responses,
                prompt_tokens=[len(gen["token_ids"]) for gen in rendered],
                prompt_token_ids=[gen["token_ids"] for gen in rendered],
                completion_request=envelope.request,
            )
        rid = envelope.request_id
        value = self._envelope(rid, 0, envelope.endpoint, body, request.trace, envelope.origin)
        request.seqs[rid] = 0
        request.owner.emit(
            self.settings.input_topic, rid, value, headers=request.trace, request=request, seq=0
        )
        request.seqs[rid] = 1
        request.started = True

    async def _generate_one(self, request: _Request, generate_request: JsonDict) -> JsonDict:
        assert self._client is not None
        await self._slot(request)
        try:
            request.engine_ids.add(f"generate-tokens-{generate_request.get('request_id')}")
            return await self._client.generate(generate_request, request.trace)
        finally:
            self._slots.release()

    # --- partitions ----------------------------------------------------------------------------------

    async def _partitions_assigned(self, assigned: Partitions) -> None:
        async with self._opening:
            for tp in sorted(assigned):
                if tp in self.partitions or self._consumer is None or tp not in self._consumer.assignment():
                    continue
                try:
                    await self.open_partition(tp)
                except Exception as exc:  # noqa: BLE001 - reopened by the poll loop (_reopen)
                    log.warning("opening requests partition %d failed, will retry: %r", tp.partition, exc)
                    continue
                opened = self.partitions.get(tp)
                if opened is not None and tp not in self._consumer.assignment():
                    # Revoked while it opened (a reopen runs beside aiokafka's rebalance): not ours.
                    await self._close_partition(opened, commit=False)

    async def _partitions_revoked(self, revoked: Partitions) -> None:
        for tp in revoked:
            partition = self.partitions.get(tp)
            if partition is not None:
                await self._close_partition(partition, commit=True)

    async def _partitions_lost(self, lost: Partitions) -> None:
        """Gone already (session expired): nothing of theirs may commit; the next owner resumes them."""
        for tp in lost:
            partition = self.partitions.get(tp)
            if partition is not None:
                await self._close_partition(partition, commit=False)

    async def open_partition(self, tp: TopicPartition) -> None:
        s = self.settings
        assert self._kafka is not None and self._consumer is not None
        transactional_id = s.transactional_id(tp.partition)
        config = self.connection.producer_config(f"{self.connection.client_id}-{transactional_id}")
        transaction = Transaction(
            self._kafka.transactional_producer(config, transactional_id), self._consumer.group_id_metadata
        )
        try:
            await transaction.start()  # init_transactions: fences the last owner, aborts its open transaction
            committed = await self._consumer.committed(tp)
            start = committed if committed is not None else await self._consumer.beginning_offset(tp)
            restored = await self._restore(tp, start)
            self._consumer.seek(tp, start)  # records fetched before are skipped by offset
        except BaseException:
            await transaction.close()
            raise
        partition = _Partition(self, tp, transaction, restored)
        partition.committed = committed
        partition.next_offset = start
        self.partitions[tp] = partition
        if self._paused:  # a full backlog pauses every partition, also one assigned since
            self._consumer.pause(tp)
        log.info(
            "requests partition %d from offset %s: %d started and %d done requests in its tail",
            tp.partition,
            committed,
            len(restored.started - restored.done),
            len(restored.done),
        )

    async def _restore(self, tp: TopicPartition, start: int) -> _Restored:
        """Read the partition from ``start`` to its end: the markers and cancels of the attempt rule."""
        assert self._restorer is not None
        restored = _Restored()
        end = (await self._restorer.high_watermarks([tp]))[tp]
        async for _tp, records in self._restorer.read({tp: (start, end)}):
            for record in records:
                with contextlib.suppress(orjson.JSONDecodeError, ValidationError):
                    raw = orjson.loads(record.value or b"")
                    if isinstance(raw, dict) and "ingest" in raw:
                        marker = IngestMarker.model_validate(raw)
                        (restored.started if marker.ingest == "started" else restored.done).add(
                            marker.request_id
                        )
                    elif isinstance(raw, dict) and "cancel" in raw:
                        restored.cancelled.add(CancelRecord.model_validate(raw).request_id)
        return restored

    async def _close_partition(self, partition: _Partition, *, commit: bool) -> None:
        self.partitions.pop(partition.tp, None)
        # Taken before the cancelled requests leave `running`: the next owner must read them again.
        floor = partition.offset_to_commit()
        tasks = [r.task for r in partition.running.values() if r.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            if commit:
                await partition.commit(offset_floor=floor)
        finally:
            await partition.transaction.abort()
            await partition.transaction.close()


T = TypeVar("T")


async def _first_failure(works: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Run ``works`` as one task group; the first failure cancels the rest and is raised alone."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(work) for work in works]
    except BaseExceptionGroup as failed:
        raise _first_of(failed) from None
    return [task.result() for task in tasks]


def _first_of(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The failure to report: an upstream error before a bug, a bug before a timeout."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        else:
            leaves.append(exc)
    for kind in (UpstreamError, Exception):
        for leaf in leaves:
            if isinstance(leaf, kind) and not isinstance(leaf, TimeoutError):
                return leaf
    return leaves[0]


def _stream_ids(envelope: RequestEnvelope) -> list[str]:
    """The ids a request's streams may have had: its own, and one per prompt of a completion."""
    prompt = envelope.request.get("prompt")
    ids = [envelope.request_id]
    if envelope.endpoint != "completion" or not isinstance(prompt, list) or len(prompt) < 2:
        return ids
    if not all(isinstance(p, int) for p in prompt):  # a list of prompts, not one prompt of token ids
        ids += [f"{envelope.request_id}-{i}" for i in range(len(prompt))]
    return ids


def _choices_of(generate_request: JsonDict) -> int:
    """How many choices a generation must finish: its ``n``."""
    sampling = generate_request.get("sampling_params")
    n = sampling.get("n") if isinstance(sampling, dict) else None
    return n if isinstance(n, int) and n > 0 else 1


def _seconds_left(envelope: RequestEnvelope) -> float | None:
    if envelope.deadline_ms is None:
        return None
    return max(0.0, envelope.deadline_ms / 1000 - time.time())


def _expired(envelope: RequestEnvelope) -> bool:
    return envelope.deadline_ms is not None and time.time() * 1000 >= envelope.deadline_ms


def _too_late_to_start(envelope: RequestEnvelope) -> bool:
    """Past its deadline, or past its ``start_by_ms`` before it began generating."""
    late = envelope.start_by_ms is not None and time.time() * 1000 >= envelope.start_by_ms
    return late or _expired(envelope)


def _expired_error() -> JsonDict:
    return _error(504, "the request's deadline passed before it ended", "TimeoutError")


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"]) or "record"
    return f"{where}: {error['msg']}"


# --- the command ------------------------------------------------------------------------------------


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ingest = commands.add_parser(
        "ingest", help="requests topic -> vLLM render + generate -> input envelopes for the worker"
    )
    add_arguments(ingest, IngestOptions)
    add_connection_arguments(ingest, producing=True)
    add_arguments(ingest, LoggingSettings, MetricsServerSettings)
    ingest.set_defaults(handler=_ingest, graceful_stop=True)


def _ingest(args: argparse.Namespace) -> int:
    configure(load(LoggingSettings, args))
    settings = load(IngestOptions, args)
    connection = Connection.from_args(args, "ingest")
    health = load(MetricsServerSettings, args)

    async def main() -> int:
        ingest = Ingest(settings, connection)
        loop = asyncio.get_running_loop()
        stop_signals.hand_over(loop, ingest.request_stop)
        async with serving_health(health, ingest):  # /healthz, /readyz, /metrics
            return await ingest.run()

    return asyncio.run(main())
