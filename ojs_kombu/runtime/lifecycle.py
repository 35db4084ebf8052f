"""What happens to jobs in a worker, as events other parts subscribe to (DESIGN §14).

Every consumer of the binding (:class:`~ojs_kombu.Worker`, the Dramatiq and the
Celery adapters) owns one :class:`Lifecycle` and emits a :class:`JobEvent` (defined with
the events stream, :class:`ojs_kombu.wire.events.JobEvent`) at each step of a job it handles:

==================  =====================================================================
event               when
==================  =====================================================================
``started``         a handler starts an attempt
``succeeded``       the handler returned; the job is acked
``failed``          an attempt failed (every failed attempt; followed by ``retried`` or
                    ``dead-lettered`` when the job goes on, alone when it is discarded)
``retried``         the job was published to a retry queue for its next attempt
``dead-lettered``   the job went to its dead letter queue
``cancelled``       a cancelled job was dropped on delivery or stopped while running
``expired``         a job delivered after its ``expires_at`` was dropped
==================  =====================================================================

Subscribers are what the control plane builds on: the recent-history window that
answers INFO requests, and the (opt-in) lifecycle events published to the events
stream.  A subscriber runs in the emitting thread and must be quick; one that
raises is logged and never stops the job's settling.

A *deferred* subscriber (``subscribe(..., deferred=True)``) keeps state that is read
now and then (the :class:`~ojs_kombu.runtime.activity.Activity` behind INFO, the job
metrics behind a scrape) rather than acting on each event.  For it, :meth:`Lifecycle.emit`
only queues what the event needs (a tuple and the clock); the events are built and
delivered, in the order they were emitted, by :meth:`Lifecycle.flush`, which the owner
of such state calls before every read, and which runs by itself once
:data:`MAX_DEFERRED` events wait.  A worker's hot path thus leaves that
bookkeeping to batches.  Measured in a Celery prefork worker's main
process (the one process that reads, dispatches and acks every task; 20,000 no-op tasks,
``py-spy``): the two events of a task took 5.6 % of its samples when delivered as emitted,
3.3 % deferred (the flushes included).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ojs_kombu.model.job import Job
from ojs_kombu.model.timefmt import parse_timestamp, utcnow
from ojs_kombu.wire.events import JOB_EVENT_NAMES, JobEvent, JobEventName

logger = logging.getLogger(__name__)

MAX_DEFERRED = 1024
"""Events queued for deferred subscribers at most: the emit that queues one more flushes them."""


def new_worker_id() -> str:
    """A worker id unique across hosts and restarts: ``{host}.{pid}.{6 hex digits}``."""
    return f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


_new_tuple = tuple.__new__


Subscriber = Callable[[JobEvent], None]


class Lifecycle:
    """The job events of one worker, fanned out to subscribers.

    Parameters:
        worker_id: stamped on every event (default: :func:`new_worker_id`).
    """

    def __init__(self, worker_id: str | None = None):
        self.worker_id = worker_id or new_worker_id()
        self._subscribers: tuple[Subscriber, ...] = ()
        self._deferred: tuple[Subscriber, ...] = ()
        # What emit() queued for the deferred subscribers: a built JobEvent when an immediate
        # subscriber needed one anyway, else the fields to build it from (_Queued).
        self._pending: deque[JobEvent | _Queued] = deque()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one flush at a time: events reach subscribers in order

    def subscribe(self, subscriber: Subscriber, *, deferred: bool = False) -> None:
        """Call ``subscriber`` with every event emitted from now on.

        Parameters:
            subscriber: called with each :class:`JobEvent`.
            deferred: call it from :meth:`flush` instead of from :meth:`emit` (see the module
                docstring): events arrive later, in order, in the thread that flushes.
        """
        with self._lock:
            if deferred:
                self._deferred = (*self._deferred, subscriber)
            else:
                self._subscribers = (*self._subscribers, subscriber)

    def emit(
        self, event: JobEventName, job: Job, attempt: int, *, error: dict[str, Any] | None = None
    ) -> JobEvent | None:
        """Tell every subscriber that ``event`` happened to ``job`` at ``attempt``.

        Parameters:
            event: what happened.
            job: the job.
            attempt: the 1-based execution.
            error: the failure, for ``failed``.

        Returns:
            The event, or ``None`` when no subscriber is called now (nothing is built: deferred
            subscribers get it from :meth:`flush`).
        """
        subscribers = self._subscribers
        if not subscribers:
            if self._deferred:
                moments = (job.enqueued_at, job.scheduled_at) if event == "started" else _NONE
                self._defer((event, job.id, job.type, job.queue, attempt, error, time.time_ns(), moments))
            return None
        enqueued_at, scheduled_at = _moments(job.enqueued_at, job.scheduled_at) if event == "started" else _NONE
        job_event = _new_event(
            event, job.id, job.type, job.queue, attempt, self.worker_id, utcnow(), error, enqueued_at, scheduled_at
        )
        for subscriber in subscribers:
            _deliver(subscriber, job_event)
        if self._deferred:
            self._defer(job_event)
        return job_event

    def _defer(self, entry: JobEvent | _Queued) -> None:
        pending = self._pending
        pending.append(entry)
        if len(pending) >= MAX_DEFERRED:
            self.flush()

    def flush(self) -> None:
        """Deliver the events queued so far to the deferred subscribers, in the order they were emitted.

        Thread-safe; events emitted while it runs wait for the next flush.
        """
        pending = self._pending
        if not pending:
            return
        with self._flush_lock:
            popleft, subscribers, worker_id = pending.popleft, self._deferred, self.worker_id
            for _ in range(len(pending)):
                entry = popleft()
                event = entry if isinstance(entry, JobEvent) else _built(entry, worker_id)
                for subscriber in subscribers:
                    _deliver(subscriber, event)


# The fields emit() queues for a deferred subscriber: event, job id, type and queue, attempt,
# error, time.time_ns() and the job's (enqueued_at, scheduled_at) texts on a started event.
_Queued = tuple[JobEventName, str, str, str, int, "dict[str, Any] | None", int, tuple[Any, Any]]
_NONE: tuple[None, None] = (None, None)


def _built(queued: _Queued, worker_id: str) -> JobEvent:
    """The event :meth:`Lifecycle.emit` would have built for ``queued`` (at the time it was queued)."""
    event, job_id, job_type, queue, attempt, error, at, (enqueued, scheduled) = queued
    enqueued_at, scheduled_at = _NONE if enqueued is None and scheduled is None else _moments(enqueued, scheduled)
    return _new_event(
        event, job_id, job_type, queue, attempt, worker_id, _from_ns(at), error, enqueued_at, scheduled_at
    )


def _from_ns(ns: int) -> datetime:
    """``time.time_ns()`` as an aware datetime, cut to the microsecond as ``datetime.now()`` cuts it:
    ``datetime.fromtimestamp(time.time())`` rounds half-even and could stamp an event 1 µs after a
    ``datetime.now()`` read later."""
    seconds, nanoseconds = divmod(ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=nanoseconds // 1000)


def _deliver(subscriber: Subscriber, event: JobEvent) -> None:
    try:
        subscriber(event)
    except Exception:
        logger.exception("a lifecycle subscriber failed on %s of job %s", event.event, event.job_id)


def _new_event(
    event: JobEventName,
    job_id: str,
    job_type: str,
    queue: str,
    attempt: int,
    worker_id: str,
    at: datetime,
    error: dict[str, Any] | None,
    enqueued_at: datetime | None,
    scheduled_at: datetime | None,
) -> JobEvent:
    """``JobEvent(event, ..., scheduled_at)`` as :meth:`Lifecycle.emit` builds it, twice per job:
    the tuple built directly, without ``JobEvent.__new__``'s keyword handling and default."""
    job_event: JobEvent = _new_tuple(
        JobEvent, (event, job_id, job_type, queue, attempt, worker_id, at, error, enqueued_at, scheduled_at)
    )
    return job_event


def _moments(enqueued: Any, scheduled: Any) -> tuple[datetime | None, datetime | None]:
    """A job's ``enqueued_at`` and ``scheduled_at`` texts as datetimes; both None when a job built
    without validation (an adapter's ``Job.model_construct``) carries a malformed one: events never
    fail on them."""
    try:
        # What Job.enqueued_datetime / scheduled_datetime return, without their two calls each.
        return (
            None if enqueued is None else parse_timestamp(enqueued),
            None if scheduled is None else parse_timestamp(scheduled),
        )
    except (ValueError, TypeError):  # ValidationError is a ValueError
        return None, None


__all__ = ["JOB_EVENT_NAMES", "MAX_DEFERRED", "JobEvent", "JobEventName", "Lifecycle", "Subscriber", "new_worker_id"]
