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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import kombu

from ojs_kombu.amqp.connection import DEFAULT_HEARTBEAT, connect_once, make_connection, resolve_url, safe_url
from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.amqp.topology import Topology, _close_quietly
from ojs_kombu.errors import BrokerConnectionError, OjsError, PublishError, ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import Names, validate_queue_name
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.observability.tracing import with_trace_context
from ojs_kombu.policy.backoff import reconnect_delay
from ojs_kombu.policy.schedule import Cascade, check_delay, delay_ms_until
from ojs_kombu.runtime.deadletter import DeadLetterEntry, replayable
from ojs_kombu.wire.codec import OutgoingMessage, encode
from ojs_kombu.wire.entities import QueueOptions

logger = logging.getLogger(__name__)


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


class _Session:
    """The publisher living on one pooled connection."""

    def __init__(self, connection: kombu.Connection, window: int):
        self.publisher = ConfirmedPublisher(connection.connection, window=window)
        self.last_used = time.monotonic()


class Client:
    """Enqueues OJS jobs on RabbitMQ; thread-safe, a context manager.

    Arguments:
        url: broker URL (``amqp://``, ``amqps://``, ``ojs://``, ``ojss://``; a list
            or ``;``-separated URLs give kombu failover).  Default ``$OJS_AMQP_URL``.
        prefix: multi-tenant prefix of every entity name (``tenant1.ojs.queue.email``).
        queue_options: optional arguments of every job queue this client declares.
        queues: job queues declared eagerly when the client starts.
        declare: declare a job queue lazily before the first publish to it.
        pool_size: at most this many connections (one per concurrently publishing thread).
        confirm_timeout: seconds to wait for publisher confirms.
        connect_retries: connection attempts after a connection error, with the back-off
            ``min(2^(n-1), 60)`` s ±25 % (DESIGN §9), before BrokerConnectionError.
        heartbeat: AMQP heartbeat in seconds.
        app_id: ``app_id`` property of published jobs (default ``"ojs"``).
        on_conflict: what to do when a queue exists with other arguments
            (``"use-existing"``: warn and use it; ``"raise"``).
        connection_name: shown by the broker (management UI) for this client's connections.
        ssl, transport_options: passed to :class:`kombu.Connection`.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str = "",
        queue_options: QueueOptions | None = None,
        queues: Iterable[str] = (),
        declare: bool = True,
        pool_size: int = 10,
        confirm_timeout: float = 30.0,
        connect_retries: int = 5,
        heartbeat: float = DEFAULT_HEARTBEAT,
        app_id: str | None = None,
        on_conflict: str = "use-existing",
        ssl: Any = None,
        transport_options: dict[str, Any] | None = None,
        window: int = 1000,
        connection_name: str | None = None,
    ):
        self.url = resolve_url(url)
        self.names = Names(prefix)
        self.topology = Topology(self.names, queue_options=queue_options, on_conflict=on_conflict)  # type: ignore[arg-type]
        self.cascade = Cascade(self.names)
        self.declare = declare
        self.confirm_timeout = confirm_timeout
        self.connect_retries = connect_retries
        self.heartbeat = heartbeat
        self.app_id = app_id
        self.window = window
        self.connection_name = connection_name or f"ojs_kombu client {socket.gethostname()} pid {os.getpid()}"
        self._connection = make_connection(
            self.url,
            heartbeat=heartbeat,
            ssl=ssl,
            transport_options=transport_options,
            connection_name=self.connection_name,
        )
        self._pool = self._connection.Pool(limit=pool_size)
        self._closed = False
        for queue in queues:
            self.declare_queue(queue)

    # -- public API ----------------------------------------------------------------------------

    def enqueue(self, type: str, args: Sequence[Any] | None = None, **job_options: Any) -> Job:
        """Create a job (see :meth:`Job.create` for ``job_options``) and enqueue it.

        Returns the confirmed job.  Raises ValidationError for a bad argument
        (nothing is published), UnroutableError / PublishNackedError /
        PublishTimeoutError when the broker did not take it, BrokerConnectionError
        when the broker could not be reached.
        """
        return self.enqueue_job(Job.create(type, args, **job_options))

    def enqueue_job(self, job: Job) -> Job:
        """Enqueue an existing :class:`Job`; same outcomes as :meth:`enqueue`.

        A job whose ``scheduled_at`` lies ahead goes through the scheduling
        cascade and reaches its queue at that time, never earlier.
        """
        return self._publish_jobs([job])[0].unwrap()

    def enqueue_many(self, jobs: Iterable[Job]) -> list[EnqueueResult]:
        """Enqueue many jobs: pipelined publishes on one channel, then all confirms.

        Returns one :class:`EnqueueResult` per job, in order; a job that failed
        carries its error and does not affect the others.
        """
        return self._publish_jobs(list(jobs))

    # -- dead letters ---------------------------------------------------------------------------

    def dead_letters(self, queue: str, limit: int = 100) -> list[DeadLetterEntry]:
        """Up to ``limit`` jobs in ``ojs.queue.dlx.{queue}``, oldest first, left in place.

        Messages are read with ``Basic.Get`` on a channel that is then closed
        without acking, so the broker keeps every one of them.  Inspection is
        not FETCH: workers never use ``Basic.Get``.
        """
        validate_queue_name(queue)

        def browse(conn: kombu.Connection) -> list[DeadLetterEntry]:
            channel = conn.connection.channel()
            channel.auto_decode = False
            entries = []
            try:
                while len(entries) < limit:
                    message = channel.basic_get(self.names.dead_letter_queue(queue), no_ack=False)
                    if message is None:
                        break
                    entries.append(DeadLetterEntry.from_message(message))
            finally:
                _close_quietly(channel)  # unacked messages go back where they were
            return entries

        return self._run(browse)

    def replay_dead_letters(
        self, queue: str, *, limit: int | None = None, ids: Iterable[str] | None = None
    ) -> list[str]:
        """Move dead letters of ``queue`` back to their job queue; returns the replayed job ids.

        Each replayed job starts again at attempt 0 (its error history kept,
        ``meta["ojs.replay_count"]`` incremented), with ``x-death*`` and the
        error headers removed.  The republish is confirmed before the dead
        letter is acked.  ``ids`` restricts the replay to those jobs; messages
        that are not OJS jobs stay in the dead letter queue.
        """
        validate_queue_name(queue)
        wanted = {i.lower() for i in ids} if ids is not None else None

        def replay(conn: kombu.Connection) -> list[str]:
            session = self._session(conn)
            channel = conn.connection.channel()
            channel.auto_decode = False
            replayed: list[str] = []
            try:
                while limit is None or len(replayed) < limit:
                    message = channel.basic_get(self.names.dead_letter_queue(queue), no_ack=False)
                    if message is None:
                        break
                    entry = DeadLetterEntry.from_message(message)
                    if entry.job is None or (wanted is not None and entry.job.id not in wanted):
                        continue  # left unacked: back in the DLQ when the channel closes
                    job = replayable(entry.job)
                    if self.declare:
                        self.topology.ensure_queue(conn.connection, job.queue)
                    ticket = session.publisher.publish(
                        encode(job, app_id=message.properties.get("app_id")),
                        exchange=self.names.direct_exchange,
                        routing_key=job.queue,
                        queue=job.queue,
                        job_id=job.id,
                        confirm_timeout=self.confirm_timeout,
                    )
                    session.publisher.wait([ticket], self.confirm_timeout)
                    ticket.raise_for_error()
                    channel.basic_ack(message.delivery_info["delivery_tag"])
                    replayed.append(job.id)
            finally:
                _close_quietly(channel)
            return replayed

        return self._run(replay)

    def purge_dead_letters(self, queue: str) -> int:
        """Delete every message in ``ojs.queue.dlx.{queue}``; returns how many there were."""
        validate_queue_name(queue)

        def purge(conn: kombu.Connection) -> int:
            channel = conn.connection.channel()
            try:
                return channel.queue_purge(self.names.dead_letter_queue(queue)) or 0
            finally:
                _close_quietly(channel)

        return self._run(purge)

    # -- topology --------------------------------------------------------------------------------

    def declare_queue(self, name: str, *, scheduling: bool = False, **queue_options: Any) -> str:
        """Eagerly declare job queue ``name`` with its DLQ; returns the AMQP queue name.

        ``queue_options`` are :class:`QueueOptions` fields (``max_priority=10``,
        ``max_length=…``, ``overflow="reject-publish"``, ``queue_type="quorum"``, …)
        and replace the client-wide options for this queue.  ``scheduling=True``
        also declares the scheduling cascade and its binding to the queue (else
        declared by the first scheduled enqueue).
        """
        validate_queue_name(name)
        if queue_options:
            self.topology.per_queue[name] = QueueOptions(**queue_options)

        def declare(conn: kombu.Connection) -> None:
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

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {safe_url(self.url)} prefix={self.names.prefix!r}>"

    # -- publishing ----------------------------------------------------------------------------

    def _encode(self, job: Job) -> tuple[OutgoingMessage, datetime | None]:
        """Encode ``job``; also return its ``scheduled_at`` when that lies ahead (checked against the range)."""
        if not isinstance(job, Job):
            raise ValidationError(f"expected an ojs_kombu.Job, got {type(job).__name__}", field="job")
        validate_queue_name(job.queue)
        message = encode(job, app_id=self.app_id)
        scheduled = job.scheduled_datetime
        if scheduled is None or check_delay(delay_ms_until(scheduled)) == 0:
            return message, None
        return message, scheduled

    def _destination(
        self, message: OutgoingMessage, job: Job, scheduled: datetime | None
    ) -> tuple[OutgoingMessage, str, str]:
        """Message, exchange and routing key for ``job``, computed right before its publish:
        the cascade's delay must be measured from the moment the job enters it, or the job is
        late by however long the batch took to reach it."""
        delay_ms = delay_ms_until(scheduled) if scheduled is not None else 0
        if delay_ms > 0:
            return self.cascade.route(message, delay_ms, job.queue)
        return message, self.names.direct_exchange, job.queue

    def _publish_jobs(self, jobs: list[Job]) -> list[EnqueueResult]:
        jobs = [with_trace_context(job) if isinstance(job, Job) else job for job in jobs]
        results: list[EnqueueResult | None] = [None] * len(jobs)
        routes: dict[int, tuple[OutgoingMessage, datetime | None]] = {}
        for index, job in enumerate(jobs):
            try:
                routes[index] = self._encode(job)
            except ValidationError as exc:
                results[index] = EnqueueResult(job, exc)
        if len(jobs) == 1 and results[0] is not None:
            raise results[0].error  # type: ignore[misc]  # a single bad job: plain ValidationError

        pending = list(routes)

        def publish(conn: kombu.Connection) -> None:
            nonlocal pending
            session = self._session(conn)
            if self.declare:
                for queue in {jobs[i].queue for i in pending if routes[i][1] is None}:
                    self.topology.ensure_queue(conn.connection, queue)
                for queue in {jobs[i].queue for i in pending if routes[i][1] is not None}:
                    self.topology.ensure_scheduling(conn.connection, queue, self.cascade)
            tickets = []
            try:
                for index in pending:
                    job = jobs[index]
                    message, scheduled = routes[index]
                    message, exchange, key = self._destination(message, job, scheduled)
                    tickets.append(
                        (
                            index,
                            session.publisher.publish(
                                message,
                                exchange=exchange,
                                routing_key=key,
                                queue=job.queue,
                                job_id=job.id,
                                confirm_timeout=self.confirm_timeout,
                            ),
                        )
                    )
                session.publisher.wait([t for _, t in tickets], self.confirm_timeout)
            finally:
                # Whatever was confirmed stays done, even if the connection dies now.
                for index, ticket in tickets:
                    if ticket.done:
                        results[index] = EnqueueResult(jobs[index], ticket.error)
                pending = [i for i in pending if results[i] is None]
            session.last_used = time.monotonic()

        try:
            self._run(publish, retry_while=lambda: bool(pending))
        except BrokerConnectionError as exc:
            for index in pending:
                results[index] = EnqueueResult(jobs[index], exc)
        return [r for r in results if r is not None]

    # -- connections ---------------------------------------------------------------------------

    def _session(self, conn: kombu.Connection) -> _Session:
        session: _Session | None = getattr(conn, "_ojs_session", None)
        if session is not None and time.monotonic() - session.last_used > self.heartbeat:
            # An idle pooled connection has sent no heartbeats; the broker may have
            # closed it.  Start afresh rather than find out on the next publish.
            self._drop(conn)
            session = None
        if session is None or not session.publisher.is_open:
            if not conn.connected:
                connect_once(conn)
            session = _Session(conn, self.window)
            conn._ojs_session = session  # type: ignore[attr-defined]
        return session

    @staticmethod
    def _drop(conn: kombu.Connection) -> None:
        session: _Session | None = getattr(conn, "_ojs_session", None)
        conn._ojs_session = None  # type: ignore[attr-defined]
        if session is not None:
            session.publisher.close()
        try:
            conn.collect()
        except Exception:  # noqa: BLE001
            pass

    def _run(self, operation, *, retry_while=lambda: True):
        """Run ``operation(conn)`` on a pooled connection, reconnecting with back-off.

        Connection errors are retried ``connect_retries`` times; a channel error
        (e.g. a deleted exchange: 404) drops the channel, forgets the declared
        topology and is retried once at once.
        """
        if self._closed:
            raise OjsError("the client is closed")
        attempt = 0
        channel_retry = False
        while True:
            conn = self._pool.acquire(block=True)
            try:
                return operation(conn)
            except conn.connection_errors as exc:
                self._drop(conn)
                if not retry_while():
                    return None
                attempt += 1
                if attempt > self.connect_retries:
                    raise BrokerConnectionError(
                        f"cannot reach the broker at {safe_url(self.url)} after {attempt} attempts: {exc}"
                    ) from exc
                delay = reconnect_delay(attempt)
                logger.warning("connection to %s failed (%s); retrying in %.1fs", safe_url(self.url), exc, delay)
                METRICS.reconnected()
                time.sleep(delay)
            except conn.channel_errors as exc:
                self._drop(conn)
                if channel_retry or not retry_while():
                    raise PublishError(f"the broker closed the channel: {exc}") from exc
                channel_retry = True
                self.topology.forget()
                logger.warning("channel error (%s); re-declaring topology and retrying", exc)
            finally:
                conn.release()


__all__ = [
    "Client",
    "EnqueueResult",
]
