"""Execution de-duplication: the ids of completed jobs, shared through a stream per queue (DESIGN §19).

At-least-once delivery made effectively-once.  A worker with ``deduplicate=True`` acks without
running a delivery whose job id already completed: the duplicates a broker crash leaves (acks
it had not yet written come back as redeliveries) and those Spark task retries send (same ids
by design, DESIGN §15).

* :class:`CompletedIds` is what a worker knows: a set of ids bounded by age and by count.
  A UUID id is kept as its 128-bit ``int`` (one object, shared by the set and by its age
  bucket's list), any other id as its string.  Expiry drops whole age buckets (64 per
  ``max_age``); past ``max_ids`` the oldest bucket goes first.
* :class:`CompletedLog` owns one connection of its own, in a thread of its own.  At start it
  declares ``ojs.stream.completed.{q}`` (:class:`~ojs_kombu.wire.completed.CompletedOptions`:
  ``x-max-age``, ``x-max-length-bytes``) for every queue served, consumes it from ``first``
  and publishes a marker to it; it is *caught up* (:meth:`CompletedLog.start` returns) once
  every marker is read back, as the control plane's :class:`~ojs_kombu.runtime.control.ControlReader`
  does.  It then follows the streams live, so the workers of a queue share what each completed.
  Replaying is idempotent: a reconnect replays again.
* :meth:`CompletedLog.record` adds a completed id at once (this worker skips a redelivery of it
  from now on) and queues it for the stream.  The thread publishes every pass's ids of a queue
  as one record (up to ``batch_size``), confirmed, pipelined (it does not wait for a confirm
  before the next record), and calls each id's ``on_recorded(True)`` when its record is
  confirmed.  The worker acks the delivery there: **record confirmed, then ack**.

Why this order.  The crash windows, for a job whose handler returned:

=======================================  ===============================================
crash (broker or worker) between …       what happens to the delivery
=======================================  ===============================================
handler end and record confirmed         redelivered, runs again: a duplicate (window:
                                         one confirm round trip, a few ms)
record confirmed and ack written         redelivered, skipped (acked without running)
ack written and ack applied by the       same: the broker forgets unapplied acks on a
broker (the broker's own crash)          kill, the record is on disk: skipped
=======================================  ===============================================

Acking first and recording after would leave every redelivery whose record had not been
confirmed yet a duplicate, and a broker kill loses seconds of acks.  A record is only ever
written after the handler returned, so an id found completed was completed: skipping it never
loses a job.  A record that cannot be written (the connection is down longer than
``record_timeout``, or the broker refuses it) is given up: ``on_recorded(False)``, the worker
acks anyway, and the job may run again if it is delivered again (at worst a duplicate).
The log reconnects as every long-running loop does (:class:`~ojs_kombu.amqp.reconnect.Forever`:
the next node, the §9 back-off); refused for good (403, 530: a user without permissions on the
streams, say) it stops reconnecting, keeps the error in :attr:`CompletedLog.error` and gives up
every record at once from then on: the worker goes on without de-duplication.
"""

from __future__ import annotations

import logging
import os
import re
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from amqp import Message

from ojs_kombu.amqp.connection import DEFAULT_HEARTBEAT, close_quietly
from ojs_kombu.amqp.errors import consuming
from ojs_kombu.amqp.failover import Failover
from ojs_kombu.amqp.publisher import ConfirmedPublisher, PublishTicket
from ojs_kombu.amqp.reconnect import Forever, Reconnector
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import BrokerRefusedError, DecodeError, ValidationError
from ojs_kombu.model.naming import Names
from ojs_kombu.wire.completed import CompletedOptions, completed_marker, completed_record, decode_completed

logger = logging.getLogger(__name__)

# Seconds between two checks for records to give up once the log was refused for good.
_REFUSED_POLL = 0.05

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_UUIDS = re.compile(rf"(?:{_UUID.pattern},)*{_UUID.pattern}")  # a comma-joined list of UUIDs
_BUCKETS = 64  # age buckets per max_age: an id is forgotten between max_age and max_age * 65/64 after


#: Deliveries a de-duplicating consumer may hold beyond its concurrency: completed jobs waiting
#: for their record's confirm before their ack (a few ms: at 5,000 jobs/s, tens of them).
DEDUPE_EXTRA_PREFETCH = 64


def dedupe_prefetch(concurrency: int) -> int:
    """The prefetch count of a consumer running ``concurrency`` jobs at once with de-duplication.

    Parameters:
        concurrency: jobs run at once.

    Returns:
        ``concurrency`` + :data:`DEDUPE_EXTRA_PREFETCH`.
    """
    return concurrency + DEDUPE_EXTRA_PREFETCH


def id_key(job_id: str) -> int | str:
    """The key :class:`CompletedIds` keeps for ``job_id``: a UUID's 128-bit integer (any case), else the id.

    Parameters:
        job_id: a job id.

    Returns:
        The key.
    """
    if len(job_id) == 36 and _UUID.fullmatch(job_id):
        return int(job_id.replace("-", ""), 16)
    return job_id.lower()


def keys_of(job_ids: Iterable[str]) -> list[int | str]:
    """:func:`id_key` of each of ``job_ids``; a list of UUIDs (a record) is checked with one regex pass.

    Parameters:
        job_ids: job ids.

    Returns:
        Their keys, in order.
    """
    listed = job_ids if isinstance(job_ids, list | tuple) else list(job_ids)
    if _UUIDS.fullmatch(",".join(listed)):
        return [int(job_id.replace("-", ""), 16) for job_id in listed]
    return [id_key(job_id) for job_id in listed]


class Completions(Protocol):
    """What a :class:`~ojs_kombu.runtime.settle.Settler` asks of the completed job ids: a
    :class:`CompletedLog`, or the ``ojs://`` transport's one log per consumed queue."""

    def is_completed(self, job_id: str) -> bool:
        """Whether ``job_id`` completed already."""

    def record(self, job_id: str, queue: str, on_recorded: Callable[[bool], None] | None = None) -> None:
        """Record that ``job_id`` of ``queue`` completed; ``on_recorded(ok)`` once confirmed or given up."""


class CompletedIds:
    """A thread-safe set of completed job ids, bounded by age and by count.

    Memory: about 100 bytes per UUID id (a 128-bit ``int`` of 48 bytes, its set slot and its
    bucket's list slot); measured in ``benchmarks/completed_ids.py``.

    Parameters:
        max_age: seconds an id is kept after its completion time.
        max_ids: the most ids kept (the oldest go first).
        clock: the time (epoch seconds) expiry compares with.

    Raises:
        ValidationError: a bound is not positive.
    """

    def __init__(self, max_age: float, max_ids: int, *, clock: Callable[[], float] = time.time):
        if max_age <= 0 or max_ids < 1:
            raise ValidationError(
                "max_age and max_ids must be positive", field="max_age" if max_age <= 0 else "max_ids"
            )
        self.max_age = float(max_age)
        self.max_ids = max_ids
        self.clock = clock
        self._width = self.max_age / _BUCKETS
        self._ids: set[int | str] = set()
        self._buckets: dict[int, list[int | str]] = {}
        self._lock = threading.Lock()
        self._expired_before = -1  # every bucket below this index has been dropped

    def add(self, job_id: str, at: float | None = None) -> bool:
        """Record ``job_id`` as completed at ``at`` (epoch seconds, default now).

        Returns:
            False when it was known already, or is older than ``max_age``.
        """
        return self.add_many((job_id,), self.clock() if at is None else at) == 1

    def add_many(self, job_ids: Iterable[str], at: float) -> int:
        """Record ``job_ids`` as completed at ``at`` (epoch seconds); returns how many were new."""
        index = int(at // self._width)
        now = self.clock()
        with self._lock:
            self._expire(now)
            if index <= self._expired_before or at <= now - self.max_age:
                return 0
            ids = self._ids
            fresh = set(keys_of(job_ids))
            fresh.difference_update(ids)
            if fresh:
                ids.update(fresh)
                bucket = self._buckets.get(index)
                if bucket is None:
                    bucket = self._buckets[index] = []
                bucket.extend(fresh)
            added = len(fresh)
            while len(ids) > self.max_ids and self._buckets:
                self._drop(min(self._buckets))
            return added

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and id_key(job_id) in self._ids  # a set lookup is atomic under the GIL

    def __len__(self) -> int:
        return len(self._ids)

    def expire(self) -> int:
        """Forget the ids older than ``max_age``; returns how many were forgotten."""
        with self._lock:
            return self._expire(self.clock())

    def _expire(self, now: float) -> int:
        horizon = int((now - self.max_age) // self._width)  # buckets wholly older than max_age end below it
        if horizon <= self._expired_before:
            return 0
        forgotten = 0
        for index in [i for i in self._buckets if i < horizon]:
            forgotten += self._drop(index)
        self._expired_before = horizon - 1
        return forgotten

    def _drop(self, index: int) -> int:
        bucket = self._buckets.pop(index)
        self._ids.difference_update(bucket)
        return len(bucket)


@dataclass
class _Pending:
    job_id: str
    queue: str
    on_recorded: Callable[[bool], None] | None
    since: float = field(default_factory=time.monotonic)


class CompletedLog:
    """The completed job ids of ``queues``: replayed at start, followed live, recorded (see the module docstring).

    Parameters:
        url: the broker URL (a ``;``-separated failover list too).
        queues: the OJS queues whose completions are read and recorded.
        names: the entity names (prefix).
        topology: declares the streams (default: a new one of ``names``).
        options: bounds of the streams and of the ids kept.
        batch_size: the most ids one record carries.
        record_timeout: seconds a completion may wait for its record to be confirmed (the
            connection is down) before it is given up (``on_recorded(False)``).
        replay_timeout: seconds :meth:`start` waits for the catch-up by default.
        prefetch: ``Basic.Qos`` of the stream consumer (records in flight).
        heartbeat, ssl, transport_options, connection_name: of the connection.
    """

    def __init__(
        self,
        url: str,
        queues: Iterable[str],
        *,
        names: Names | None = None,
        topology: Topology | None = None,
        options: CompletedOptions | None = None,
        batch_size: int = 1000,
        record_timeout: float = 30.0,
        replay_timeout: float = 120.0,
        prefetch: int = 200,
        heartbeat: float = DEFAULT_HEARTBEAT,
        ssl: Any = None,
        transport_options: dict[str, Any] | None = None,
        connection_name: str = "ojs_kombu completed ids",
    ):
        self.url = url
        self.queues = list(dict.fromkeys(queues))
        self.names = names or Names()
        self.topology = topology or Topology(self.names)
        self.options = options or CompletedOptions()
        self.ids = CompletedIds(self.options.max_age_seconds, self.options.max_ids)
        self.batch_size = batch_size
        self.record_timeout = record_timeout
        self.replay_timeout = replay_timeout
        self.prefetch = prefetch
        self.heartbeat = heartbeat
        self.ssl = ssl
        self.transport_options = transport_options
        self.connection_name = connection_name
        self._failover = Failover(
            url, heartbeat=heartbeat, ssl=ssl, transport_options=transport_options, connection_name=connection_name
        )
        self._reconnect = Reconnector(Forever(), self._failover, url=url, name="completed ids connection")
        self.error: BrokerRefusedError | None = None
        """The permanent refusal that stopped the log reconnecting (its records are given up), or None."""
        self.started = 0.0  # monotonic time of start()
        self.ready = threading.Event()
        """Set once caught up with every stream (after each (re)connection's replay)."""
        self.replayed = 0  # ids read during the last catch-up
        self.replay_seconds = 0.0  # how long the last catch-up took
        self.recorded = 0  # ids whose record was confirmed
        self.given_up = 0  # ids whose record was given up
        self._streams = {q: self.names.completed_stream(q) for q in self.queues}
        self._pending: deque[_Pending] = deque()
        self._in_flight: dict[int, list[_Pending]] = {}  # publish tag -> what it records
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_pending = False  # a byte is (about to be) in the pipe: the loop will wake
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._kombu: Any = None
        self._connection: Any = None
        self._publisher: ConfirmedPublisher | None = None
        self._channel: Any = None
        self._markers: dict[str, str] = {}
        self._catch_up_started = 0.0
        self._unacked = 0

    # -- the worker's side ---------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> bool:
        """Start the thread and wait until caught up with every stream.

        Parameters:
            timeout: seconds to wait (default ``replay_timeout``).

        Returns:
            Whether it caught up in time (it goes on trying in the background either way).
        """
        if self._thread is None:
            self.started = time.monotonic()
            self._thread = threading.Thread(target=self._run, name="ojs-completed-ids", daemon=True)
            self._thread.start()
        deadline = time.monotonic() + (self.replay_timeout if timeout is None else timeout)
        while not self.ready.wait(max(0.0, min(0.1, deadline - time.monotonic()))):
            if self.error is not None or time.monotonic() >= deadline:
                return False
        return True

    def is_completed(self, job_id: str) -> bool:
        """Whether ``job_id`` completed (within ``max_age``), here or in another worker of these queues."""
        return job_id in self.ids

    def record(self, job_id: str, queue: str, on_recorded: Callable[[bool], None] | None = None) -> None:
        """Record that ``job_id`` of ``queue`` completed; thread-safe, returns at once.

        Parameters:
            job_id: the job's id.
            queue: its OJS queue (one of :attr:`queues`).
            on_recorded: called (in the log's thread) with True once the record is confirmed, or
                False once it is given up; the worker acks the delivery there.

        Raises:
            ValidationError: ``queue`` is not one of :attr:`queues`.
        """
        if queue not in self._streams:
            raise ValidationError(f"queue {queue!r} is not de-duplicated by this worker", field="queue")
        self.ids.add(job_id.lower())
        with self._lock:
            self._pending.append(_Pending(job_id.lower(), queue, on_recorded))
        self._wake()

    def stop(self, timeout: float = 10.0) -> None:
        """Publish what is pending, wait for its confirms (up to ``timeout``), close.

        What is still unconfirmed then is given up (``on_recorded(False)``).
        """
        self._stop.set()
        self._wake()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        self._give_up(lambda item: True)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1

    def _wake(self) -> None:
        # One byte per wait of the loop, not one per record: the loop takes every pending record
        # after it has cleared the pipe (and the flag), so a record made meanwhile is never missed.
        if self._wake_pending:
            return
        self._wake_pending = True
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # full (a wake-up is pending anyway) or closed (stopped)

    # -- the log's thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._reconnecting()
        except BrokerRefusedError as exc:
            self.error = exc
            logger.error(
                "completed ids: the broker refused for good (%s); the completions of %s are not recorded "
                "from now on (de-duplication is off)",
                exc,
                ", ".join(self.queues),
            )
            while not self._stop.wait(_REFUSED_POLL):
                self._give_up(lambda item: True)

    def _reconnecting(self) -> None:
        """Connect, replay and serve until stopped, reconnecting after a failure (see the module)."""
        delay = 0.0
        while not self._stop.is_set():
            if delay:
                deadline = time.monotonic() + delay
                while not self._stop.is_set() and time.monotonic() < deadline:
                    self._give_up(lambda item: time.monotonic() - item.since > self.record_timeout)
                    self._stop.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                if self._stop.is_set():
                    break
            try:
                self._connect()
                delay = 0.0
                self._serve()
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect, replay again
                if self._stop.is_set():
                    break
                delay = self._reconnect.failed(exc, self._kombu)  # raises when refused for good
            finally:
                self._disconnect()

    def _connect(self) -> None:
        self.ready.clear()
        self._kombu = self._failover.connection()
        self._reconnect.connecting()
        self._failover.connect(self._kombu)
        self._reconnect.succeeded()
        connection = self._connection = self._kombu.connection
        self.topology.declare(
            connection, [s for q in self.queues for s in self.topology.completed_specs(q, self.options)], force=True
        )
        self._publisher = ConfirmedPublisher(connection)
        channel = self._channel = connection.channel()
        channel.auto_decode = False
        channel.basic_qos(0, self.prefetch, False)
        self._unacked = 0
        self._markers.clear()
        self.replayed = 0
        self._catch_up_started = time.monotonic()
        for queue, stream in self._streams.items():
            with consuming(stream):
                channel.basic_consume(
                    stream,
                    no_ack=False,
                    callback=partial(self._on_message, queue),
                    arguments={"x-stream-offset": "first"},
                )
        self._reconnect.reset()  # after consuming: a stream that refuses every consumer keeps its count
        for queue, stream in self._streams.items():
            marker = completed_marker()
            self._markers[marker.properties["message_id"]] = queue
            self._publisher.publish(marker, exchange="", routing_key=stream, queue=stream)

    def _serve(self) -> None:
        connection = self._connection
        publisher = self._publisher
        assert connection is not None and publisher is not None
        sock = connection.sock
        last_expiry = time.monotonic()
        while True:
            stopping = self._stop.is_set()
            self._publish_pending(publisher)
            if stopping and not self._pending and not self._in_flight:
                return
            now = time.monotonic()
            if now - last_expiry > 1.0:
                last_expiry = now
                self.ids.expire()
                if not self.ready.is_set() and now - self._catch_up_started > self.replay_timeout:
                    raise TimeoutError(f"the completed-ids streams were not replayed within {self.replay_timeout:.0f}s")
            pending = getattr(sock, "pending", None)  # TLS sockets buffer decrypted bytes
            if not (pending and pending()):
                readable, _, _ = select.select([sock, self._wake_r], [], [], 0.2 if stopping else 1.0)
                if self._wake_r in readable:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                    self._wake_pending = False
            while True:
                try:
                    connection.drain_events(timeout=0)
                except TimeoutError:
                    break
            connection.heartbeat_tick()

    def _publish_pending(self, publisher: ConfirmedPublisher) -> None:
        with self._lock:
            if not self._pending:
                return
            taken = list(self._pending)
            self._pending.clear()
        by_queue: dict[str, list[_Pending]] = {}
        for item in taken:
            by_queue.setdefault(item.queue, []).append(item)
        for queue, items in by_queue.items():
            stream = self._streams[queue]
            for start in range(0, len(items), self.batch_size):
                chunk = items[start : start + self.batch_size]
                ticket = publisher.publish(
                    completed_record([item.job_id for item in chunk]),
                    exchange="",
                    routing_key=stream,
                    queue=stream,
                    on_done=self._confirmed,
                    flush=False,
                )
                self._in_flight[ticket.tag] = chunk
        publisher.flush()

    def _confirmed(self, ticket: PublishTicket) -> None:
        items = self._in_flight.pop(ticket.tag, None)
        if items is None:  # a marker
            return
        ok = ticket.error is None
        if ok:
            self.recorded += len(items)
        else:
            self.given_up += len(items)
            logger.warning("the record of %d completed job id(s) failed: %s", len(items), ticket.error)
        for item in items:
            if item.on_recorded is not None:
                item.on_recorded(ok)

    def _give_up(self, stale: Callable[[_Pending], bool]) -> None:
        """Give up the pending records ``stale`` selects (disconnected too long, or stopped)."""
        with self._lock:
            if not self._pending:
                return
            gone = [item for item in self._pending if stale(item)]
            if not gone:
                return
            kept = [item for item in self._pending if not stale(item)]
            self._pending.clear()
            self._pending.extend(kept)
        self.given_up += len(gone)
        logger.warning("gave up recording %d completed job id(s): the broker is unreachable", len(gone))
        for item in gone:
            if item.on_recorded is not None:
                item.on_recorded(False)

    def _disconnect(self) -> None:
        # What was published and not confirmed goes out again on the next connection (a record
        # written twice is harmless), ahead of what came since.
        if self._in_flight:
            with self._lock:
                for tag in sorted(self._in_flight, reverse=True):
                    self._pending.extendleft(reversed(self._in_flight[tag]))
            self._in_flight.clear()
        if self._kombu is not None:
            close_quietly(self._kombu)
        self._kombu = self._connection = self._publisher = self._channel = None

    def _on_message(self, queue: str, message: Message) -> None:
        self._unacked += 1
        if self._unacked >= max(1, self.prefetch // 4) and self._channel is not None:
            self._channel.basic_ack(message.delivery_info["delivery_tag"], multiple=True)  # credit only
            self._unacked = 0
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
        try:
            record = decode_completed(body, dict(message.properties))
        except DecodeError as exc:
            logger.warning("ignoring an unreadable completion record on %s: %s", self._streams[queue], exc)
            return
        if record is None:
            return
        if record.marker is not None:
            if self._markers.pop(record.marker, None) is not None and not self._markers:
                self.replay_seconds = time.monotonic() - self._catch_up_started
                logger.info(
                    "completed ids caught up: %d id(s) replayed in %.3fs, %d known",
                    self.replayed,
                    self.replay_seconds,
                    len(self.ids),
                )
                self.ready.set()
            return
        self.ids.add_many(record.ids, record.at)
        if not self.ready.is_set():
            self.replayed += len(record.ids)


__all__ = ["DEDUPE_EXTRA_PREFETCH", "CompletedIds", "CompletedLog", "Completions", "dedupe_prefetch", "id_key"]
