"""``Lifecycle.emit`` builds the same immutable :class:`JobEvent` its constructor builds (pure logic)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from ojs_kombu.model.job import Job
from ojs_kombu.runtime.lifecycle import MAX_DEFERRED, JobEvent, Lifecycle, _new_event


def test_the_direct_build_is_the_constructed_event_field_for_field():
    at = datetime(2026, 1, 1, tzinfo=UTC)
    values = ("failed", "id", "a.b", "q", 2, "w", at, {"code": "x"}, at, None)
    built = _new_event(*values)  # type: ignore[arg-type]
    expected = JobEvent(*values)  # type: ignore[arg-type]
    assert built == expected
    assert hash(_new_event(*values[:7], None, at, at)) == hash(JobEvent(*values[:7], None, at, at))  # type: ignore[arg-type]
    assert type(built) is JobEvent
    assert [getattr(built, name) for name in JobEvent._fields] == list(values)
    with pytest.raises(AttributeError):
        built.attempt = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        built.extra = 1  # type: ignore[attr-defined]  # no __dict__: a tuple's fields only


def test_a_constructed_event_defaults_at_to_now_and_the_optional_fields_to_none():
    before = datetime.now(UTC)
    event = JobEvent("started", "id", "a.b", "q", 1, "w")
    assert before <= event.at <= datetime.now(UTC)
    assert (event.error, event.enqueued_at, event.scheduled_at) == (None, None, None)


def test_emitted_events_carry_every_field():
    job = Job.create("a.b", [1], queue="q", scheduled_at="2026-01-01T00:00:00.000Z")
    lifecycle = Lifecycle("w1")
    seen: list[JobEvent] = []
    lifecycle.subscribe(seen.append)
    before = datetime.now(UTC)
    started = lifecycle.emit("started", job, 1)
    failed = lifecycle.emit("failed", job, 1, error={"code": "boom"})
    assert seen == [started, failed]
    assert started == JobEvent(
        "started",
        job.id,
        "a.b",
        "q",
        1,
        "w1",
        at=started.at,
        enqueued_at=job.enqueued_datetime,
        scheduled_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert failed == JobEvent("failed", job.id, "a.b", "q", 1, "w1", at=failed.at, error={"code": "boom"})
    assert before <= started.at <= failed.at <= datetime.now(UTC)


def test_a_deferred_subscriber_gets_the_events_an_immediate_one_gets_in_order_at_a_flush():
    """With an immediate subscriber, deferred ones get the very same events; without one, a flush
    builds them from what emit queued, with the time of the emit (not of the flush)."""
    job = Job.create("a.b", [1], queue="q", scheduled_at="2026-01-01T00:00:00.000Z")
    both, alone = Lifecycle("w1"), Lifecycle("w1")
    immediate: list[JobEvent] = []
    deferred: list[JobEvent] = []
    deferred_alone: list[JobEvent] = []
    both.subscribe(immediate.append)
    both.subscribe(deferred.append, deferred=True)
    alone.subscribe(deferred_alone.append, deferred=True)
    steps = [("started", 1, None), ("failed", 1, {"code": "boom"}), ("retried", 1, None), ("started", 2, None)]
    before = datetime.now(UTC)
    for name, attempt, error in steps:
        both.emit(name, job, attempt, error=error)  # type: ignore[arg-type]
        assert alone.emit(name, job, attempt, error=error) is None  # type: ignore[arg-type]
    emitted = datetime.now(UTC)
    assert deferred == [] and deferred_alone == []  # nothing until a flush
    both.flush()
    alone.flush()
    assert all(a is b for a, b in zip(deferred, immediate, strict=True)) and len(deferred) == len(steps)
    assert [e._replace(at=None) for e in deferred_alone] == [e._replace(at=None) for e in immediate]
    assert all(before <= e.at <= emitted for e in deferred_alone)  # stamped when emitted
    alone.flush()
    assert len(deferred_alone) == len(steps)  # a second flush delivers nothing twice


def test_deferred_events_flush_by_themselves_past_the_bound():
    lifecycle = Lifecycle("w1")
    seen: list[JobEvent] = []
    lifecycle.subscribe(seen.append, deferred=True)
    job = Job.create("a.b", [], queue="q")
    for _ in range(MAX_DEFERRED - 1):
        lifecycle.emit("started", job, 1)
    assert seen == []
    lifecycle.emit("succeeded", job, 1)
    assert len(seen) == MAX_DEFERRED and seen[-1].event == "succeeded"


def test_a_failing_deferred_subscriber_does_not_stop_the_others():
    lifecycle = Lifecycle("w1")
    seen: list[str] = []

    def broken(event: JobEvent) -> None:
        raise RuntimeError("subscriber bug")

    lifecycle.subscribe(broken, deferred=True)
    lifecycle.subscribe(lambda e: seen.append(e.event), deferred=True)
    job = Job.create("a.b", [], queue="q")
    lifecycle.emit("started", job, 1)
    lifecycle.emit("succeeded", job, 1)
    lifecycle.flush()
    assert seen == ["started", "succeeded"]


def test_events_emitted_from_many_threads_all_reach_a_deferred_subscriber_once():
    lifecycle = Lifecycle("w1")
    seen: list[JobEvent] = []
    lifecycle.subscribe(seen.append, deferred=True)
    jobs = [Job.create("a.b", [n], queue="q") for n in range(8)]

    def run(job: Job) -> None:
        for attempt in range(1, 501):
            lifecycle.emit("started", job, attempt)
            if attempt % 50 == 0:
                lifecycle.flush()  # flushes race with the other threads' emits

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lifecycle.flush()
    assert len(seen) == 8 * 500
    for job in jobs:  # each thread's events in the order it emitted them
        assert [e.attempt for e in seen if e.job_id == job.id] == list(range(1, 501))
