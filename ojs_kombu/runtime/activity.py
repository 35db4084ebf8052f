"""What one worker knows about its jobs: running now, and a window of recent outcomes (DESIGN §14).

:class:`Activity` subscribes to a worker's :class:`~ojs_kombu.runtime.lifecycle.Lifecycle`
and answers INFO requests (binding §5.8, AMQP-021) with a :class:`~ojs_kombu.model.info.JobInfo`;
the worker presence of the events stream lists :meth:`Activity.active`.

How events map to states:

==================  ==================================================================
event               state
==================  ==================================================================
``started``         ``active`` (with its start time)
``succeeded``       ``completed``
``failed``          ``discarded``, unless ``retried`` (``retryable``) or ``dead-lettered``
                    (``discarded``) follows
``cancelled``       ``cancelled``
``expired``         ``discarded``
==================  ==================================================================

Memory: the history keeps the last ``history`` finished jobs (default 10,000),
one tuple each (its :class:`JobInfo` is built when INFO asks); measured about
350 bytes per entry (the tuple, its 36-character id, two datetimes and its
ordered-dict slot; queue, type and worker id are shared), plus the error
message of a failed one: ~4 MB for the default window.  Past the bound the
oldest entry goes.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable
from datetime import datetime
from typing import Any, NamedTuple

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.info import JobInfo, JobState
from ojs_kombu.observability.job_metrics import JOB_METRICS
from ojs_kombu.runtime.lifecycle import JobEvent, Lifecycle
from ojs_kombu.wire.events import ActiveJob

logger = logging.getLogger(__name__)

#: Default size of the recent-history window (finished jobs kept for INFO).
DEFAULT_HISTORY = 10_000

_FINISHED: dict[str, JobState] = {
    "succeeded": "completed",
    "failed": "discarded",
    "cancelled": "cancelled",
    "expired": "discarded",
    "retried": "retryable",
    "dead-lettered": "discarded",
}


class _Finished(NamedTuple):
    """A finished job as the history keeps it: the fields of its :class:`JobInfo` but the id
    (built only when INFO or the presence asks: most entries are never looked up)."""

    queue: str
    type: str
    state: JobState
    worker_id: str
    attempt: int
    started_at: datetime | None
    finished_at: datetime | None
    error: dict[str, Any] | None


class Activity:
    """The jobs a worker runs now and the last ``history`` it finished; thread-safe.

    :meth:`follow` a worker's :class:`~ojs_kombu.runtime.lifecycle.Lifecycle` (a deferred
    subscriber: the events are applied when something reads), or use :meth:`record` as a
    subscriber. Recording is per job and cheap: a running job is its ``started`` event, a
    finished one a tuple; the :class:`JobInfo` is built when asked for.

    Parameters:
        history: how many finished jobs to remember (at least 1).

    Raises:
        ValidationError: ``history`` is not a positive integer.
    """

    def __init__(self, history: int = DEFAULT_HISTORY):
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise ValidationError(f"history must be a positive integer, got {history!r}", field="history")
        self.history = history
        self._running: dict[str, JobEvent] = {}  # by lowercase id: its ``started`` event
        self._finished: OrderedDict[str, _Finished] = OrderedDict()
        self._aliases: OrderedDict[str, str] = OrderedDict()  # another id (a Dramatiq message id) -> job id
        self._lock = threading.Lock()
        self._sources: tuple[Lifecycle, ...] = ()

    def follow(self, lifecycle: Lifecycle) -> None:
        """Record the events of ``lifecycle`` from now on, as a deferred subscriber: each read
        (:meth:`lookup`, :meth:`active`, ...) first flushes what it emitted.

        Parameters:
            lifecycle: a worker's lifecycle hub.
        """
        self._sources = (*self._sources, lifecycle)
        lifecycle.subscribe(self.record, deferred=True)

    def _catch_up(self) -> None:
        for lifecycle in self._sources:
            lifecycle.flush()

    def record(self, event: JobEvent) -> None:
        """Apply one lifecycle event (a :class:`~ojs_kombu.runtime.lifecycle.Lifecycle` subscriber).

        Parameters:
            event: what happened to a job in this worker.
        """
        job_id = event.job_id.lower()
        with self._lock:
            if event.event == "started":
                self._running[job_id] = event
                return
            state = _FINISHED[event.event]
            running = self._running.pop(job_id, None)
            finished = self._finished.pop(job_id, None) if running is None else None
            if event.event in ("retried", "dead-lettered") and finished is not None:
                # The settling of a failure already recorded: keep its times and error.
                record = finished._replace(state=state, attempt=event.attempt)
            else:
                if running is not None:
                    started = running.at if running.attempt == event.attempt else None
                else:
                    started = (
                        finished.started_at if finished is not None and finished.attempt == event.attempt else None
                    )
                record = _new_finished(
                    (event.queue, event.job_type, state, event.worker_id, event.attempt, started, event.at, event.error)
                )
            self._finished.pop(job_id, None)
            self._finished[job_id] = record  # most recent last
            while len(self._finished) > self.history:
                self._finished.popitem(last=False)

    def alias(self, job_id: str, others: Iterable[str]) -> None:
        """Let :meth:`lookup` find ``job_id`` by ``others`` too (a framework's own id of the job,
        :func:`~ojs_kombu.model.job.framework_ids`), for as long as the history window's size of
        the latest aliases.

        Parameters:
            job_id: the job's id.
            others: the other ids it may be named by.
        """
        job_id = job_id.lower()
        with self._lock:
            for other in others:
                other = other.lower()
                if other == job_id:
                    continue
                self._aliases.pop(other, None)
                self._aliases[other] = job_id
            while len(self._aliases) > self.history:
                self._aliases.popitem(last=False)

    def lookup(self, job_id: str) -> JobInfo | None:
        """What this worker knows about ``job_id`` (any case), or about the job it is an
        :meth:`alias` of: running first, else its last outcome.

        Returns:
            The info (its ``job_id`` the OJS job id), or None when the job is neither running here
            nor in the history window.
        """
        job_id = job_id.lower()
        self._catch_up()
        with self._lock:
            job_id = self._aliases.get(job_id, job_id)
            running = self._running.get(job_id)
            finished = self._finished.get(job_id) if running is None else None
        if running is not None:
            return _info(job_id, _active_fields(running))
        return None if finished is None else _info(job_id, finished)

    def active(self) -> list[JobInfo]:
        """The jobs running now, oldest start first."""
        self._catch_up()
        with self._lock:
            running = list(self._running.items())
        running.sort(key=lambda item: item[1].at.timestamp())
        infos = (_info(job_id, _active_fields(event)) for job_id, event in running)
        return [info for info in infos if info is not None]

    def active_jobs(self) -> list[ActiveJob]:
        """The jobs running now as a worker presence lists them (the provider of a
        :class:`~ojs_kombu.runtime.presence.Beacon`)."""
        return [
            ActiveJob(info.job_id, info.queue, info.type, info.attempt, info.started_at)
            for info in self.active()
            if info.started_at is not None
        ]

    def __len__(self) -> int:
        """How many jobs are known (running and in the history window)."""
        self._catch_up()
        with self._lock:
            return len(self._running.keys() | self._finished.keys())


def _new_finished(fields: tuple[Any, ...]) -> _Finished:
    """``_Finished(*fields)`` without the named tuple's ``__new__`` frame (once per finished job)."""
    return tuple.__new__(_Finished, fields)


def _active_fields(started: JobEvent) -> tuple[str, str, JobState, str, int, datetime]:
    """The :class:`JobInfo` fields but the id of a job running since its ``started`` event."""
    return started.queue, started.job_type, "active", started.worker_id, started.attempt, started.at


def _info(job_id: str, fields: tuple[Any, ...]) -> JobInfo | None:
    """The info of ``job_id``; None (logged) when its events carried a field INFO cannot answer
    with (an adapter's unvalidated job): as if the job were unknown here."""
    try:
        return JobInfo(job_id, *fields)
    except ValidationError:
        logger.warning("job %s: its lifecycle events make no valid INFO answer", job_id, exc_info=True)
        return None


def worker_lifecycle(worker_id: str | None = None) -> tuple[Lifecycle, Activity]:
    """A new worker's :class:`Lifecycle`, with what every worker hangs on it: its
    :class:`Activity` (INFO, presence) and the process's job metrics (``ojs_job_*``).

    The :class:`~ojs_kombu.Worker`, the Dramatiq broker and the Celery worker all start here.

    Parameters:
        worker_id: the worker's id (default: a new one).

    Returns:
        The lifecycle and the activity it feeds.
    """
    lifecycle = Lifecycle(worker_id)
    activity = Activity()
    activity.follow(lifecycle)
    JOB_METRICS.subscribe(lifecycle)
    return lifecycle, activity


__all__ = ["DEFAULT_HISTORY", "Activity", "worker_lifecycle"]
