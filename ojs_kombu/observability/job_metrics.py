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

import functools
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from ojs_kombu.wire.events import JobEvent

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

_LABELS = ("queue", "type")
_INF = float("inf")


class LifecycleLike(Protocol):
    """Anything job events can be subscribed to: a :class:`~ojs_kombu.runtime.lifecycle.Lifecycle`."""

    def subscribe(self, subscriber: Callable[[JobEvent], None], *, deferred: bool = ...) -> None: ...

    def flush(self) -> None: ...


class _Buckets:
    """One histogram series: a count per bucket (the last one ``+Inf``) and the sum."""

    __slots__ = ("bounds", "counts", "les", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds  # ends with +Inf
        self.les = _le_labels(bounds)
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe_between(self, start: datetime, end: datetime) -> None:
        """Observe ``end - start`` in seconds, never negative (clocks of producers and workers differ)."""
        seconds = (end - start).total_seconds()
        if seconds < 0.0:
            seconds = 0.0
        self.counts[bisect_left(self.bounds, seconds)] += 1  # the first bucket whose bound is >= seconds
        self.sum += seconds

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        """The exposition's ``le`` buckets (cumulative counts) and the sum."""
        total, buckets = 0, []
        for le, count in zip(self.les, self.counts, strict=True):
            total += count
            buckets.append((le, float(total)))
        return buckets, self.sum


@functools.cache
def _le_labels(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """The ``le`` label of each bound, as prometheus_client writes it (``1.0``, ``+Inf``)."""
    return tuple(str(floatToGoString(bound)) for bound in bounds)  # type: ignore[no-untyped-call]


class _Series:
    """What is kept for one (queue, type), from its first event on."""

    __slots__ = ("created", "lateness", "outcome_created", "outcomes", "queue_wait", "runtime")

    def __init__(self) -> None:
        self.created = time.time()
        self.runtime = _Buckets((*RUNTIME_BUCKETS, _INF))
        self.queue_wait = _Buckets((*QUEUE_WAIT_BUCKETS, _INF))
        self.lateness = _Buckets((*LATENESS_BUCKETS, _INF))
        self.outcomes: dict[str, int] = {}
        self.outcome_created: dict[str, float] = {}  # a counter's _created: its first event


#: The histograms: (family name, help, the _Series attribute).
_HISTOGRAMS = (
    (
        "ojs_job_runtime_seconds",
        "Time a handler ran one attempt of a job (started to succeeded, failed or cancelled)",
        "runtime",
    ),
    (
        "ojs_job_queue_wait_seconds",
        "Time from enqueued_at (or a later scheduled_at) to the start of a job's first attempt",
        "queue_wait",
    ),
    (
        "ojs_job_schedule_lateness_seconds",
        "Start of a scheduled job's first attempt minus its scheduled_at",
        "lateness",
    ),
)
_OUTCOMES = (
    "ojs_job_outcomes",
    "Job lifecycle events but started: succeeded, failed (per attempt), retried, dead-lettered, cancelled, expired",
)


class JobMetrics:
    """The ``ojs_job_*`` metrics (see the module docstring), recorded from job lifecycle events.

    A prometheus_client collector: the counts are kept here, under one lock, and exposed as
    counter and histogram families when the registry is collected.  A worker's main process
    records two events per job, and prometheus_client's labelled children cost a lock and a
    bucket loop per observation (measured 2-3 µs per job of a Celery prefork worker's main
    process, the one that reads, dispatches and acks every task).

    Thread-safe: events arrive from every handler thread of every subscribed worker.

    Parameters:
        registry: where the metrics are registered (default: prometheus_client's default registry).

    Raises:
        ValueError: ``registry`` has ``ojs_job_*`` metrics already.
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY):
        self._series: dict[tuple[str, str], _Series] = {}
        self._started: dict[tuple[str, str, int], datetime] = {}
        self._lock = threading.Lock()
        self._sources: weakref.WeakSet[LifecycleLike] = weakref.WeakSet()  # flushed before a scrape
        registry.register(self)

    def subscribe(self, lifecycle: LifecycleLike) -> None:
        """Record the events of ``lifecycle`` from now on (a deferred subscriber: a scrape
        first flushes what it emitted).

        Parameters:
            lifecycle: a worker's :attr:`~ojs_kombu.Worker.lifecycle`, the Dramatiq broker's, ...
        """
        self._sources.add(lifecycle)
        lifecycle.subscribe(self.record, deferred=True)

    def record(self, event: JobEvent) -> None:
        """Record one lifecycle event (a :class:`~ojs_kombu.runtime.lifecycle.Lifecycle` subscriber).

        Parameters:
            event: what happened to a job.
        """
        name = event.event
        key = (event.queue, event.job_type)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series()
            if name == "started":
                started = self._started
                started[(event.worker_id, event.job_id, event.attempt)] = event.at
                if len(started) > MAX_RUNNING:
                    del started[next(iter(started))]  # the oldest start
                if event.attempt == 1:
                    _first_start(series, event)
                return
            if name in _ENDS_RUN:
                start = self._started.pop((event.worker_id, event.job_id, event.attempt), None)
                if start is not None:  # None: ended without running (cancelled or lost before it started)
                    series.runtime.observe_between(start, event.at)
            outcomes = series.outcomes
            count = outcomes.get(name)
            if count is None:
                count = 0
                series.outcome_created[name] = time.time()
            outcomes[name] = count + 1

    def describe(self) -> list[Metric]:
        """The families this collector exposes, without samples (the registry reserves their names)."""
        return [CounterMetricFamily(*_OUTCOMES, labels=(*_LABELS, "outcome"))] + [
            HistogramMetricFamily(name, documentation, labels=_LABELS) for name, documentation, _ in _HISTOGRAMS
        ]

    def collect(self) -> Iterator[Metric]:
        """The metrics as a scrape reads them: the outcomes first, then the three histograms.

        Yields:
            ``ojs_job_outcomes`` (a counter), then ``ojs_job_runtime_seconds``,
            ``ojs_job_queue_wait_seconds`` and ``ojs_job_schedule_lateness_seconds``.
        """
        for lifecycle in list(self._sources):
            lifecycle.flush()
        with self._lock:  # one consistent snapshot: a scrape never sees an outcome without its runtime
            snapshot = [
                (
                    key,
                    series.created,
                    {name: (count, series.outcome_created[name]) for name, count in series.outcomes.items()},
                    {attr: getattr(series, attr).cumulative() for _, _, attr in _HISTOGRAMS},
                )
                for key, series in self._series.items()
            ]
        outcomes = CounterMetricFamily(*_OUTCOMES, labels=(*_LABELS, "outcome"))
        for (queue, job_type), _, counts, _ in snapshot:
            for outcome, (count, created) in counts.items():
                outcomes.add_metric((queue, job_type, outcome), count, created=created)
        yield outcomes
        for name, documentation, attr in _HISTOGRAMS:
            family = HistogramMetricFamily(name, documentation, labels=_LABELS)
            for (queue, job_type), created, _, histograms in snapshot:
                buckets, total = histograms[attr]
                family.add_metric((queue, job_type), buckets, total)
                family.samples.append(Sample(f"{name}_created", {"queue": queue, "type": job_type}, created))
            yield family


def _first_start(series: _Series, event: JobEvent) -> None:
    enqueued, scheduled = event.enqueued_at, event.scheduled_at
    ready = enqueued if scheduled is None or (enqueued is not None and enqueued > scheduled) else scheduled
    if ready is not None:
        series.queue_wait.observe_between(ready, event.at)
    if scheduled is not None:
        series.lateness.observe_between(scheduled, event.at)


#: The process-wide per job type metrics, in prometheus_client's default registry.
JOB_METRICS = JobMetrics()

__all__ = [
    "JOB_METRICS",
    "LATENESS_BUCKETS",
    "MAX_RUNNING",
    "QUEUE_WAIT_BUCKETS",
    "RUNTIME_BUCKETS",
    "JobMetrics",
    "LifecycleLike",
]
