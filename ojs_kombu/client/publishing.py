"""The publishing service: ``enqueue``, ``enqueue_job`` and ``enqueue_many`` with publisher confirms.

Every publish goes to ``ojs.exchange.direct`` with routing key ``{queue}``,
``mandatory=True``, on the pooled connection's confirm-mode channel (binding §5.1).
A job whose ``scheduled_at`` lies ahead goes through the scheduling cascade.  A
batch is one :class:`_Batch`: its jobs are checked first (nothing reaches the
broker before), then published pipelined, encoded as they go, and their confirms
read; a reconnect publishes again only the jobs not yet confirmed.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache, partial
from typing import Any

from kombu.connection import Connection

from ojs_kombu.amqp.properties import properties_template
from ojs_kombu.amqp.publisher import ConfirmedPublisher, PublishTicket
from ojs_kombu.client._gc_pause import GcPause
from ojs_kombu.client.results import EnqueueResult
from ojs_kombu.client.session import Service, Session
from ojs_kombu.client.uniqueness import Uniqueness
from ojs_kombu.errors import BrokerConnectionError, BrokerRefusedError, ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import validate_queue_name
from ojs_kombu.observability.tracing import current_trace_meta, with_trace_context
from ojs_kombu.policy.schedule import check_delay, delay_ms_until
from ojs_kombu.wire.codec import OutgoingMessage, encode, encode_body, properties_key
from ojs_kombu.wire.entities import QueueOptions

#: ``enqueue_many`` pauses the cyclic garbage collector for batches of at least this many jobs
#: (``Client(gc_pause=True)``, :mod:`ojs_kombu.client._gc_pause`); a smaller batch's objects
#: hardly outlive a young collection.
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


@lru_cache(maxsize=1024)  # per job of a batch, mostly the same few names; only valid ones are kept
def _validated_queue_name(queue: str) -> str:
    return validate_queue_name(queue)


def check_job(job: Job) -> datetime | None:
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


def encode_job(job: Job, app_id: str | None) -> OutgoingMessage:
    """``job`` as its AMQP message.

    Raises:
        ValidationError: the envelope is too large, or a job built without validation
            holds a value JSON cannot carry.
    """
    try:
        return encode(job, app_id=app_id)
    except ValidationError:
        raise
    except (TypeError, ValueError) as exc:  # what the JSON encoder raises
        raise ValidationError(f"job {job.id} cannot be encoded as JSON: {exc}", field="args") from exc


def _body(job: Job) -> bytes:
    """``job``'s message body.

    Raises:
        ValidationError: as :func:`encode_job`.
    """
    try:
        return encode_body(job)
    except ValidationError:
        raise
    except (TypeError, ValueError) as exc:  # what the JSON encoder raises
        raise ValidationError(f"job {job.id} cannot be encoded as JSON: {exc}", field="args") from exc


class Publishing(Service):
    """Enqueues jobs through a :class:`~ojs_kombu.client.session.Session`; thread-safe.

    Parameters:
        session: the client's session.
        gc_pause: pause Python's cyclic garbage collector while a batch of at least
            :data:`GC_PAUSE_MIN_JOBS` jobs is published and confirmed (see :meth:`enqueue_many`).
    """

    def __init__(self, session: Session, *, gc_pause: bool = True, uniqueness: Uniqueness | None = None):
        super().__init__(session)
        self.gc_pause = gc_pause
        self.uniqueness = uniqueness

    def enqueue_job(self, job: Job) -> Job:
        """Enqueue ``job`` and wait for its confirm (as :meth:`ojs_kombu.Client.enqueue_job`).

        Returns:
            The confirmed job.

        Raises:
            ValidationError, PublishError, BrokerConnectionError, BrokerRefusedError: as for
            :meth:`ojs_kombu.Client.enqueue`.
        """
        return self.publish([job])[0].unwrap()

    def enqueue_many(self, jobs: list[Job]) -> list[EnqueueResult]:
        """Publish ``jobs`` pipelined on one channel, then read all confirms.

        With ``gc_pause``, a batch of :data:`GC_PAUSE_MIN_JOBS` jobs or more runs its first
        publishing attempt with the cyclic collector paused: every object of the batch lives
        until its confirms, so a collection meanwhile would only scan them.  The pause ends with
        the batch, when that attempt fails (the reconnect's wait and any later attempt run
        unpaused), or as soon as a confirm wait has read nothing for a second (a stalled broker);
        collections are delayed, never skipped.  One batch at a time pauses it, and a program
        that disabled the collector keeps it disabled.

        Returns:
            One :class:`EnqueueResult` per job, in order.
        """
        return self.publish(jobs)

    def declare_queue(self, name: str, scheduling: bool, queue_options: dict[str, Any]) -> str:
        """Declare job queue ``name`` with its DLQ (and its scheduling cascade) now (:meth:`ojs_kombu.Client.declare_queue`).

        Parameters:
            name: the OJS queue.
            scheduling: also declare the scheduling cascade and its binding to the queue.
            queue_options: :class:`~ojs_kombu.wire.entities.QueueOptions` fields replacing the
                client-wide options for this queue (none: the client-wide ones).

        Returns:
            The AMQP queue name.

        Raises:
            ValidationError: a bad queue name or option.
            TopologyConflictError: the queue exists with other arguments (see ``on_conflict``).
        """
        validate_queue_name(name)
        session = self.session
        if queue_options:
            session.topology.per_queue[name] = QueueOptions(**queue_options)

        def declare(conn: Connection) -> None:
            session.topology.declare_queue(conn.connection, name)
            if scheduling:
                session.topology.ensure_scheduling(conn.connection, name, session.cascade)

        session.run(declare)
        return session.names.job_queue(name)

    def publish(self, jobs: list[Job]) -> list[EnqueueResult]:
        """Publish a batch (one job: a bad job raises its ValidationError); one outcome per job.

        Jobs with a ``unique`` policy take their lock first (:mod:`ojs_kombu.client.uniqueness`).
        """
        if self.uniqueness is not None and any(isinstance(job, Job) and job.unique is not None for job in jobs):
            return self.uniqueness.publish(jobs, self._publish)
        return self._publish(jobs)

    def _publish(self, jobs: list[Job]) -> list[EnqueueResult]:
        batch = _Batch(self.session, jobs, pause_gc=self.gc_pause and len(jobs) >= GC_PAUSE_MIN_JOBS)
        try:
            try:
                self.session.run(batch.publish)
            except (BrokerConnectionError, BrokerRefusedError) as exc:
                batch.fail_pending(exc)
            return batch.outcomes()
        finally:
            # Here, not earlier: the collection that the pause delayed runs in the caller's next
            # allocation, once the batch's tickets are gone.
            batch.end_pause()


class _Batch:
    """One call's jobs on their way to the broker: checked, then published until confirmed.

    Per job, only what must live until its confirm: a batch's objects outlive the young
    generations, and each full garbage collection scans every one of them again.
    """

    def __init__(self, session: Session, jobs: list[Job], *, pause_gc: bool):
        self._pause = GcPause() if pause_gc else None  # started by the first attempt only
        self._attempted = False
        if current_trace_meta():  # the caller's trace context, the same for every job of the batch
            jobs = [with_trace_context(job) if isinstance(job, Job) else job for job in jobs]
        self.session = session
        self.jobs = jobs
        self.results: list[EnqueueResult | None] = [None] * len(jobs)
        # Jobs are checked now and encoded as they are published, so the broker works on the
        # first ones while the rest are encoded; an encoded message is kept for a resend.
        self.messages: dict[int, OutgoingMessage] = {}
        self.delayed: dict[int, datetime] = {}  # the jobs whose scheduled_at lies ahead
        self.pending: list[int] = []  # the valid jobs, not yet settled
        self.due_queues: set[str] = set()  # their queues, declared before the first publish
        self.delayed_queues: set[str] = set()
        self._check()

    def _check(self) -> None:
        """One pass over the jobs before the broker gets anything; a single bad job raises."""
        single = len(self.jobs) == 1
        for index, job in enumerate(self.jobs):
            try:
                scheduled = check_job(job)
                if single:
                    self.messages[index] = encode_job(job, self.session.app_id)
            except ValidationError as exc:
                self.results[index] = EnqueueResult(job, exc)
                continue
            self.pending.append(index)
            if scheduled is None:
                self.due_queues.add(job.queue)
            else:
                self.delayed[index] = scheduled
                self.delayed_queues.add(job.queue)
        if single and self.results[0] is not None:
            self.results[0].unwrap()  # a single bad job: plain ValidationError

    def publish(self, conn: Connection) -> None:
        """The session operation: publish what is pending on ``conn`` and read its confirms."""
        if not self.pending:
            return
        try:
            self._publish_pending(conn)
        except conn.connection_errors + conn.channel_errors:
            if self.pending:
                self.end_pause()  # never across the wait before a reconnect, nor its attempt
                raise
            self.session.drop(conn)  # every job was confirmed before the connection broke

    def _publish_pending(self, conn: Connection) -> None:
        publisher = self.session.publisher(conn)
        self._declare(conn)
        sent: list[int] = []
        tickets: list[PublishTicket] = []
        if self._pause is not None and not self._attempted:  # a retried attempt runs unpaused
            publisher.on_stall = self._pause.start().end  # a broker that stalls ends it at once
        self._attempted = True
        try:
            self._publish_all(publisher, sent, tickets)
            # After a nack the publisher moves to a fresh channel (RabbitMQ 3.10's stale quorum leader).
            publisher.wait(tickets, self.session.confirm_timeout)
        finally:
            publisher.on_stall = None
            self._settle(sent, tickets)

    def _declare(self, conn: Connection) -> None:
        session = self.session
        if session.declare:
            for queue in self.due_queues:
                session.topology.ensure_queue(conn.connection, queue)
            for queue in self.delayed_queues:
                session.topology.ensure_scheduling(conn.connection, queue, session.cascade)

    def _publish_all(self, publisher: ConfirmedPublisher, sent: list[int], tickets: list[PublishTicket]) -> None:
        """Publish every pending job (buffered), appending each publish's index and ticket."""
        jobs, messages, results, delayed = self.jobs, self.messages, self.results, self.delayed
        publish_job, app_id = publisher.publish_job, self.session.app_id
        direct, confirm_timeout = self.session.names.direct_exchange, self.session.confirm_timeout
        for index in self.pending:
            job = jobs[index]
            message = messages.get(index)
            key = properties_key(job, app_id) if message is None and index not in delayed else None
            # A job whose properties an earlier job of the same key had encoded: only its
            # body is encoded, and its frames are built around its id.
            template = _TEMPLATES.get(key) if key is not None else None
            try:
                if template is not None:
                    body = _body(job)
                elif message is None:
                    message = messages[index] = encode_job(job, app_id)
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
            else:
                assert message is not None
                ticket = self._publish_message(publisher, index, message)
            tickets.append(ticket)
            sent.append(index)

    def _publish_message(self, publisher: ConfirmedPublisher, index: int, message: OutgoingMessage) -> PublishTicket:
        """Publish a job from its whole message: a delayed job (to the cascade), or one without a template."""
        job, session = self.jobs[index], self.session
        if index in self.delayed:
            # The delay is measured after the publisher's channel set-up (publish_when_ready).
            return publisher.publish_when_ready(
                partial(session.cascade.destination, message, self.delayed[index], job.queue),
                queue=job.queue,
                job_id=job.id,
                confirm_timeout=session.confirm_timeout,
                flush=False,
            )
        return publisher.publish(
            message,
            exchange=session.names.direct_exchange,
            routing_key=job.queue,
            queue=job.queue,
            job_id=job.id,
            confirm_timeout=session.confirm_timeout,
            flush=False,  # pipelined: written in batches, at the latest by wait()
        )

    def _settle(self, sent: list[int], tickets: list[PublishTicket]) -> None:
        """Keep what was confirmed (it stays done, even if the connection dies now)."""
        results, jobs = self.results, self.jobs
        for index, ticket in zip(sent, tickets, strict=True):
            if ticket.done:
                results[index] = EnqueueResult(jobs[index], ticket.error)
        self.pending = [i for i in self.pending if results[i] is None]

    def end_pause(self) -> None:
        """End the collector's pause, if this batch holds it (idempotent)."""
        if self._pause is not None:
            self._pause.end()

    def fail_pending(self, exc: BrokerConnectionError | BrokerRefusedError) -> None:
        """The broker could not be reached: every job not yet settled fails with ``exc``."""
        for index in self.pending:
            self.results[index] = EnqueueResult(self.jobs[index], exc)

    def outcomes(self) -> list[EnqueueResult]:
        """One outcome per job, in order."""
        return [r for r in self.results if r is not None]


__all__ = ["GC_PAUSE_MIN_JOBS", "Publishing", "check_job", "encode_job"]
