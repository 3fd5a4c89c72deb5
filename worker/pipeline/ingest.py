"""``derender-worker ingest``: the requests topic -> vLLM render + generate -> the worker's input topic.

One consumer-group member. For each ``RequestEnvelope`` it calls render, then generate, and turns
every SSE chunk into one input envelope (``seq`` 0, 1, 2, ...; the first carries ``model``,
``prompt_tokens``, ``prompt_token_ids`` and the request) keyed by ``request_id``. A non-streaming
request is one one-shot envelope. vLLM errors become the request's error record on the output topic.

Exactly-once, per requests partition ``p``: one transactional producer (``{group}-{topic}-{p}``, so
the next owner fences a zombie), committing every ``--commit-interval-ms`` the envelopes, error
records and markers produced since the last commit together with the partition's offset. That offset
is the oldest request still running, so a crash re-reads every unfinished request.

Resumability (the attempt rule): a request is generated at most once in a visible way. The
transaction that makes its first envelope visible also writes an ``IngestMarker`` ``started`` to
the requests topic, and the one with its last envelope a ``done`` marker. A restarted owner reads
the partition from the committed offset to its end before it starts: a request marked ``done`` is
skipped; one marked ``started`` but not ``done`` ends with an error record (503, "cut off") and is
not generated again, because a second generation would differ from the tokens already shown; one
without a marker was never visible and is generated (again) from scratch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from pydantic import ValidationError

from schemas.pipeline import CancelRecord, IngestMarker, RequestEnvelope
from worker.errors import UpstreamError
from worker.pipeline.connection import Connection, add_connection_arguments, require_topics
from worker.pipeline.ingest_health import serving_health
from worker.pipeline.vllm_client import VllmClient
from worker.runtime.genai_metrics import request_start_header
from worker.runtime.kafka_client.aiokafka_backend import fetch_committed
from worker.runtime.tracing import Headers, propagated
from worker.settings import IngestOptions, LoggingSettings, MetricsServerSettings, add_arguments, load

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
CANCELLED_CODE = 499  # nginx's "client closed request": nobody waits for this answer any more
# Bounded memory of cancels for requests not seen yet (a cancel may overtake nothing, but is cheap).
MAX_EARLY_CANCELS = 10_000


def error_record(request_id: str, seq: int, endpoint: str, error: JsonDict) -> bytes:
    return orjson.dumps(
        {"request_id": request_id, "seq": seq, "endpoint": endpoint, "body": None, "error": error}
    )


def _error(code: int, message: str, type_: str) -> JsonDict:
    return {"message": message, "type": type_, "param": None, "code": code}


@dataclass
class _Outgoing:
    topic: str
    key: bytes
    value: bytes
    partition: int | None = None
    headers: Headers = ()


@dataclass
class _Restored:
    """What a partition's tail says about the requests to come (see the attempt rule)."""

    started: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)


class _Request:
    """One running request: its generations and what it has produced."""

    def __init__(self, owner: _Partition, offset: int, envelope: RequestEnvelope, trace: Headers) -> None:
        self.owner = owner
        self.offset = offset
        self.envelope = envelope
        self.trace = trace  # carried to every record the request causes
        self.cancelled = asyncio.Event()
        self.engine_ids: set[str] = set()
        self.started = False
        self.task: asyncio.Task[None] | None = None


class _Partition:
    """One owned requests partition: its producer, its running requests and its uncommitted records."""

    def __init__(
        self, ingest: Ingest, tp: TopicPartition, producer: AIOKafkaProducer, restored: _Restored
    ) -> None:
        self.ingest = ingest
        self.tp = tp
        self.producer = producer
        self.restored = restored
        self.running: dict[int, _Request] = {}  # by offset
        self.by_id: dict[str, _Request] = {}
        self.early_cancels: set[str] = set()
        self.pending: list[_Outgoing] = []
        self.next_offset: int | None = None  # past the last record read
        self.committed: int | None = None
        self.lock = asyncio.Lock()

    def emit(
        self, topic: str, key: str, value: bytes, partition: int | None = None, headers: Headers = ()
    ) -> None:
        self.pending.append(_Outgoing(topic, key.encode(), value, partition, headers))

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
            await self.producer.begin_transaction()
            try:
                for record in records:
                    await self.producer.send(
                        record.topic,
                        value=record.value,
                        key=record.key,
                        partition=record.partition,
                        headers=list(record.headers) or None,
                    )
                if offset is not None and offset != self.committed:
                    await self.producer.send_offsets_to_transaction(
                        {self.tp: offset}, self.ingest.settings.group_id
                    )
                await self.producer.commit_transaction()
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.producer.abort_transaction()
                raise
            self.committed = offset


class Ingest:
    def __init__(self, settings: IngestOptions, connection: Connection) -> None:
        self.settings = settings
        self.connection = connection
        self.partitions: dict[TopicPartition, _Partition] = {}
        self._stop = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._client: VllmClient | None = None
        self._inflight = 0
        self._paused = False
        self.failed: BaseException | None = None

    def request_stop(self) -> None:
        self._stop.set()

    # --- the consumer loop --------------------------------------------------------------------------

    async def run(self) -> int:
        s = self.settings
        counts = await require_topics(self.connection, s.input_topic, s.output_topic)
        if await self.connection.ensure_topic(s.requests_topic, counts[s.input_topic]):
            log.info("created the requests topic %s (%d partitions)", s.requests_topic, counts[s.input_topic])
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=0)  # --max-inflight bounds the streams
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            self._client = VllmClient(
                session, s.render_url, s.generate_endpoint, s.api_key or None, s.stream_idle_timeout_s
            )
            self._consumer = self.connection.consumer(
                group_id=s.group_id,
                auto_offset_reset="earliest",
                session_timeout_ms=s.session_timeout_ms,
                max_poll_interval_ms=300_000,
            )
            self._consumer.subscribe([s.requests_topic], listener=_Listener(self))
            await self._consumer.start()
            committer = asyncio.create_task(self._commit_loop())
            try:
                await self._poll_loop()
                await self._drain()
            finally:
                committer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await committer
                await self._shutdown()
        if self.failed is not None:
            log.error("ingest stopped: %r", self.failed)
            return 1
        return 0

    async def _poll_loop(self) -> None:
        assert self._consumer is not None
        while not self._stop.is_set() and self.failed is None:
            room = self.settings.max_inflight - self._inflight
            self._set_paused(room <= 0)
            if room <= 0:
                await asyncio.sleep(0.01)
                continue
            batches = await self._consumer.getmany(timeout_ms=100, max_records=room)
            for tp, records in batches.items():
                partition = self.partitions.get(tp)
                if partition is None:  # fetched while its assignment is still being opened: again later
                    if records:
                        self._consumer.seek(tp, records[0].offset)
                    continue
                for record in records:
                    partition.next_offset = record.offset + 1
                    # W3C trace context of the request record, and its time for the worker's TTFT.
                    trace = (*propagated(record.headers), request_start_header(record.timestamp))
                    self._handle(partition, record.offset, record.key, record.value, trace)

    def _set_paused(self, paused: bool) -> None:
        assert self._consumer is not None
        if paused == self._paused:
            return
        self._paused = paused
        assigned = list(self._consumer.assignment())
        if paused:
            self._consumer.pause(*assigned)
            log.info("pausing the requests topic: %d requests in flight", self._inflight)
        else:
            self._consumer.resume(*assigned)

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
        if self._consumer is not None:
            await self._consumer.stop()

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
            return
        if rid in restored.cancelled or rid in partition.early_cancels:
            partition.early_cancels.discard(rid)
            cancelled = _error(CANCELLED_CODE, "the request was cancelled", "CancelledError")
            self._finish_with_error(partition, envelope, 0, cancelled, trace)
            return
        request = _Request(partition, offset, envelope, trace)
        partition.running[offset] = request
        partition.by_id[rid] = request
        self._inflight += 1
        request.task = asyncio.create_task(self._run_request(request))

    def _cancel(self, partition: _Partition, request_id: str) -> None:
        request = partition.by_id.get(request_id)
        if request is None:
            if len(partition.early_cancels) < MAX_EARLY_CANCELS:
                partition.early_cancels.add(request_id)
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
        value = error_record(rid, seq, envelope.endpoint, error)
        partition.emit(self.settings.output_topic, rid, value, headers=trace)
        partition.mark(rid, "done")

    # --- one request ---------------------------------------------------------------------------------

    async def _run_request(self, request: _Request) -> None:
        partition, envelope = request.owner, request.envelope
        seqs: dict[str, int] = {}
        try:
            await self._generate(request, seqs)
            partition.mark(envelope.request_id, "done")
        except UpstreamError as exc:
            self._upstream_failed(request, seqs, exc.error)
        except asyncio.CancelledError:
            await self._abort_upstream(request)  # the partition moved or we stop: the rule takes over
            raise
        except Exception as exc:  # a bug must not leave the request silent
            log.exception("request %s failed", envelope.request_id)
            self._upstream_failed(
                request, seqs, _error(500, f"ingest failed: {exc!r}", "InternalServerError")
            )
        finally:
            partition.running.pop(request.offset, None)
            partition.by_id.pop(envelope.request_id, None)
            self._inflight -= 1

    def _upstream_failed(self, request: _Request, seqs: dict[str, int], error: JsonDict) -> None:
        rid = request.envelope.request_id
        # The error goes to each stream that has records, so the worker's reader of that id ends too.
        targets = [sid for sid, seq in seqs.items() if seq > 0] or [rid]
        for sid in targets:
            value = error_record(sid, seqs.get(sid, 0), request.envelope.endpoint, error)
            request.owner.emit(self.settings.output_topic, sid, value, headers=request.trace)
        request.owner.mark(rid, "done")

    async def _generate(self, request: _Request, seqs: dict[str, int]) -> None:
        assert self._client is not None
        envelope = request.envelope
        rendered = await self._until_cancelled(
            request, self._client.render(envelope.endpoint, envelope.request, envelope.request_id)
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
                seqs[sid] = 0
            await asyncio.gather(
                *(self._stream(request, sid, gen, seqs) for sid, gen in zip(ids, rendered, strict=True))
            )
        else:
            await self._one_shot(request, rendered)

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

    async def _stream(
        self, request: _Request, sid: str, generate_request: JsonDict, seqs: dict[str, int]
    ) -> None:
        """Read one generation; a cancel aborts it upstream and gives it ``--abort-grace-s`` to end."""
        request.engine_ids.add(f"generate-tokens-{generate_request.get('request_id')}")
        reader = asyncio.create_task(self._read_stream(request, sid, generate_request, seqs))
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

    async def _read_stream(
        self, request: _Request, sid: str, generate_request: JsonDict, seqs: dict[str, int]
    ) -> None:
        assert self._client is not None
        partition, envelope = request.owner, request.envelope
        try:
            async for chunk in self._client.generate_stream(generate_request):
                if isinstance(chunk.get("request_id"), str):
                    request.engine_ids.add(chunk["request_id"])
                body: JsonDict = {"stream": True, "generate_chunk": chunk}
                if seqs[sid] == 0:
                    body.update(self._first_body(envelope, generate_request))
                value = orjson.dumps(
                    {"request_id": sid, "seq": seqs[sid], "endpoint": envelope.endpoint, "body": body}
                )
                partition.emit(self.settings.input_topic, sid, value, headers=request.trace)
                seqs[sid] += 1
                if not request.started:
                    request.started = True
                    partition.mark(envelope.request_id, "started")
        except UpstreamError as exc:
            if exc.error["code"] == 504:  # stalled: free the engine's slot too
                await self._abort_upstream(request)
            raise

    async def _abort_upstream(self, request: _Request) -> None:
        if self._client is not None and request.engine_ids:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._client.abort(sorted(request.engine_ids)))

    async def _one_shot(self, request: _Request, rendered: list[JsonDict]) -> None:
        assert self._client is not None
        envelope = request.envelope
        responses = await self._until_cancelled(
            request, asyncio.gather(*(self._client.generate(gen) for gen in rendered))
        )
        if responses is None:
            raise UpstreamError(CANCELLED_CODE, "the request was cancelled", "CancelledError")
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
        value = orjson.dumps({"request_id": rid, "seq": 0, "endpoint": envelope.endpoint, "body": body})
        request.owner.emit(self.settings.input_topic, rid, value, headers=request.trace)
        request.started = True

    # --- partitions ----------------------------------------------------------------------------------

    async def open_partition(self, tp: TopicPartition) -> None:
        s = self.settings
        producer = self.connection.producer(transactional_id=s.transactional_id(tp.partition), linger_ms=0)
        await producer.start()  # init_transactions: fences the last owner, aborts its open transaction
        assert self._consumer is not None
        try:
            # Not aiokafka's committed() and position: see fetch_committed.
            committed = await fetch_committed(self._consumer._coordinator, s.group_id, tp)
            if committed is not None:
                self._consumer.seek(tp, committed)
            restored = await self._restore(tp, committed or 0)
        except BaseException:
            await producer.stop()
            raise
        partition = _Partition(self, tp, producer, restored)
        partition.committed = committed
        self.partitions[tp] = partition
        log.info(
            "requests partition %d from offset %s: %d started and %d done requests in its tail",
            tp.partition,
            committed,
            len(restored.started - restored.done),
            len(restored.done),
        )

    async def _restore(self, tp: TopicPartition, start: int) -> _Restored:
        """Read the partition from ``start`` to its end: the markers and cancels of the attempt rule."""
        restored = _Restored()
        scanner = self.connection.consumer()
        await scanner.start()
        try:
            scanner.assign([tp])
            scanner.seek(tp, start)
            end = (await scanner.end_offsets([tp]))[tp]
            while await scanner.position(tp) < end:
                batches = await scanner.getmany(tp, timeout_ms=200)
                for record in batches.get(tp, ()):
                    with contextlib.suppress(orjson.JSONDecodeError, ValidationError):
                        raw = orjson.loads(record.value or b"")
                        if isinstance(raw, dict) and "ingest" in raw:
                            marker = IngestMarker.model_validate(raw)
                            (restored.started if marker.ingest == "started" else restored.done).add(
                                marker.request_id
                            )
                        elif isinstance(raw, dict) and "cancel" in raw:
                            restored.cancelled.add(CancelRecord.model_validate(raw).request_id)
        finally:
            await scanner.stop()
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
            await partition.producer.stop()


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"]) or "record"
    return f"{where}: {error['msg']}"


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        for tp in revoked:
            partition = self.ingest.partitions.get(tp)
            if partition is not None:
                await self.ingest._close_partition(partition, commit=True)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            if tp not in self.ingest.partitions:
                await self.ingest.open_partition(tp)


# --- the command ------------------------------------------------------------------------------------


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ingest = commands.add_parser(
        "ingest", help="requests topic -> vLLM render + generate -> input envelopes for the worker"
    )
    add_arguments(ingest, IngestOptions)
    add_connection_arguments(ingest, producing=True)
    add_arguments(ingest, LoggingSettings, MetricsServerSettings)
    ingest.set_defaults(handler=_ingest)


def _ingest(args: argparse.Namespace) -> int:
    load(LoggingSettings, args).configure()
    settings = load(IngestOptions, args)
    connection = Connection.from_args(args, "ingest")
    health = load(MetricsServerSettings, args)

    async def main() -> int:
        ingest = Ingest(settings, connection)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, ingest.request_stop)
        async with serving_health(health, ingest):  # /healthz, /readyz, /metrics
            return await ingest.run()

    return asyncio.run(main())
