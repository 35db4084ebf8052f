"""What happens to jobs in a worker, as events other parts subscribe to (DESIGN §14).

Every consumer of the binding (:class:`~ojs_kombu.Worker`, the Dramatiq and the
Celery adapters) owns one :class:`Lifecycle` and emits a :class:`JobEvent` at
each step of a job it handles:

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
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, NamedTuple, get_args

from ojs_kombu.model.job import Job
from ojs_kombu.model.timefmt import parse_timestamp, utcnow

logger = logging.getLogger(__name__)

JobEventName = Literal["started", "succeeded", "failed", "retried", "dead-lettered", "cancelled", "expired"]
"""The lifecycle events of a job (the routing key of an events-stream message is ``job.{event}.{queue}``)."""

JOB_EVENT_NAMES: tuple[str, ...] = get_args(JobEventName)


def new_worker_id() -> str:
    """A worker id unique across hosts and restarts: ``{host}.{pid}.{6 hex digits}``."""
    return f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


class _JobEventFields(NamedTuple):
    event: JobEventName
    job_id: str
    job_type: str
    queue: str
    attempt: int
    worker_id: str
    at: datetime
    error: dict[str, Any] | None
    enqueued_at: datetime | None
    scheduled_at: datetime | None


class JobEvent(_JobEventFields):
    """One step of one job in one worker (immutable: a named tuple).

    Parameters:
        event: what happened.
        job_id, job_type, queue: the job.
        attempt: the 1-based execution the event is about.
        worker_id: the worker that emitted it.
        at: when (UTC; default: now).
        error: for ``failed``: ``{"code", "type", "message"}`` of the failure.
        enqueued_at, scheduled_at: on a ``started`` event, the job's ``enqueued_at`` /
            ``scheduled_at`` (aware datetimes), when it has them: what queue wait and scheduling
            lateness are measured from (:class:`~ojs_kombu.observability.job_metrics.JobMetrics`);
            None on the other events (parsing them costs a µs per event nobody reads).

    A named tuple rather than a frozen dataclass: a worker builds two per job in the thread
    that settles it, and a tuple is built in one step (a frozen dataclass writes its ten
    fields one by one: ~7,000 more instructions per event, measured).
    """

    __slots__ = ()

    def __new__(
        cls,
        event: JobEventName,
        job_id: str,
        job_type: str,
        queue: str,
        attempt: int,
        worker_id: str,
        at: datetime | None = None,
        error: dict[str, Any] | None = None,
        enqueued_at: datetime | None = None,
        scheduled_at: datetime | None = None,
    ) -> JobEvent:
        fields = (event, job_id, job_type, queue, attempt, worker_id, at or utcnow(), error, enqueued_at, scheduled_at)
        return _new_tuple(cls, fields)


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
        self._lock = threading.Lock()

    def subscribe(self, subscriber: Subscriber) -> None:
        """Call ``subscriber`` with every event emitted from now on."""
        with self._lock:
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
            The event, or ``None`` when nobody subscribes (nothing is built).
        """
        subscribers = self._subscribers
        if not subscribers:
            return None
        enqueued_at, scheduled_at = _moments(job) if event == "started" else (None, None)
        job_event = _new_event(
            event, job.id, job.type, job.queue, attempt, self.worker_id, utcnow(), error, enqueued_at, scheduled_at
        )
        for subscriber in subscribers:
            try:
                subscriber(job_event)
            except Exception:
                logger.exception("a lifecycle subscriber failed on %s of job %s", event, job.id)
        return job_event


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


def _moments(job: Job) -> tuple[datetime | None, datetime | None]:
    """``job``'s ``enqueued_at`` and ``scheduled_at``; both None when a job built without validation
    (an adapter's ``Job.model_construct``) carries a malformed one: events never fail on them."""
    enqueued, scheduled = job.enqueued_at, job.scheduled_at
    try:
        # What Job.enqueued_datetime / scheduled_datetime return, without their two calls each.
        return (
            None if enqueued is None else parse_timestamp(enqueued),
            None if scheduled is None else parse_timestamp(scheduled),
        )
    except (ValueError, TypeError):  # ValidationError is a ValueError
        return None, None


__all__ = ["JOB_EVENT_NAMES", "JobEvent", "JobEventName", "Lifecycle", "Subscriber", "new_worker_id"]
