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
one :class:`JobInfo` each; measured about 350 bytes per entry (the slotted info,
its 36-character id, two datetimes and its ordered-dict slot; queue, type and
worker id are shared), plus the error message of a failed one: ~4 MB for the
default window.  Past the bound the oldest entry goes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.info import JobInfo, JobState
from ojs_kombu.runtime.lifecycle import JobEvent

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


class Activity:
    """The jobs a worker runs now and the last ``history`` it finished; thread-safe.

    Use :meth:`record` as a :class:`~ojs_kombu.runtime.lifecycle.Lifecycle` subscriber.

    Parameters:
        history: how many finished jobs to remember (at least 1).

    Raises:
        ValidationError: ``history`` is not a positive integer.
    """

    def __init__(self, history: int = DEFAULT_HISTORY):
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise ValidationError(f"history must be a positive integer, got {history!r}", field="history")
        self.history = history
        self._running: dict[str, JobInfo] = {}
        self._finished: OrderedDict[str, JobInfo] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, event: JobEvent) -> None:
        """Apply one lifecycle event (a :class:`~ojs_kombu.runtime.lifecycle.Lifecycle` subscriber).

        Parameters:
            event: what happened to a job in this worker.
        """
        job_id = event.job_id.lower()
        with self._lock:
            if event.event == "started":
                self._running[job_id] = JobInfo(
                    job_id, event.queue, event.job_type, "active", event.worker_id, event.attempt, event.at
                )
                return
            state = _FINISHED[event.event]
            running = self._running.pop(job_id, None)
            previous = running or self._finished.get(job_id)
            if event.event in ("retried", "dead-lettered") and previous is not None and previous.finished:
                # The settling of a failure already recorded: keep its times and error.
                info = replace(previous, state=state, attempt=event.attempt)
            else:
                started = previous.started_at if previous is not None and previous.attempt == event.attempt else None
                info = JobInfo(
                    job_id,
                    event.queue,
                    event.job_type,
                    state,
                    event.worker_id,
                    event.attempt,
                    started,
                    event.at,
                    event.error,
                )
            self._finished.pop(job_id, None)
            self._finished[job_id] = info  # most recent last
            while len(self._finished) > self.history:
                self._finished.popitem(last=False)

    def lookup(self, job_id: str) -> JobInfo | None:
        """What this worker knows about ``job_id`` (any case): running first, else its last outcome.

        Returns:
            The info, or None when the job is neither running here nor in the history window.
        """
        job_id = job_id.lower()
        with self._lock:
            return self._running.get(job_id) or self._finished.get(job_id)

    def active(self) -> list[JobInfo]:
        """The jobs running now, oldest start first."""
        with self._lock:
            running = list(self._running.values())
        return sorted(running, key=lambda info: info.started_at.timestamp() if info.started_at else 0.0)

    def __len__(self) -> int:
        """How many jobs are known (running and in the history window)."""
        with self._lock:
            return len(self._running.keys() | self._finished.keys())


__all__ = ["DEFAULT_HISTORY", "Activity"]
