"""The dashboard's history aggregates and a job's story (pure: no broker, no browser)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ojs_kombu.dashboard.stats import EventHistory, Percentiles
from ojs_kombu.dashboard.story import timeline
from ojs_kombu.model.info import JobInfo
from ojs_kombu.wire.events import JobEventRecord

NOW = datetime(2026, 11, 27, 12, 30, 30, tzinfo=UTC)


def ev(event, at, job="j1", attempt=1, queue="q", error=None, enqueued=None, scheduled=None) -> JobEventRecord:
    return JobEventRecord(event, job, "t", queue, attempt, "w1", at, error, enqueued, scheduled)


class Stream:
    """The events a read returns (those at or after ``since``), and the reads made."""

    def __init__(self) -> None:
        self.events: list[JobEventRecord] = []
        self.reads: list[datetime] = []

    def __call__(self, since: datetime, limit: int) -> list[JobEventRecord]:
        self.reads.append(since)
        return [e for e in self.events if e.at >= since][:limit]


def test_a_refresh_reads_since_the_last_event_less_the_overlap_and_counts_each_event_once():
    stream = Stream()
    history = EventHistory(stream, overlap=timedelta(seconds=30), clock=lambda: NOW)
    stream.events = [ev("started", NOW - timedelta(seconds=5)), ev("succeeded", NOW - timedelta(seconds=4))]
    assert history.refresh() == 2 and history.loaded and history.load_events == 2
    assert stream.reads == [NOW - timedelta(days=7)]  # the first read: the window
    late = ev("failed", NOW - timedelta(seconds=20), job="j2")  # published late, stamped before the last one
    stream.events.append(late)
    assert history.refresh() == 1  # the two already counted are read again, not counted again
    assert stream.reads[1] == NOW - timedelta(seconds=30)  # from the previous read, less the overlap
    series = history.series()
    assert (series.total("succeeded"), series.total("failed"), len(series.starts)) == (1, 1, 60)
    assert series.counts["succeeded"][-1] == 1 and series.starts[-1] == datetime(2026, 11, 27, 12, 30, tzinfo=UTC)


def test_a_long_window_is_read_in_pages_each_from_the_last_event_of_the_one_before():
    stream = Stream()
    stream.events = [ev("succeeded", NOW - timedelta(seconds=100 - i // 2), job=f"j{i}") for i in range(10)]
    history = EventHistory(stream, page=4, clock=lambda: NOW)
    assert history.refresh() == 10 and history.series().total("succeeded") == 10
    pages = stream.reads[1:]  # each from the page before's last event less a second, never going back
    assert pages == sorted(pages) and pages[0] == stream.events[3].at - timedelta(seconds=1) and len(pages) == 4
    assert history.refresh() == 0


def test_a_page_of_one_instant_is_read_again_with_more():
    stream = Stream()
    stream.events = [ev("succeeded", NOW - timedelta(seconds=10), job=f"j{i}") for i in range(9)]
    history = EventHistory(stream, page=2, clock=lambda: NOW)
    assert history.refresh() == 9  # 2, then 4 from the same instant, then 8, then 16: all read, none twice


def test_the_series_bucket_by_minute_and_by_hour_per_queue():
    history = EventHistory(Stream(), clock=lambda: NOW)
    history.add(
        [
            ev("succeeded", NOW - timedelta(minutes=m), job=f"j{m}", queue="a" if m // 10 % 2 else "b")
            for m in range(0, 180, 10)
        ]
    )
    minute = history.series()
    assert minute.total("succeeded") == 6  # 0, 10 … 50 minutes ago: the last hour
    assert history.series("a").total("succeeded") == 3
    hour = history.series(step=3600, buckets=168)
    assert hour.total("succeeded") == 18 and len(hour.starts) == 168
    assert hour.starts[-1] == datetime(2026, 11, 27, 12, tzinfo=UTC)
    assert history.queues() == ["a", "b"]


def test_waits_count_first_attempts_and_runs_pair_a_start_with_its_end():
    history = EventHistory(Stream(), clock=lambda: NOW)
    t = NOW - timedelta(minutes=5)
    history.add([
        ev("started", t, enqueued=t - timedelta(seconds=2)),
        ev("failed", t + timedelta(seconds=1), error={"code": "x"}),
        ev("retried", t + timedelta(seconds=1)),
        ev("started", t + timedelta(seconds=10), attempt=2, enqueued=t - timedelta(seconds=2)),
        ev("succeeded", t + timedelta(seconds=13), attempt=2),
        ev("started", t, job="j2", enqueued=t - timedelta(seconds=9), scheduled=t - timedelta(seconds=1)),
    ])  # fmt: skip
    wait, run = history.timings()
    assert (wait.count, wait.p50, wait.p99) == (2, 1.0, 2.0)  # j2 waited from its scheduled time
    assert (run.count, run.p50, run.p99) == (2, 1.0, 3.0)
    assert sum(history.series().busy) == 4.0


def test_percentiles_are_nearest_rank():
    assert Percentiles.of([]) == Percentiles(0, None, None, None)
    p = Percentiles.of([float(i) for i in range(1, 101)])
    assert (p.p50, p.p90, p.p99) == (50.0, 90.0, 99.0)


def test_old_counts_are_pruned_and_stories_are_bounded():
    clock = [NOW]
    history = EventHistory(Stream(), window=timedelta(hours=2), jobs=3, clock=lambda: clock[0])
    history.add([ev("succeeded", NOW, job=f"j{i}") for i in range(5)])
    assert history.story("j0") == [] and len(history.story("j4")) == 1
    clock[0] = NOW + timedelta(hours=3)
    history.add([])
    assert history.series(step=3600, buckets=168).total("succeeded") == 0


def test_a_story_in_order_through_retries_a_dead_letter_and_a_replay():
    t = NOW
    events = [
        ev("started", t, enqueued=t - timedelta(seconds=1)),
        ev("failed", t + timedelta(seconds=1), error={"code": "boom", "message": "no"}),
        ev("retried", t + timedelta(seconds=1)),
        ev("started", t + timedelta(seconds=3), attempt=2, enqueued=t - timedelta(seconds=1)),
        ev("failed", t + timedelta(seconds=4), attempt=2, error={"code": "boom", "message": "no"}),
        ev("dead-lettered", t + timedelta(seconds=4), attempt=2),
        ev("started", t + timedelta(seconds=60), enqueued=t + timedelta(seconds=59)),
        ev("succeeded", t + timedelta(seconds=61)),
    ]
    steps = timeline(events)
    assert [(s.kind, s.attempt) for s in steps] == [
        ("enqueued", None), ("started", 1), ("failed", 1), ("retried", 1), ("started", 2), ("failed", 2),
        ("dead-lettered", 2), ("replayed", None), ("started", 1), ("succeeded", 1),
    ]  # fmt: skip
    assert steps[4].note == "2.0 s after the retry was scheduled"
    assert steps[2].error == {"code": "boom", "message": "no"}


def test_info_adds_what_no_event_says():
    info = JobInfo(job_id="j1", queue="q", type="t", state="active", worker_id="w2", attempt=1, started_at=NOW,
                   finished_at=None, error=None)  # fmt: skip
    steps = timeline([], info=info)
    assert [(s.kind, s.worker, s.source) for s in steps] == [("started", "w2", "info")]
    assert timeline([ev("started", NOW)], info=info)[0].source == "event"  # the event says it already


def test_stamps_out_of_stream_order_are_counted_once_across_pages_and_refreshes():
    stream = Stream()
    order = [0, 2, 1, 3, 5, 4, 6, 8, 7, 9, 11, 10]  # events a little (< 1 s) out of order
    stream.events = [ev("succeeded", NOW - timedelta(seconds=(24 - s) / 2), job=f"j{s}") for s in order]
    clock = [NOW]
    history = EventHistory(stream, page=3, overlap=timedelta(seconds=2), clock=lambda: clock[0])
    assert history.refresh() == 12
    clock[0] = NOW + timedelta(seconds=1)
    stream.events.append(ev("succeeded", NOW + timedelta(milliseconds=500), job="late"))
    assert history.refresh() == 1  # the last 2 s read again, counted once
    assert history.series().total("succeeded") == 13


def test_scheduled_jobs_come_due_by_their_cascade_level():
    from ojs_kombu.dashboard.overview import Snapshot

    levels: list[int | None] = [0] * 35
    levels[3], levels[15], levels[16], levels[21], levels[26], levels[30] = 1, 2, 3, 4, 5, 6
    shot = Snapshot([], 21, True, levels=levels)  # level k: less than 2**(k+1) ms left
    assert shot.coming_due() == [("1 min", 1), ("1 h", 2 + 3), ("1 day", 4), ("later", 5 + 6)]  # 2**22 ms > 1 h
    assert Snapshot([], None, False, levels=[None, None]).coming_due() == []
