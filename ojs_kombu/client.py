"""The producer side: :class:`Client` enqueues OJS jobs with publisher confirms.

::

    from ojs_kombu import Client

    with Client("amqp://guest:guest@localhost//") as client:
        job = client.enqueue("email.send", ["user@example.com", "welcome"], queue="email")
        outcomes = client.enqueue_many([Job.create("report.build", [i]) for i in range(1000)])

Every publish goes to ``ojs.exchange.direct`` with routing key ``{queue}``,
``mandatory=True``, on a channel in confirm mode (binding §5.1).  The job queue
and its dead letter queue are declared before the first publish to a queue
(lazy declaration) or up front with ``queues=`` / :meth:`Client.declare_queue`
(eager declaration).  Connections come from a kombu pool: each thread that
enqueues takes a pooled connection and the publisher channel that lives on it,
so a channel is never used by two threads at once (AMQP-028).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache, partial
from typing import Any, TypedDict, TypeVar, Unpack

from amqp import Channel, Message
from amqp.exceptions import NotFound, RecoverableConnectionError
from kombu.connection import Connection

from ojs_kombu.amqp.connection import DEFAULT_HEARTBEAT, close_quietly, resolve_url, safe_url
from ojs_kombu.amqp.errors import connection_error, map_exceptions
from ojs_kombu.amqp.failover import Failover
from ojs_kombu.amqp.properties import properties_template
from ojs_kombu.amqp.publisher import ConfirmedPublisher, PublishTicket
from ojs_kombu.amqp.topology import OnConflict, Topology
from ojs_kombu.amqp.urls import BrokerUrls
from ojs_kombu.errors import (
    BrokerConnectionError,
    BrokerRefusedError,
    DecodeError,
    OjsError,
    PublishError,
    ValidationError,
)
from ojs_kombu.gc_pause import GcPause
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import Names, validate_queue_name
from ojs_kombu.model.policies import RetryPolicy
from ojs_kombu.model.timefmt import utcnow
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.observability.tracing import current_trace_meta, with_trace_context
from ojs_kombu.policy.schedule import Cascade, check_delay, delay_ms_until
from ojs_kombu.runtime.control import Cancellations, ControlReader
from ojs_kombu.runtime.deadletter import (
    DeadLetterEntry,
    FinalFailureJoin,
    ReplayProgress,
    SameDeath,
    read_final_failures,
    replayable,
)
from ojs_kombu.runtime.presence import read_events
from ojs_kombu.wire.codec import OutgoingMessage, encode, encode_body, properties_key
from ojs_kombu.wire.control import (
    ControlOptions,
    cancel_message,
    control_job_id,
    decode_info_reply,
    info_message,
    pause_message,
)
from ojs_kombu.wire.entities import QueueOptions, QueueType
from ojs_kombu.wire.events import EventsOptions, JobEventRecord, WorkerPresence

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a Client operation keeps reconnecting before BrokerConnectionError (``publish_timeout``).
DEFAULT_PUBLISH_TIMEOUT = 5.0

#: Seconds :meth:`Client.info` keeps listening after the first answer that is not ``active``
#: (other workers of the queue may know the job better).
INFO_SETTLE_WINDOW = 0.2

#: Dead letters a replay holds unacknowledged at most (``replay_dead_letters(window=)``).
DEFAULT_REPLAY_WINDOW = 100

#: A worker whose latest presence is older than this many seconds is not listed by ``workers()``
#: (three presence intervals).
DEFAULT_STALE_AFTER = 15.0

#: ``enqueue_many`` pauses the cyclic garbage collector for batches of at least this many jobs
#: (:mod:`ojs_kombu.gc_pause`); a smaller batch's objects hardly outlive a young collection.
GC_PAUSE_MIN_JOBS = 1000

# enqueue_many's encoded properties per wire.codec.properties_key (a batch's jobs share them but for
# their ids): key -> (before, after) the message id.  Bounded: when full it starts over.
_TEMPLATES: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}
_TEMPLATES_LIMIT = 1024


def _remember_template(key: tuple[Any, ...], message: OutgoingMessage) -> tuple[bytes, bytes] | None:
    """The encoded properties of ``message`` around its id, remembered under ``key``; None when
    they cannot be encoded (the message's own publish then says why)."""
    try:
        template = properties_template(message.properties, message.headers)
    except ValueError:
        return None
    if len(_TEMPLATES) >= _TEMPLATES_LIMIT:
        _TEMPLATES.clear()
    _TEMPLATES[key] = template
    return template


# Timestamp offsets of a stream point at chunks: start reading a little earlier, filter by body times.
_STREAM_OFFSET_SLACK = timedelta(seconds=1)


class JobOptions(TypedDict, total=False):
    """The keyword options of :meth:`Job.create`, as :meth:`Client.enqueue` takes them."""

    queue: str
    kwargs: dict[str, Any] | None
    meta: dict[str, Any] | None
    priority: int | None
    retry: RetryPolicy | Mapping[str, Any] | None
    scheduled_at: datetime | str | timedelta | None
    expires_at: datetime | str | timedelta | None
    timeout: int | None
    tags: list[str] | tuple[str, ...] | None
    id: str | uuid.UUID | None


@dataclass
class EnqueueResult:
    """The outcome of one job of :meth:`Client.enqueue_many`."""

    job: Job
    error: OjsError | None = None

    @property
    def ok(self) -> bool:
        """True when the broker confirmed the job."""
        return self.error is None

    def unwrap(self) -> Job:
        """The job, or raise the error that kept it from being enqueued."""
        if self.error is not None:
            raise self.error
        return self.job


@dataclass(frozen=True)
class QueueCounts:
    """What a passive ``Queue.Declare`` tells of a queue (:meth:`Client.queue_counts`)."""

    ready: int
    consumers: int


class _Session:
    """The publisher living on one pooled connection."""

    def __init__(self, connection: Connection, window: int):
        self.publisher = ConfirmedPublisher(connection.connection, window=window)
        self.last_used = time.monotonic()


class Client:
    """Enqueues OJS jobs on RabbitMQ; thread-safe, a context manager.

    Parameters:
        url: broker URL (``amqp://``, ``amqps://``, ``ojs://``, ``ojss://``), or the nodes of a
            cluster as a ``;``-separated list (``"amqp://n1;amqp://n2"``) or a list/tuple of URLs:
            on a connection loss the client moves to the next node, and backs off only after
            every node failed in a row (``docs/cluster.md``, Failover).  Default ``$OJS_AMQP_URL``.
        prefix: multi-tenant prefix of every entity name (``tenant1.ojs.queue.email``).
        queue_options: optional arguments of every job queue this client declares.
        queue_type: ``"quorum"`` (or ``"classic"``) sets ``queue_options.queue_type``: with
            ``"quorum"`` every entity a job passes through (job queue, DLQ, retry queues,
            scheduling cascade) is a quorum queue with at-least-once dead-lettering
            (``docs/cluster.md``).
        queues: job queues declared eagerly when the client starts.
        declare: declare a job queue lazily before the first publish to it.
        pool_size: at most this many connections (one per concurrently publishing thread).
        confirm_timeout: seconds to wait for publisher confirms.
        publish_timeout: seconds an operation (``enqueue``, ``declare_queue``, …) keeps
            trying to reach the broker once a connection attempt failed: attempts follow
            the back-off ``min(2^(n-1), 60)`` s ±25 % (DESIGN §9), cut short at this
            budget, and each TCP connect may take at most what is left of it.  Then
            :class:`BrokerConnectionError`.  Default 5 s; ``None``: no time limit.
        connect_retries: also give up after this many failed reconnections (``None``: no
            limit but ``publish_timeout``).
        heartbeat: AMQP heartbeat in seconds.
        app_id: ``app_id`` property of published jobs (default ``"ojs"``).
        on_conflict: what to do when a queue exists with other arguments
            (``"use-existing"``: warn and use it; ``"raise"``).  A job queue whose
            dead-letter arguments differ is refused either way.
        connection_name: shown by the broker (management UI) for this client's connections.
        ssl: TLS: ``None`` (only for ``amqps://`` / ``ojss://`` URLs, system CAs), ``True``, or a dict
            of ``ca_certs``, ``certfile``, ``keyfile``, ``server_hostname``, ``verify`` (see
            :func:`ojs_kombu.amqp.connection.tls_options`).  The certificate chain and the host
            name are verified unless ``verify`` is ``False``; a failed verification raises
            :class:`~ojs_kombu.errors.TlsVerificationError` at once.
        transport_options: passed to :class:`kombu.Connection`.
        window: publishes a connection may have awaiting their confirm.
        control: retention of the control streams ``ojs.queue.control.{q}`` this client declares.
        events_options: retention of the events stream ``ojs.stream.events`` (declared by
            :meth:`workers` and :meth:`events`); must match the workers'.

    Raises:
        ValidationError: a bad option, or a bad failover list (empty, malformed, mixed schemes).
        BrokerConnectionError, BrokerRefusedError: declaring ``queues`` failed.
    """

    def __init__(
        self,
        url: BrokerUrls | None = None,
        *,
        prefix: str = "",
        queue_options: QueueOptions | None = None,
        queue_type: QueueType | None = None,
        queues: Iterable[str] = (),
        declare: bool = True,
        pool_size: int = 10,
        confirm_timeout: float = 30.0,
        publish_timeout: float | None = DEFAULT_PUBLISH_TIMEOUT,
        connect_retries: int | None = None,
        heartbeat: float = DEFAULT_HEARTBEAT,
        app_id: str | None = None,
        on_conflict: OnConflict = "use-existing",
        ssl: Any = None,
        transport_options: dict[str, Any] | None = None,
        window: int = 1000,
        connection_name: str | None = None,
        control: ControlOptions | None = None,
        events_options: EventsOptions | None = None,
    ):
        if publish_timeout is not None and not publish_timeout > 0:
            raise ValidationError(
                f"publish_timeout must be > 0 seconds or None, got {publish_timeout!r}", field="publish_timeout"
            )
        if connect_retries is not None and connect_retries < 0:
            raise ValidationError(
                f"connect_retries must be >= 0 or None, got {connect_retries!r}", field="connect_retries"
            )
        self.url = resolve_url(url)
        self.names = Names(prefix)
        self.topology = Topology(
            self.names,
            queue_options=(queue_options or QueueOptions()).with_queue_type(queue_type),
            on_conflict=on_conflict,
            control=control,
            events=events_options,
        )
        self.cascade = Cascade(self.names)
        self.declare = declare
        self.confirm_timeout = confirm_timeout
        self.publish_timeout = publish_timeout
        self.connect_retries = connect_retries
        self.heartbeat = heartbeat
        self.app_id = app_id
        self.window = window
        self.connection_name = connection_name or f"ojs_kombu client {socket.gethostname()} pid {os.getpid()}"
        self._failover = Failover(
            self.url,
            heartbeat=heartbeat,
            ssl=ssl,
            transport_options=transport_options,
            connection_name=self.connection_name,
        )
        self._connection = self._failover.connection()
        self._pool = self._connection.Pool(limit=pool_size)
        self._closed = False
        for queue in queues:
            self.declare_queue(queue)

    # -- public API ----------------------------------------------------------------------------

    def enqueue(self, type: str, args: list[Any] | tuple[Any, ...] | None = None, **options: Unpack[JobOptions]) -> Job:
        """Create a job (:meth:`Job.create`) and enqueue it.

        Parameters:
            type: the job type (``"email.send"``).
            args: its positional arguments (JSON values).
            options: the keyword options of :meth:`Job.create` (:class:`JobOptions`):
                ``queue``, ``kwargs``, ``meta``, ``priority``, ``retry``, ``scheduled_at``,
                ``expires_at``, ``timeout``, ``tags``, ``id``.

        Returns:
            The confirmed job.

        Raises:
            ValidationError: a bad argument (nothing is published).
            UnroutableError, PublishNackedError, PublishTimeoutError: the broker did not take it.
            BrokerConnectionError: the broker could not be reached within ``publish_timeout``.
            BrokerRefusedError: the broker refused the login, the vhost or a permission.
        """
        return self.enqueue_job(Job.create(type, args, **options))

    def enqueue_job(self, job: Job) -> Job:
        """Enqueue an existing :class:`Job`; same outcomes as :meth:`enqueue`.

        A job whose ``scheduled_at`` lies ahead goes through the scheduling
        cascade and reaches its queue at that time, never earlier.
        """
        return self._publish_jobs([job])[0].unwrap()

    def enqueue_many(self, jobs: Iterable[Job]) -> list[EnqueueResult]:
        """Enqueue many jobs: pipelined publishes on one channel, then all confirms.

        A batch of :data:`GC_PAUSE_MIN_JOBS` jobs or more runs with Python's cyclic
        garbage collector paused until its confirms are read (:mod:`ojs_kombu.gc_pause`):
        collections are delayed, never skipped; one batch at a time pauses it, and a
        program that disabled the collector keeps it disabled.

        Parameters:
            jobs: the jobs, e.g. from :meth:`Job.create`.

        Returns:
            One :class:`EnqueueResult` per job, in order; a job that failed carries its
            error and does not affect the others.
        """
        return self._publish_jobs(list(jobs))

    # -- control -------------------------------------------------------------------------------

    def cancel(self, job_id: str, *, queue: str) -> None:
        """CANCEL (binding §5.6, AMQP-019): cancel job ``job_id`` of ``queue``, wherever it is.

        Publishes ``type=ojs.control.cancel``, body ``{"job_id": …}``, to
        ``ojs.exchange.direct`` with key ``control.{queue}`` (confirmed, mandatory):
        it lands in the control stream ``ojs.queue.control.{queue}``, which every
        worker of the queue reads, including workers started later (within the
        stream's retention).  A job not yet run (queued, scheduled, waiting for a
        retry) is acknowledged and dropped when it is delivered; a running job on
        an ``ojs_kombu.Worker`` gets ``current_job().cancelled`` set and, by default,
        :class:`~ojs_kombu.errors.Cancelled` raised in its handler.  Cancelling a
        finished or unknown job is harmless.

        Parameters:
            job_id: the job's id.
            queue: the OJS queue the job belongs to.

        Raises:
            ValidationError: a bad queue name or job id (nothing is published).
            UnroutableError: nothing is bound to ``control.{queue}`` (only possible in the
                degraded mode of a classic control queue, with no worker running).
            PublishNackedError, PublishTimeoutError: the broker did not take it.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`enqueue`.
        """
        validate_queue_name(queue)
        self._publish_control(queue, cancel_message(job_id))

    def pause(self, queue: str) -> None:
        """Pause ``queue``: every ``ojs_kombu.Worker`` of it stops consuming it (``Basic.Cancel``).

        Publishes ``type=ojs.control.pause``, body ``{"queue": …}``, to the control
        stream as :meth:`cancel` does.  Workers keep running and settling the jobs
        they already hold; jobs published meanwhile wait in the queue.  The pause
        outlives worker restarts: a worker replays the control stream at start, and
        the last pause or resume of the queue decides.

        Parameters:
            queue: the OJS queue.

        Raises:
            ValidationError, UnroutableError, PublishNackedError, PublishTimeoutError,
            BrokerConnectionError, BrokerRefusedError: as for :meth:`cancel`.
        """
        self._publish_control(queue, pause_message(queue))

    def resume(self, queue: str) -> None:
        """Resume ``queue`` after :meth:`pause`: its workers consume it again (``Basic.Consume``).

        Publishes ``type=ojs.control.resume``, body ``{"queue": …}``.  Resuming a
        queue that is not paused is harmless.

        Parameters:
            queue: the OJS queue.

        Raises:
            ValidationError, UnroutableError, PublishNackedError, PublishTimeoutError,
            BrokerConnectionError, BrokerRefusedError: as for :meth:`cancel`.
        """
        self._publish_control(queue, pause_message(queue, paused=False))

    def info(self, job_id: str, *, queue: str, timeout: float = 2.0) -> JobInfo | None:
        """INFO (binding §5.8, AMQP-021): what the live workers of ``queue`` know about job ``job_id``.

        An RPC over the control stream: declares an exclusive, auto-delete,
        server-named reply queue, consumes it, and publishes (confirmed)
        ``type=ojs.control.info``, body ``{"job_id": …}``, with ``reply_to`` = that
        queue and a fresh ``correlation_id``, to ``ojs.exchange.direct`` with key
        ``control.{queue}``.  Every worker that runs the job, or finished it within
        its recent-history window, answers.  The first ``active`` answer is returned
        at once; otherwise the latest outcome among the answers received until
        :data:`INFO_SETTLE_WINDOW` seconds after the first (or ``timeout``).

        Parameters:
            job_id: the job's id (any case).
            queue: the OJS queue the job belongs to.
            timeout: seconds to wait for answers (> 0).

        Returns:
            The job's :class:`~ojs_kombu.model.info.JobInfo`, or None when no live
            worker knows it (after ``timeout``).

        Raises:
            ValidationError: a bad job id, queue name or timeout (nothing is published).
            PublishNackedError, PublishTimeoutError, UnroutableError: the broker did not take the request.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`enqueue`.
        """
        validate_queue_name(queue)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValidationError(f"timeout must be a number of seconds > 0, got {timeout!r}", field="timeout")
        control_job_id(job_id)  # refused before any I/O
        return self._run(lambda conn: self._ask_info(conn, job_id, queue, float(timeout)))

    def _ask_info(self, conn: Connection, job_id: str, queue: str, timeout: float) -> JobInfo | None:
        """One INFO round trip on ``conn`` (see :meth:`info`)."""
        deadline = time.monotonic() + timeout
        session = self._session(conn)
        if self.declare:
            self.topology.ensure_queue(conn.connection, queue)
        channel = conn.connection.channel()
        channel.auto_decode = False
        answers: list[JobInfo] = []
        correlation_id = str(uuid.uuid4())

        def on_reply(message: Message) -> None:
            body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
            try:
                correlation, answer = decode_info_reply(body, dict(message.properties))
            except DecodeError as exc:
                logger.warning("ignoring an unreadable INFO reply: %s", exc)
                return
            if correlation == correlation_id:
                answers.append(answer)

        try:
            reply_to, _, _ = channel.queue_declare("", durable=False, exclusive=True, auto_delete=True)
            channel.basic_consume(reply_to, no_ack=True, callback=on_reply)
            self._publish_control_on(
                session, queue, info_message(job_id, reply_to=reply_to, correlation_id=correlation_id)
            )
            settling = False
            while not any(answer.state == "active" for answer in answers):
                if answers and not settling:  # other workers may know better: listen a little longer
                    settling = True
                    deadline = min(deadline, time.monotonic() + INFO_SETTLE_WINDOW)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    conn.connection.drain_events(timeout=remaining)
                except TimeoutError:
                    continue  # the loop ends on the deadline
        finally:
            close_quietly(channel)  # the reply queue goes with it (exclusive, auto-delete)
        return best_answer(answers)

    def _publish_control(self, queue: str, message: OutgoingMessage) -> None:
        """Publish a control ``message`` to the control stream of ``queue`` (confirmed, mandatory)."""

        def publish(conn: Connection) -> None:
            session = self._session(conn)
            if self.declare:
                self.topology.ensure_queue(conn.connection, queue)
            self._publish_control_on(session, queue, message)

        self._run(publish)

    def _publish_control_on(self, session: _Session, queue: str, message: OutgoingMessage) -> None:
        """Publish ``message`` to the control stream of ``queue`` on ``session`` and wait for its confirm."""
        ticket = session.publisher.publish(
            message,
            exchange=self.names.direct_exchange,
            routing_key=self.names.control_routing_key(queue),
            queue=queue,
            job_id=message.properties["message_id"],
            confirm_timeout=self.confirm_timeout,
        )
        session.publisher.wait([ticket], self.confirm_timeout)
        session.last_used = time.monotonic()
        ticket.raise_for_error()

    # -- events stream --------------------------------------------------------------------------

    def workers(self, *, stale_after: float = DEFAULT_STALE_AFTER, timeout: float = 10.0) -> list[WorkerPresence]:
        """The live workers, from their latest presence on the events stream (BEAT, DESIGN §14).

        Reads ``ojs.stream.events`` from ``stale_after`` seconds ago up to now and keeps
        each worker's latest presence; a worker that stopped gracefully (its last presence
        is ``offline``) or whose latest presence is older than ``stale_after`` (killed, hung
        or cut off) is left out.  Workers publish a presence every 5 s by default, so a
        killed worker drops out within ``stale_after`` seconds.  Presence times are the
        workers' clocks: keep hosts in sync (NTP).

        Parameters:
            stale_after: seconds after which a silent worker counts as gone.
            timeout: seconds to wait for the read to catch up with the stream.

        Returns:
            One presence per live worker, sorted by worker id.

        Raises:
            ValidationError: ``stale_after`` is not > 0.
            TopologyError: ``ojs.stream.events`` exists and is not a stream.
            OjsError: the read did not catch up within ``timeout``.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`enqueue`.
        """
        if isinstance(stale_after, bool) or not isinstance(stale_after, int | float) or not stale_after > 0:
            raise ValidationError(f"stale_after must be > 0 seconds, got {stale_after!r}", field="stale_after")
        horizon = utcnow() - timedelta(seconds=stale_after)
        latest: dict[str, WorkerPresence] = {}

        def keep(record: WorkerPresence | JobEventRecord) -> bool:
            if isinstance(record, WorkerPresence):
                known = latest.get(record.worker_id)
                if known is None or record.sent_at >= known.sent_at:
                    latest[record.worker_id] = record
            return True

        self._read_events(horizon, keep, latest.clear, timeout)
        live = [p for p in latest.values() if p.state == "online" and p.sent_at >= horizon]
        return sorted(live, key=lambda presence: presence.worker_id)

    def events(
        self,
        since: datetime | timedelta,
        *,
        queue: str | None = None,
        limit: int | None = None,
        timeout: float = 10.0,
    ) -> list[JobEventRecord]:
        """Job lifecycle events read back from the events stream, oldest first.

        Workers publish them only when opted in (``Worker(events=True)``); the stream
        keeps them for its retention (default one hour, :class:`~ojs_kombu.wire.events.EventsOptions`).

        Parameters:
            since: an aware datetime, or how long ago (``timedelta(minutes=10)``).
            queue: only the events of this OJS queue.
            limit: at most this many (the oldest ones).
            timeout: seconds to wait for the read to catch up with the stream.

        Returns:
            The events at or after ``since``, in the order the stream holds them.

        Raises:
            ValidationError: a naive datetime, a bad queue name or a ``limit`` below 1.
            TopologyError: ``ojs.stream.events`` exists and is not a stream.
            OjsError: the read did not catch up within ``timeout``.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`enqueue`.
        """
        start = utcnow() - since if isinstance(since, timedelta) else since
        if not isinstance(start, datetime) or start.tzinfo is None or start.utcoffset() is None:
            raise ValidationError(f"since must be an aware datetime or a timedelta, got {since!r}", field="since")
        if queue is not None:
            validate_queue_name(queue)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValidationError(f"limit must be a positive integer, got {limit!r}", field="limit")
        found: list[JobEventRecord] = []

        def keep(record: WorkerPresence | JobEventRecord) -> bool:
            if isinstance(record, JobEventRecord) and record.at >= start and queue in (None, record.queue):
                found.append(record)
            return limit is None or len(found) < limit

        self._read_events(start, keep, found.clear, timeout)
        return found

    def _read_events(
        self,
        since: datetime,
        on_event: Callable[[WorkerPresence | JobEventRecord], bool],
        reset: Callable[[], None],
        timeout: float,
    ) -> None:
        """Read the events stream from ``since`` (see :func:`~ojs_kombu.runtime.presence.read_events`);
        ``reset`` forgets what an attempt that failed had collected before the next one."""

        def read(conn: Connection) -> None:
            reset()
            read_events(
                conn.connection, self.names, self.topology, since - _STREAM_OFFSET_SLACK, on_event, timeout=timeout
            )

        self._run(read)

    # -- dead letters ---------------------------------------------------------------------------

    def dead_letters(
        self, queue: str, limit: int | None = 100, *, select: Callable[[DeadLetterEntry], bool] | None = None
    ) -> list[DeadLetterEntry]:
        """Up to ``limit`` jobs in ``ojs.queue.dlx.{queue}``, oldest first, left in place.

        Messages are read with ``Basic.Get`` on a channel that is then closed
        without acking, so the broker keeps every one of them.  Inspection is
        not FETCH: workers never use ``Basic.Get``.

        Parameters:
            queue: the OJS queue whose dead letters to read.
            limit: at most this many entries (``None``: all of them).
            select: only the entries it picks (e.g. a
                :class:`~ojs_kombu.runtime.deadletter.DeadLetterFilter`); the letters it
                passes over are read too (held unacked until the browse ends), not returned.

        Raises:
            NotFoundError: the dead letter queue does not exist.
        """
        validate_queue_name(queue)

        def browse(conn: Connection) -> list[DeadLetterEntry]:
            channel = conn.connection.channel()
            channel.auto_decode = False
            entries: list[DeadLetterEntry] = []
            join, shown = self._final_failures(conn, queue), SameDeath()
            try:
                while limit is None or len(entries) < limit:
                    message = self._get_dead_letter(channel, self.names.dead_letter_queue(queue))
                    if message is None:
                        break
                    entry = join(DeadLetterEntry.from_message(message))
                    if shown.repeats(entry):
                        continue  # a second letter of one death (a crash before its republish's ack)
                    shown.add(entry)
                    if select is None or select(entry):
                        entries.append(entry)
            finally:
                close_quietly(channel)  # unacked messages go back where they were
            return entries

        return self._run(browse)

    def replay_dead_letters(
        self,
        queue: str,
        *,
        limit: int | None = None,
        ids: Iterable[str] | None = None,
        window: int = DEFAULT_REPLAY_WINDOW,
        progress: Callable[[ReplayProgress], None] | None = None,
        select: Callable[[DeadLetterEntry], bool] | None = None,
    ) -> list[str]:
        """Move dead letters of ``queue`` back to their job queue; returns the replayed job ids.

        Each replayed job starts again at attempt 0 (its error history kept,
        ``meta["ojs.replay_count"]`` incremented), with ``x-death*`` and the
        error headers removed.  Its republish is confirmed before the dead
        letter is acked.

        The scan holds at most ``window`` dead letters unacknowledged.  A dead
        letter it passes over (not among ``ids``, not an OJS job, or past
        ``limit``) is moved to the back of the dead letter queue unchanged
        (republished there, confirmed, then acked), and the scan then goes on
        through every message that was in the queue when it began, so the
        letters left behind keep their order; letters dead-lettered during the
        scan may end up among them.  When nothing has been passed over, the scan
        stops as soon as ``limit`` jobs are replayed.  A crash mid-scan may
        leave a passed-over letter twice in the queue, never none.

        Parameters:
            queue: the OJS queue whose ``ojs.queue.dlx.{queue}`` is read.
            limit: replay at most this many jobs.
            ids: replay only these job ids.
            window: dead letters held unacknowledged at most (>= 1).
            progress: called with a :class:`ReplayProgress` once per window, when its
                letters are fetched and their republishes confirmed, right before they are acked.
            select: replay only the letters it also picks (e.g. a
                :class:`~ojs_kombu.runtime.deadletter.DeadLetterFilter`).

        Raises:
            NotFoundError: the dead letter queue does not exist.
            PublishError: a republish was refused (the scan stops; letters not
                yet acked return to the queue).
        """
        wanted = {i.lower() for i in ids} if ids is not None else None

        def republish(conn: Connection, session: _Session, job: Job, message: Message) -> PublishTicket:
            return self._republish(conn, session, replayable(job), message)

        return self._scan_dead_letters(
            queue,
            select=lambda entry: (
                entry.job is not None
                and (wanted is None or entry.job.id in wanted)
                and (select is None or select(entry))
            ),
            take=republish,
            limit=limit,
            window=window,
            progress=progress,
        )

    def _scan_dead_letters(
        self,
        queue: str,
        *,
        select: Callable[[DeadLetterEntry], bool],
        take: Callable[[Connection, _Session, Job, Message], PublishTicket] | None,
        limit: int | None = None,
        window: int = DEFAULT_REPLAY_WINDOW,
        progress: Callable[[ReplayProgress], None] | None = None,
    ) -> list[str]:
        """Walk ``ojs.queue.dlx.{queue}`` holding at most ``window`` letters unacked; returns the ids taken.

        A letter that ``select`` picks (while fewer than ``limit`` are taken) is taken:
        republished by ``take`` and acked once that is confirmed, or, when ``take`` is
        None, acked at once (removed).  Every other letter is moved to the back of the
        queue unchanged (confirmed, then acked), and the walk then covers every message
        that was in the queue when it began, so the letters left keep their order.
        The id of a taken letter is its job's id, else its ``message_id``.
        """
        validate_queue_name(queue)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValidationError(f"window must be an integer >= 1, got {window!r}", field="window")
        dead_letter_queue = self.names.dead_letter_queue(queue)
        taken_ids: list[str] = []

        def scan(conn: Connection) -> None:
            session = self._session(conn)
            channel = conn.connection.channel()
            channel.auto_decode = False
            to_scan: int | None = None  # messages in the queue when the scan began
            scanned = passed_over = 0
            batch: list[tuple[Message, PublishTicket | None, str | None]] = []
            join, taken_deaths = self._final_failures(conn, queue), SameDeath()

            def taken() -> int:  # letters taken, or taken and awaiting their republish's confirm
                return len(taken_ids) + sum(letter_id is not None for _, _, letter_id in batch)

            def done() -> bool:
                if to_scan is not None and scanned >= to_scan:
                    return True
                # Stop at the limit, unless letters were moved to the back: then they must come round.
                return limit is not None and taken() >= limit and not passed_over

            try:
                while not done():
                    batch = []
                    while len(batch) < window and not done():
                        message = self._get_dead_letter(channel, dead_letter_queue)
                        if message is None:
                            to_scan = scanned
                            break
                        if to_scan is None:
                            to_scan = int(message.delivery_info.get("message_count") or 0) + 1
                        scanned += 1
                        entry = join(DeadLetterEntry.from_message(message))
                        if taken_deaths.repeats(entry):
                            batch.append((message, None, None))  # a second letter of a death taken: removed
                        elif select(entry) and (limit is None or taken() < limit):
                            taken_deaths.add(entry)
                            chosen = entry.job.id if entry.job is not None else str(entry.message_id)
                            ticket = take(conn, session, entry.job, message) if take and entry.job else None
                            batch.append((message, ticket, chosen))
                        else:
                            passed_over += 1
                            batch.append((message, self._requeue_at_back(session, message, dead_letter_queue), None))
                    session.publisher.wait(
                        [ticket for _, ticket, _ in batch if ticket is not None], self.confirm_timeout
                    )
                    if progress is not None and batch:
                        progress(ReplayProgress(to_scan, scanned, len(taken_ids), passed_over, held=len(batch)))
                    failure: PublishError | None = None
                    for message, ticket, letter_id in batch:
                        if ticket is not None and ticket.error is not None:
                            failure = failure or ticket.error
                            continue  # unacked: back in the queue when the channel closes
                        channel.basic_ack(message.delivery_info["delivery_tag"])
                        if letter_id is not None:
                            taken_ids.append(letter_id)
                    batch = []
                    if failure is not None:
                        raise failure
            finally:
                close_quietly(channel)

        self._run(scan)
        return taken_ids

    def _final_failures(self, conn: Connection, queue: str) -> FinalFailureJoin:
        """What joins the nacked letters of ``queue`` to their final failures (read at the first need)."""
        return FinalFailureJoin(lambda: read_final_failures(conn.connection, self.names, self.topology, queue))

    def _get_dead_letter(self, channel: Channel, dead_letter_queue: str) -> Message | None:
        """``Basic.Get`` one message of ``dead_letter_queue``, unacked; None when it is empty.

        Raises:
            NotFoundError: the dead letter queue does not exist (it must: a 404 is final here).
        """
        with map_exceptions(url=self.url, must_exist=True):
            message: Message | None = channel.basic_get(dead_letter_queue, no_ack=False)
        return message

    def _republish(self, conn: Connection, session: _Session, job: Job, message: Message) -> PublishTicket:
        """Publish a replayed ``job`` to its queue (not waiting for the confirm)."""
        if self.declare:
            self.topology.ensure_queue(conn.connection, job.queue)
        return session.publisher.publish(
            encode(job, app_id=message.properties.get("app_id")),
            exchange=self.names.direct_exchange,
            routing_key=job.queue,
            queue=job.queue,
            job_id=job.id,
            confirm_timeout=self.confirm_timeout,
        )

    def _requeue_at_back(self, session: _Session, message: Message, dead_letter_queue: str) -> PublishTicket:
        """Publish ``message`` unchanged to the back of ``dead_letter_queue`` (default exchange)."""
        properties = dict(message.properties)
        headers = properties.pop("application_headers", None) or {}
        return session.publisher.publish(
            OutgoingMessage(message.body, properties, headers),
            exchange="",
            routing_key=dead_letter_queue,
            queue=dead_letter_queue,
            job_id=properties.get("message_id"),
            confirm_timeout=self.confirm_timeout,
        )

    def purge_dead_letters(
        self,
        queue: str,
        *,
        ids: Iterable[str] | None = None,
        window: int = DEFAULT_REPLAY_WINDOW,
        select: Callable[[DeadLetterEntry], bool] | None = None,
        limit: int | None = None,
        progress: Callable[[ReplayProgress], None] | None = None,
    ) -> int:
        """Delete dead letters of ``queue``: all of them, or exactly those whose id is in ``ids``.

        Without ``ids``, ``select`` and ``limit`` the queue is purged.  Otherwise
        (``ids``: job ids, or the ``message_id`` of a letter that is not an OJS job;
        any case) the queue is walked as :meth:`replay_dead_letters` walks it: at
        most ``window`` letters held unacknowledged, each chosen one acked
        (removed), every other one moved to the back unchanged (confirmed before it
        is acked), so the letters left keep their order.  Meant for a pipeline that
        archived some dead letters (e.g. to Parquet) and must remove exactly those.

        Parameters:
            queue: the OJS queue whose ``ojs.queue.dlx.{queue}`` is purged.
            ids: delete only these letters.
            window: letters held unacknowledged at most during a walk (>= 1).
            select: delete only the letters it also picks (e.g. a
                :class:`~ojs_kombu.runtime.deadletter.DeadLetterFilter`).
            limit: delete at most this many letters.
            progress: called once per window of a walk, as for :meth:`replay_dead_letters`.

        Returns:
            How many letters were deleted.

        Raises:
            NotFoundError: the dead letter queue does not exist.
            PublishError: moving a letter to the back was refused (the walk stops; nothing is lost).
        """
        validate_queue_name(queue)
        if ids is not None or select is not None or limit is not None:
            wanted = {i.lower() for i in ids} if ids is not None else None
            if wanted is not None and not wanted:
                return 0
            return len(
                self._scan_dead_letters(
                    queue,
                    select=lambda entry: (
                        (wanted is None or entry.letter_id in wanted) and (select is None or select(entry))
                    ),
                    take=None,
                    limit=limit,
                    window=window,
                    progress=progress,
                )
            )

        def purge(conn: Connection) -> int:
            channel = conn.connection.channel()
            try:
                with map_exceptions(url=self.url, must_exist=True):
                    return int(channel.queue_purge(self.names.dead_letter_queue(queue)) or 0)
            finally:
                close_quietly(channel)

        return self._run(purge)

    # -- inspection ------------------------------------------------------------------------------

    def queue_counts(self, amqp_queues: Iterable[str]) -> dict[str, QueueCounts | None]:
        """Ready messages and consumers of AMQP queues, exact and current (passive ``Queue.Declare``).

        Parameters:
            amqp_queues: full AMQP queue names (``ojs.queue.email``, ``ojs.schedule.03`` …).

        Returns:
            Each name with its :class:`QueueCounts`, or None when the queue does not exist.

        Raises:
            BrokerConnectionError, BrokerRefusedError: as for :meth:`enqueue`.
        """
        wanted = list(dict.fromkeys(amqp_queues))

        def inspect(conn: Connection) -> dict[str, QueueCounts | None]:
            counts: dict[str, QueueCounts | None] = {}
            channel: Channel | None = None
            try:
                for name in wanted:
                    channel = channel or conn.connection.channel()
                    try:
                        _, ready, consumers = channel.queue_declare(name, passive=True)
                    except NotFound:
                        counts[name], channel = None, None  # the broker closed the channel
                        continue
                    counts[name] = QueueCounts(int(ready), int(consumers))
            finally:
                if channel is not None:
                    close_quietly(channel)
            return counts

        return self._run(inspect)

    def paused_queues(self, queues: Iterable[str], *, timeout: float = 10.0) -> dict[str, bool | None]:
        """Whether each OJS queue is paused, as its workers see it: its control stream read from the start.

        The control stream of each queue is declared if missing, then replayed with
        the workers' own :class:`~ojs_kombu.runtime.control.ControlReader` (which
        publishes one small marker record to each stream to know it caught up).
        The cost grows with the streams' retention: every retained cancel is read
        (measured: 1 s for 10,000 cancels, 5.5 s for 50,000, on a loaded 2-core machine).

        Parameters:
            queues: OJS queue names.
            timeout: seconds to wait for the replay.

        Returns:
            Each queue: True (paused), False, or None when its control queue is a classic
            queue (degraded mode: no history to read).

        Raises:
            ValidationError: a bad queue name.
            OjsError: the streams were not replayed within ``timeout``.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`enqueue`.
        """
        wanted = [validate_queue_name(q) for q in dict.fromkeys(queues)]

        def read(conn: Connection) -> dict[str, bool | None]:
            for queue in wanted:
                self.topology.declare(conn.connection, self.topology.control_specs(queue))
            streams = [q for q in wanted if self.topology.control_is_stream(q)]
            reader = ControlReader(self.names, self.topology, streams, Cancellations(), replay_timeout=timeout)
            if streams:
                try:
                    close_quietly(reader.attach(conn.connection))
                except RecoverableConnectionError as exc:  # the replay was too slow: not worth a reconnect
                    self._drop(conn)  # its channel still consumes the streams
                    raise OjsError(f"reading the control streams: {exc}") from None
            return {q: (q in reader.paused) if q in streams else None for q in wanted}

        return self._run(read)

    # -- topology --------------------------------------------------------------------------------

    def declare_queue(self, name: str, *, scheduling: bool = False, **queue_options: Any) -> str:
        """Eagerly declare job queue ``name`` with its DLQ; returns the AMQP queue name.

        ``queue_options`` are :class:`QueueOptions` fields (``max_priority=10``,
        ``max_length=…``, ``overflow="reject-publish"``, ``queue_type="quorum"``, …)
        and replace the client-wide options for this queue.  ``scheduling=True``
        also declares the scheduling cascade and its binding to the queue (else
        declared by the first scheduled enqueue).

        Raises:
            TopologyConflictError: the queue exists with other arguments (see ``on_conflict``).
        """
        validate_queue_name(name)
        if queue_options:
            self.topology.per_queue[name] = QueueOptions(**queue_options)

        def declare(conn: Connection) -> None:
            self.topology.declare_queue(conn.connection, name)
            if scheduling:
                self.topology.ensure_scheduling(conn.connection, name, self.cascade)

        self._run(declare)
        return self.names.job_queue(name)

    def teardown(self) -> int:
        """Delete every queue and exchange this client declared, messages included.

        Meant for tests, demos and removing a tenant; returns the number deleted.
        """
        return self._run(lambda conn: self.topology.delete_declared(conn.connection))

    def close(self) -> None:
        """Close every pooled connection.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pool.force_close_all()
        self._connection.release()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {safe_url(self.url)} prefix={self.names.prefix!r}>"

    # -- publishing ----------------------------------------------------------------------------

    @staticmethod
    def _check(job: Job) -> datetime | None:
        """Check ``job`` before it is encoded: a Job, its queue's name, its ``scheduled_at`` range.

        Returns:
            Its ``scheduled_at`` when that lies ahead, else None.

        Raises:
            ValidationError: not a Job, a bad queue name, or a ``scheduled_at`` out of range.
        """
        if not isinstance(job, Job):
            raise ValidationError(f"expected an ojs_kombu.Job, got {type(job).__name__}", field="job")
        if type(job.queue) is str:
            _validated_queue_name(job.queue)
        else:  # a job built without validation: not hashable, maybe
            validate_queue_name(job.queue)
        if job.scheduled_at is None:  # most jobs: no datetime to make
            return None
        scheduled = job.scheduled_datetime
        if scheduled is None or check_delay(delay_ms_until(scheduled)) == 0:
            return None
        return scheduled

    def _encoded(self, job: Job) -> OutgoingMessage:
        """``job`` as its AMQP message.

        Raises:
            ValidationError: the envelope is too large, or a job built without validation
                holds a value JSON cannot carry.
        """
        try:
            return encode(job, app_id=self.app_id)
        except ValidationError:
            raise
        except (TypeError, ValueError) as exc:  # what the JSON encoder raises
            raise ValidationError(f"job {job.id} cannot be encoded as JSON: {exc}", field="args") from exc

    @staticmethod
    def _body(job: Job) -> bytes:
        """``job``'s message body.

        Raises:
            ValidationError: as :meth:`_encoded`.
        """
        try:
            return encode_body(job)
        except ValidationError:
            raise
        except (TypeError, ValueError) as exc:  # what the JSON encoder raises
            raise ValidationError(f"job {job.id} cannot be encoded as JSON: {exc}", field="args") from exc

    def _publish_jobs(self, jobs: list[Job]) -> list[EnqueueResult]:
        if len(jobs) < GC_PAUSE_MIN_JOBS:
            return self._publish_batch(jobs)
        # All of a large batch's objects live until its confirms: collections meanwhile would
        # only scan them (see ojs_kombu.gc_pause).  The pause lasts the batch, retries included.
        with GcPause():
            return self._publish_batch(jobs)

    def _publish_batch(self, jobs: list[Job]) -> list[EnqueueResult]:
        # Per job, only what must live until its confirm: a batch's objects outlive the young
        # generations, and every one of them is scanned again by each full garbage collection.
        if current_trace_meta():  # the caller's trace context, the same for every job of the batch
            jobs = [with_trace_context(job) if isinstance(job, Job) else job for job in jobs]
        results: list[EnqueueResult | None] = [None] * len(jobs)
        # Jobs are checked now and encoded as they are published, so the broker works on the
        # first ones while the rest are encoded; an encoded message is kept for a resend.
        messages: dict[int, OutgoingMessage] = {}
        delayed: dict[int, datetime] = {}  # the jobs whose scheduled_at lies ahead
        pending: list[int] = []  # the valid jobs, not yet settled
        due_queues: set[str] = set()  # their queues, declared before the first publish
        delayed_queues: set[str] = set()
        single = len(jobs) == 1
        for index, job in enumerate(jobs):  # one pass: it runs before the broker gets anything
            try:
                scheduled = self._check(job)
                if single:
                    messages[index] = self._encoded(job)
            except ValidationError as exc:
                results[index] = EnqueueResult(job, exc)
                continue
            pending.append(index)
            if scheduled is None:
                due_queues.add(job.queue)
            else:
                delayed[index] = scheduled
                delayed_queues.add(job.queue)
        if single and results[0] is not None:
            results[0].unwrap()  # a single bad job: plain ValidationError

        def publish_pending(conn: Connection) -> None:
            nonlocal pending
            session = self._session(conn)
            if self.declare:
                for queue in due_queues:
                    self.topology.ensure_queue(conn.connection, queue)
                for queue in delayed_queues:
                    self.topology.ensure_scheduling(conn.connection, queue, self.cascade)
            publish, publish_job = session.publisher.publish, session.publisher.publish_job
            direct, app_id, confirm_timeout = self.names.direct_exchange, self.app_id, self.confirm_timeout
            sent: list[int] = []
            tickets: list[PublishTicket] = []
            try:
                for index in pending:
                    job = jobs[index]
                    message = messages.get(index)
                    key = properties_key(job, app_id) if message is None and index not in delayed else None
                    # A job whose properties an earlier job of the same key had encoded: only its
                    # body is encoded, and its frames are built around its id.
                    template = _TEMPLATES.get(key) if key is not None else None
                    try:
                        if template is not None:
                            body = self._body(job)
                        elif message is None:
                            message = messages[index] = self._encoded(job)
                            if key is not None:  # the first of its key: its properties serve the next ones
                                template, body = _remember_template(key, message), message.body
                    except ValidationError as exc:
                        results[index] = EnqueueResult(job, exc)
                        continue
                    if template is not None:
                        ticket = publish_job(
                            body,
                            job.id,
                            template,
                            exchange=direct,
                            routing_key=job.queue,
                            queue=job.queue,
                            confirm_timeout=confirm_timeout,
                        )
                    elif index in delayed:
                        assert message is not None
                        # The delay is measured after the publisher's channel set-up (publish_when_ready).
                        ticket = session.publisher.publish_when_ready(
                            partial(self.cascade.destination, message, delayed[index], job.queue),
                            queue=job.queue,
                            job_id=job.id,
                            confirm_timeout=confirm_timeout,
                            flush=False,
                        )
                    else:
                        assert message is not None
                        ticket = publish(
                            message,
                            exchange=direct,
                            routing_key=job.queue,
                            queue=job.queue,
                            job_id=job.id,
                            confirm_timeout=confirm_timeout,
                            flush=False,  # pipelined: written in batches, at the latest by wait()
                        )
                    tickets.append(ticket)
                    sent.append(index)
                # After a nack the publisher moves to a fresh channel (RabbitMQ 3.10's stale quorum leader).
                session.publisher.wait(tickets, self.confirm_timeout)
            finally:
                # Whatever was confirmed stays done, even if the connection dies now.
                for index, ticket in zip(sent, tickets, strict=True):
                    if ticket.done:
                        results[index] = EnqueueResult(jobs[index], ticket.error)
                pending = [i for i in pending if results[i] is None]
            session.last_used = time.monotonic()

        def publish(conn: Connection) -> None:
            if not pending:
                return
            try:
                publish_pending(conn)
            except conn.connection_errors + conn.channel_errors:
                if pending:
                    raise
                self._drop(conn)  # every job was confirmed before the connection broke

        try:
            self._run(publish)
        except (BrokerConnectionError, BrokerRefusedError) as exc:
            for index in pending:
                results[index] = EnqueueResult(jobs[index], exc)
        return [r for r in results if r is not None]

    # -- connections ---------------------------------------------------------------------------

    def _session(self, conn: Connection) -> _Session:
        """The publisher of ``conn`` (connected by :meth:`_run`), created on first use."""
        session: _Session | None = getattr(conn, "_ojs_session", None)
        if session is None or not session.publisher.is_open:
            session = _Session(conn, self.window)
            conn._ojs_session = session  # type: ignore[attr-defined]
        return session

    def _drop_if_idle(self, conn: Connection) -> None:
        session: _Session | None = getattr(conn, "_ojs_session", None)
        if session is not None and time.monotonic() - session.last_used > self.heartbeat:
            # An idle pooled connection has sent no heartbeats; the broker may have
            # closed it.  Start afresh rather than find out on the next publish.
            self._drop(conn)

    @staticmethod
    def _drop(conn: Connection) -> None:
        session: _Session | None = getattr(conn, "_ojs_session", None)
        conn._ojs_session = None  # type: ignore[attr-defined]
        if session is not None:
            session.publisher.close()
        try:
            conn.collect()
        except Exception:  # noqa: BLE001
            pass

    def _backoff(self, conn: Connection, failures: int, elapsed: float) -> float | None:
        """Seconds to wait before the next connection attempt (on the next node), or None to give up."""
        delay = self._failover.failed(conn)  # moves to the next node; back-off once per full rotation
        if self.connect_retries is not None and failures > self.connect_retries:
            return None
        if self.publish_timeout is None:
            return delay
        remaining = self.publish_timeout - elapsed
        return min(delay, remaining) if remaining > 0 else None

    def _run(self, operation: Callable[[Connection], T]) -> T:
        """Run ``operation(conn)`` on a pooled, connected connection, reconnecting with back-off.

        Connection errors are retried with the back-off of DESIGN §9 for at most
        ``publish_timeout`` seconds (and ``connect_retries`` times), counted from the
        start of the first attempt that failed; then :class:`BrokerConnectionError`.
        A permanent refusal (:mod:`ojs_kombu.amqp.errors`) is raised at once.  A
        channel error (e.g. a deleted exchange: 404) drops the channel, forgets the
        declared topology and is retried once at once.
        """
        if self._closed:
            raise OjsError("the client is closed")
        failures = 0
        failing_since: float | None = None
        channel_retry = False
        while True:
            conn = self._pool.acquire(block=True)
            connecting_since: float | None = None  # set while a connection attempt runs
            try:
                with map_exceptions(url=self.url):
                    self._drop_if_idle(conn)
                    if not conn.connected:
                        connecting_since = time.monotonic()
                        self._failover.connect(conn, timeout=self._attempt_timeout(failing_since))
                        connecting_since = None
                        self._failover.succeeded()
                    return operation(conn)
            except BrokerRefusedError:
                self._drop(conn)
                raise
            except conn.connection_errors as exc:
                self._drop(conn)
                if failing_since is None:  # the budget starts with the attempt that failed
                    failing_since = connecting_since if connecting_since is not None else time.monotonic()
                failures += 1
                elapsed = time.monotonic() - failing_since
                failed_url = safe_url(conn.as_uri())  # kombu leaves the password out, as user:**@
                delay = self._backoff(conn, failures, elapsed)
                if delay is None:
                    raise connection_error(self.url, exc, failures, elapsed) from exc
                logger.warning(
                    "connection to %s failed (%s); retrying on %s in %.1fs",
                    failed_url,
                    exc,
                    safe_url(self._failover.current),
                    delay,
                )
                METRICS.reconnected()
                time.sleep(delay)
            except conn.channel_errors as exc:
                self._drop(conn)
                if channel_retry:
                    raise PublishError(f"the broker closed the channel: {exc}") from exc
                channel_retry = True
                self.topology.forget()
                logger.warning("channel error (%s); re-declaring topology and retrying", exc)
            finally:
                conn.release()

    def _attempt_timeout(self, failing_since: float | None) -> float | None:
        """How long the next connection attempt may take: what is left of the budget."""
        if self.publish_timeout is None:
            return None
        spent = 0.0 if failing_since is None else time.monotonic() - failing_since
        return max(0.05, min(self.publish_timeout - spent, float(self._connection.connect_timeout)))


@lru_cache(maxsize=1024)  # per job of a batch, mostly the same few names; only valid ones are kept
def _validated_queue_name(queue: str) -> str:
    return validate_queue_name(queue)


def best_answer(answers: Iterable[JobInfo]) -> JobInfo | None:
    """The answer :meth:`Client.info` returns among several workers': an ``active`` one, else the
    latest outcome (by ``finished_at``), else None."""
    ranked = sorted(
        answers,
        key=lambda a: (a.state == "active", (a.finished_at or a.started_at or _EPOCH).timestamp()),
    )
    return ranked[-1] if ranked else None


_EPOCH = datetime.fromtimestamp(0, UTC)


__all__ = [
    "DEFAULT_PUBLISH_TIMEOUT",
    "DEFAULT_REPLAY_WINDOW",
    "DEFAULT_STALE_AFTER",
    "INFO_SETTLE_WINDOW",
    "Client",
    "EnqueueResult",
    "JobOptions",
    "QueueCounts",
    "best_answer",
]
