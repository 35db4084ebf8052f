"""The dashboard's history: job events read from the events stream, aggregated in memory.

The broker keeps the history (the events stream ``ojs.stream.events``, retention set by
:class:`~ojs_kombu.wire.events.EventsOptions`), so nothing is lost when the dashboard restarts and
no database is needed: at start, :meth:`EventHistory.refresh` reads the stream's window (at most
:attr:`EventHistory.window`, a week by default; the stream keeps an hour unless configured longer),
then each refresh reads only what came since the previous read began (less an
:attr:`~EventHistory.overlap`: for a clock apart and an event a worker published late; an event read
twice is counted once, by its identity).  A stream is read from a time by where the broker wrote it,
and ``Client.events`` keeps the events stamped at or after that time: an event published more than the
overlap after it happened is not counted (a worker's events leave within a second).  What is kept:

* per queue and event (``succeeded``, ``failed``, ``retried``, ``dead-lettered``), the count per minute
  over the window: the per minute chart of the last hour and the per hour one of the week;
* the queue wait (a first attempt's ``started`` less the job's ``enqueued_at``, or ``scheduled_at`` when
  later: as :class:`~ojs_kombu.observability.job_metrics.JobMetrics` measures it) and the
  run time (``succeeded`` / ``failed`` less the same attempt's ``started``) of the last hour: their
  percentiles; the handler seconds finished per minute (the workers' utilisation);
* the events of the last :attr:`~EventHistory.jobs` jobs seen: each job's timeline.

Workers publish job events only when opted in (``Worker(events=True)``); without them the charts stay
empty and a job's timeline has only what its dead letter and INFO say.  Pure apart from the ``read``
callable given (``Client.events``): tested without a broker.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ojs_kombu.model.timefmt import utcnow
from ojs_kombu.wire.events import JobEventRecord

#: The events charted, in the order they stack, and what a chart calls them.
CHARTED: tuple[str, ...] = ("succeeded", "retried", "failed", "dead-lettered")
LABELS: dict[str, str] = {
    "succeeded": "completed",
    "retried": "retried",
    "failed": "failed",
    "dead-lettered": "dead-lettered",
}

#: How far before the last event of a full page the next page of a read starts.
PAGE_OVERLAP = timedelta(seconds=1)

_Key = tuple[str, str, int, str, datetime]  # event, job id, attempt, worker id, at


def _minute(at: datetime) -> int:
    return int(at.timestamp()) // 60


@dataclass(frozen=True)
class Series:
    """Counts per time bucket, oldest first.

    Parameters:
        step: seconds per bucket (60 or 3600).
        starts: each bucket's start (UTC).
        counts: per charted event (:data:`CHARTED`), its count in each bucket.
        busy: handler seconds finished in each bucket.
    """

    step: int
    starts: list[datetime]
    counts: dict[str, list[int]]
    busy: list[float] = field(default_factory=list)

    def total(self, event: str) -> int:
        """The count of ``event`` over the whole series."""
        return sum(self.counts.get(event, ()))

    def peak(self) -> int:
        """The highest bucket (all events stacked); 0 when empty."""
        return max((sum(c[i] for c in self.counts.values()) for i in range(len(self.starts))), default=0)


@dataclass(frozen=True)
class Percentiles:
    """Percentiles of some durations in seconds (None when there are no samples).

    Parameters:
        count: the samples.
        p50, p90, p99: the nearest-rank percentiles.
    """

    count: int
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        """The percentiles of ``values``."""
        ordered = sorted(values)
        if not ordered:
            return cls(0, None, None, None)

        def rank(p: float) -> float:
            return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * p / 100) - 1))]

        return cls(len(ordered), rank(50), rank(90), rank(99))


class EventHistory:
    """Job events from the events stream, aggregated (see the module docstring); thread-safe.

    Parameters:
        read: ``read(since, limit)`` returns at most ``limit`` job events at or after the aware datetime
            ``since``, oldest first (``Client.events``).
        window: how far back the first read goes (and how long counts are kept).
        overlap: how far before the previous read's start each later read starts.
        jobs: jobs whose events are kept for their timeline (the least recently seen are forgotten).
        page: events per read (a read returning as many is followed by one from its last event's time,
            less :data:`PAGE_OVERLAP`): what bounds the memory of reading a long window.
        clock: the present (tests).
    """

    def __init__(
        self,
        read: Callable[[datetime, int], list[JobEventRecord]],
        *,
        window: timedelta = timedelta(days=7),
        overlap: timedelta = timedelta(seconds=5),
        jobs: int = 20_000,
        page: int = 50_000,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.window = window
        self.overlap = overlap
        self.jobs = jobs
        self.page = page
        self._read = read
        self._clock = clock
        self._lock = threading.Lock()
        self._reading = threading.Lock()
        self._counts: dict[tuple[str, str], Counter[int]] = {}
        self._busy: dict[str, defaultdict[int, float]] = {}
        self._seen: set[_Key] = set()
        self._started: OrderedDict[tuple[str, int], JobEventRecord] = OrderedDict()
        self._waits: deque[tuple[datetime, str, float]] = deque()
        self._runs: deque[tuple[datetime, str, float]] = deque()
        self._stories: OrderedDict[str, list[JobEventRecord]] = OrderedDict()
        self._last: datetime | None = None
        self._read_at: datetime | None = None
        #: Whether the first read (the window) is done.
        self.loaded = False
        #: Seconds the first read took, and the events it read.
        self.load_seconds: float | None = None
        self.load_events = 0
        #: The text of the last read's error ("" when it succeeded): the page shows it, redacted.
        self.error = ""

    # -- reading ---------------------------------------------------------------------------------

    def refresh(self) -> int:
        """Read the events since the previous read (the whole window the first time) and add them.

        Returns:
            The events added (those read again within the overlap are not counted twice).

        Raises:
            OjsError: the read failed (``error`` says so too; the next refresh tries again).
        """
        with self._reading:
            first = self._read_at is None
            now = self._clock()
            since = now - self.window if self._read_at is None else self._read_at - self.overlap
            began, added, limit = time.monotonic(), 0, self.page
            while True:
                try:
                    events = self._read(since, limit)
                except Exception as exc:
                    self.error = f"{type(exc).__name__}: {exc}"
                    raise
                full = len(events) >= limit
                with self._lock:
                    added += sum(self._add(event) for event in events)
                    if full:  # the next page: from this one's last event, less a second (stamps a little out of order)
                        start = max(since, events[-1].at - PAGE_OVERLAP)
                        limit = limit * 2 if start <= since else self.page  # no progress: a larger page
                        since = start
                    # what a later read may return again: at or after its start (Client.events keeps those)
                    self._forget(min(since, now - self.overlap) if full else now - self.overlap)
                    self._prune(now)
                if not full:
                    break
            self.error = ""
            self._read_at = now
            if first:
                self.load_seconds, self.load_events, self.loaded = time.monotonic() - began, added, True
            return added

    def add(self, events: Iterable[JobEventRecord]) -> int:
        """Add ``events`` as a read would (tests, and a caller that has them already).

        Returns:
            The events added.
        """
        now = self._clock()
        with self._lock:
            added = sum(self._add(event) for event in events)
            self._prune(now)
        return added

    def _add(self, event: JobEventRecord) -> bool:
        key = (event.event, event.job_id, event.attempt, event.worker_id, event.at)
        if key in self._seen:
            return False
        self._seen.add(key)
        if self._last is None or event.at > self._last:
            self._last = event.at
        minute = _minute(event.at)
        if event.event in CHARTED:
            self._counts.setdefault((event.queue, event.event), Counter())[minute] += 1
        if event.event == "started":
            self._started[(event.job_id, event.attempt)] = event
            while len(self._started) > self.jobs:
                self._started.popitem(last=False)
            due = max((t for t in (event.enqueued_at, event.scheduled_at) if t is not None), default=None)
            if due is not None and event.attempt == 1:  # a retry's wait includes the earlier runs
                self._waits.append((event.at, event.queue, max(0.0, (event.at - due).total_seconds())))
        elif event.event in ("succeeded", "failed"):
            started = self._started.pop((event.job_id, event.attempt), None)
            if started is not None:
                seconds = max(0.0, (event.at - started.at).total_seconds())
                self._runs.append((event.at, event.queue, seconds))
                self._busy.setdefault(event.queue, defaultdict(float))[minute] += seconds
        job_id = event.job_id.lower()
        story = self._stories.pop(job_id, None) or []
        story.append(event)
        self._stories[job_id] = story
        while len(self._stories) > self.jobs:
            self._stories.popitem(last=False)
        return True

    def _prune(self, now: datetime) -> None:
        oldest = _minute(now - self.window)
        for counts in self._counts.values():
            for minute in [m for m in counts if m < oldest]:
                del counts[minute]
        for busy in self._busy.values():
            for minute in [m for m in busy if m < oldest]:
                del busy[minute]
        hour_ago = now - timedelta(hours=1)
        for samples in (self._waits, self._runs):
            while samples and samples[0][0] < hour_ago:
                samples.popleft()

    def _forget(self, floor: datetime) -> None:
        """Forget the identities of the events before ``floor``: no later read returns them."""
        self._seen = {key for key in self._seen if key[4] >= floor}

    # -- what the pages read ---------------------------------------------------------------------

    def series(self, queue: str | None = None, *, step: int = 60, buckets: int = 60) -> Series:
        """The counts of the last ``buckets`` buckets of ``step`` seconds, the current one last.

        Parameters:
            queue: one OJS queue, or None for all of them.
            step: 60 (per minute) or 3600 (per hour), any multiple of 60.
            buckets: how many.

        Returns:
            The series.
        """
        per = step // 60
        last = _minute(self._clock()) // per
        first = last - buckets + 1
        counts = {event: [0] * buckets for event in CHARTED}
        busy = [0.0] * buckets
        with self._lock:
            for (q, event), minutes in self._counts.items():
                if queue in (None, q):
                    row = counts[event]
                    for minute, n in minutes.items():
                        if first <= minute // per <= last:
                            row[minute // per - first] += n
            for q, seconds in self._busy.items():
                if queue in (None, q):
                    for minute, s in seconds.items():
                        if first <= minute // per <= last:
                            busy[minute // per - first] += s
        starts = [datetime.fromtimestamp((first + i) * step, UTC) for i in range(buckets)]
        return Series(step, starts, counts, busy)

    def timings(self, queue: str | None = None) -> tuple[Percentiles, Percentiles]:
        """The queue wait and run time percentiles of the last hour.

        Parameters:
            queue: one OJS queue, or None for all of them.

        Returns:
            ``(wait, run)``.
        """
        with self._lock:
            waits = [s for _, q, s in self._waits if queue in (None, q)]
            runs = [s for _, q, s in self._runs if queue in (None, q)]
        return Percentiles.of(waits), Percentiles.of(runs)

    def queues(self) -> list[str]:
        """The queues with events in the window, sorted."""
        with self._lock:
            return sorted({q for q, _ in self._counts} | set(self._busy))

    def story(self, job_id: str) -> list[JobEventRecord]:
        """The events kept of ``job_id``, in the order they happened (empty when none)."""
        with self._lock:
            events = list(self._stories.get(job_id.lower(), ()))
        return sorted(events, key=lambda e: e.at)

    @property
    def last(self) -> datetime | None:
        """The time of the newest event seen, or None."""
        return self._last


__all__ = ["CHARTED", "LABELS", "EventHistory", "Percentiles", "Series"]
