"""Per job type metrics (``ojs_job_*``), fed by the job lifecycle events of a worker.

:class:`JobMetrics` is a subscriber of any
:class:`~ojs_kombu.runtime.lifecycle.Lifecycle` (``JOB_METRICS.subscribe(lifecycle)``):
every :class:`~ojs_kombu.Worker` subscribes the process-wide ``JOB_METRICS`` to its own,
and so can any other consumer that emits job events (the Dramatiq broker's
``lifecycle``).  They are registered with prometheus_client's default registry beside
the binding's ``ojs_amqp_*`` metrics (:mod:`ojs_kombu.observability.metrics`), so
:func:`~ojs_kombu.observability.server.serve_metrics` exposes both.

==================================  ======================  ===========================================
metric                              labels                  what
==================================  ======================  ===========================================
``ojs_job_runtime_seconds``         queue, type             histogram: ``started`` to ``succeeded``,
                                                            ``failed`` or ``cancelled`` (while running),
                                                            one observation per attempt
``ojs_job_queue_wait_seconds``      queue, type             histogram: from when the job was ready
                                                            (``enqueued_at``, or ``scheduled_at`` when
                                                            later) to the start of its first attempt
``ojs_job_schedule_lateness_seconds`` queue, type           histogram: start of the first attempt
                                                            minus ``scheduled_at``, scheduled jobs only
``ojs_job_outcomes_total``          queue, type, outcome    counter: one per lifecycle event but
                                                            ``started``: ``succeeded``, ``failed``
                                                            (every failed attempt), ``retried``,
                                                            ``dead-lettered``, ``cancelled``, ``expired``
==================================  ======================  ===========================================

Queue wait and lateness are measured on the first attempt only: a later attempt's
wait is the back-off its retry policy chose, and its ``enqueued_at`` is still the
first one's.  Both use the producer's clock against the worker's; a negative
difference (clock skew) is recorded as 0.  ``failed`` counts attempts:
``failed`` = ``retried`` + ``dead-lettered`` + discarded.

Buckets (seconds):

* runtime: 5 ms to 1 h (``RUNTIME_BUCKETS``): handlers from a quick I/O call to a batch job;
* queue wait: 5 ms to 1 day (``QUEUE_WAIT_BUCKETS``): an idle queue starts a job in
  milliseconds, a backlog can hold it for hours;
* lateness: 1 ms to 5 min (``LATENESS_BUCKETS``): the scheduling cascade delivers
  about 20-25 ms late at p99 on an idle node (DESIGN §6); the upper buckets show a
  backlog behind the due job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

RUNTIME_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
)  # fmt: skip
"""Buckets of ``ojs_job_runtime_seconds``."""

QUEUE_WAIT_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600,
)  # fmt: skip
"""Buckets of ``ojs_job_queue_wait_seconds``."""

LATENESS_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
)  # fmt: skip
"""Buckets of ``ojs_job_schedule_lateness_seconds``."""

#: Events that end a running attempt: its runtime is observed.
_ENDS_RUN = frozenset({"succeeded", "failed", "cancelled"})

#: Attempts remembered as started at most (a start whose end never comes, e.g. a job still
#: running when its worker gave up waiting at shutdown, must not grow memory forever).
MAX_RUNNING = 100_000


class JobEventLike(Protocol):
    """What :class:`JobMetrics` reads of a :class:`~ojs_kombu.runtime.lifecycle.JobEvent`
    (this layer sits below ``runtime`` and cannot import it)."""

    @property
    def event(self) -> str: ...
    @property
    def job_id(self) -> str: ...
    @property
    def job_type(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def at(self) -> datetime: ...
    @property
    def enqueued_at(self) -> datetime | None: ...
    @property
    def scheduled_at(self) -> datetime | None: ...


class LifecycleLike(Protocol):
    """Anything job events can be subscribed to: a :class:`~ojs_kombu.runtime.lifecycle.Lifecycle`."""

    def subscribe(self, subscriber: Callable[[JobEventLike], None]) -> None: ...


@dataclass(frozen=True)
class _Series:
    """The children of one (queue, type): ``labels()`` costs more than an observation."""

    runtime: Any
    queue_wait: Any
    lateness: Any
    outcomes: dict[str, Any]


class JobMetrics:
    """The ``ojs_job_*`` metrics (see the module docstring), recorded from job lifecycle events.

    Thread-safe: events arrive from every handler thread of every subscribed worker.

    Parameters:
        registry: where the metrics are registered (default: prometheus_client's default registry).
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY):
        labels = ["queue", "type"]
        # Registered first, so collected first: record() observes a run's runtime before it counts
        # its outcome, so a scrape that reads an outcome then reads that run's runtime too.
        self.outcomes = Counter(
            "ojs_job_outcomes_total",
            "Job lifecycle events but started: succeeded, failed (per attempt), retried, dead-lettered, "
            "cancelled, expired",
            [*labels, "outcome"],
            registry=registry,
        )
        self.runtime = Histogram(
            "ojs_job_runtime_seconds",
            "Time a handler ran one attempt of a job (started to succeeded, failed or cancelled)",
            labels,
            buckets=RUNTIME_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "ojs_job_queue_wait_seconds",
            "Time from enqueued_at (or a later scheduled_at) to the start of a job's first attempt",
            labels,
            buckets=QUEUE_WAIT_BUCKETS,
            registry=registry,
        )
        self.lateness = Histogram(
            "ojs_job_schedule_lateness_seconds",
            "Start of a scheduled job's first attempt minus its scheduled_at",
            labels,
            buckets=LATENESS_BUCKETS,
            registry=registry,
        )
        self._series: dict[tuple[str, str], _Series] = {}
        self._started: dict[tuple[str, str, int], datetime] = {}
        self._lock = threading.Lock()

    def subscribe(self, lifecycle: LifecycleLike) -> None:
        """Record the events of ``lifecycle`` from now on.

        Parameters:
            lifecycle: a worker's :attr:`~ojs_kombu.Worker.lifecycle`, the Dramatiq broker's, ...
        """
        lifecycle.subscribe(self.record)

    def record(self, event: JobEventLike) -> None:
        """Record one lifecycle event (a :class:`~ojs_kombu.runtime.lifecycle.Lifecycle` subscriber).

        Parameters:
            event: what happened to a job.
        """
        name = event.event
        series = self._series.get((event.queue, event.job_type)) or self._series_of(event.queue, event.job_type)
        if name == "started":
            with self._lock:
                started = self._started
                started[(event.worker_id, event.job_id, event.attempt)] = event.at
                if len(started) > MAX_RUNNING:
                    del started[next(iter(started))]  # the oldest start
            if event.attempt == 1:
                self._first_start(series, event)
            return
        if name in _ENDS_RUN:
            with self._lock:
                start = self._started.pop((event.worker_id, event.job_id, event.attempt), None)
            if start is not None:  # None: ended without running (cancelled or lost before it started)
                series.runtime.observe(_seconds(event.at, start))
        # Counted after the runtime, and collected before it (see __init__): a scrape that sees
        # the outcome sees its runtime too.
        outcome = series.outcomes.get(name)
        if outcome is None:
            outcome = series.outcomes[name] = self.outcomes.labels(event.queue, event.job_type, name)
        outcome.inc()

    def _first_start(self, series: _Series, event: JobEventLike) -> None:
        enqueued, scheduled = event.enqueued_at, event.scheduled_at
        ready = enqueued if scheduled is None or (enqueued is not None and enqueued > scheduled) else scheduled
        if ready is not None:
            series.queue_wait.observe(_seconds(event.at, ready))
        if scheduled is not None:
            series.lateness.observe(_seconds(event.at, scheduled))

    def _series_of(self, queue: str, job_type: str) -> _Series:
        """The children of (``queue``, ``job_type``), made on its first event."""
        series = self._series.get((queue, job_type))
        if series is None:
            series = self._series[(queue, job_type)] = _Series(
                self.runtime.labels(queue, job_type),
                self.queue_wait.labels(queue, job_type),
                self.lateness.labels(queue, job_type),
                {},
            )
        return series


def _seconds(end: datetime, start: datetime) -> float:
    """``end - start`` in seconds, never negative (clocks of producers and workers differ)."""
    return max(0.0, (end - start).total_seconds())


#: The process-wide per job type metrics, in prometheus_client's default registry.
JOB_METRICS = JobMetrics()

__all__ = [
    "JOB_METRICS",
    "LATENESS_BUCKETS",
    "MAX_RUNNING",
    "QUEUE_WAIT_BUCKETS",
    "RUNTIME_BUCKETS",
    "JobEventLike",
    "JobMetrics",
    "LifecycleLike",
]
