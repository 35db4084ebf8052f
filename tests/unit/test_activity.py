"""Activity (the INFO recent-history window), JobInfo and the INFO wire helpers, without a broker."""

from __future__ import annotations

import json
import threading
import tracemalloc
from datetime import UTC, datetime, timedelta

import pytest

from ojs_kombu import JobInfo
from ojs_kombu.client import best_answer
from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import CONTROL_TYPE_INFO
from ojs_kombu.runtime.activity import Activity
from ojs_kombu.runtime.lifecycle import Lifecycle
from ojs_kombu.wire.control import (
    CONTROL_TYPE_INFO_REPLY,
    decode_control,
    decode_info_reply,
    info_message,
    info_reply,
)

FAILURE = {"code": "handler_error", "type": "ValueError", "message": "boom"}


@pytest.fixture
def hub() -> tuple[Lifecycle, Activity]:
    lifecycle = Lifecycle("host.1.abcdef")
    activity = Activity(history=3)
    lifecycle.subscribe(activity.record)
    return lifecycle, activity


def job(n: int = 0) -> Job:
    return Job.create("report.build", [n], queue="reports")


def test_a_started_job_is_active_with_its_start_time_and_worker(hub):
    lifecycle, activity = hub
    j = job()
    before = datetime.now(UTC)
    lifecycle.emit("started", j, 1)
    info = activity.lookup(j.id.upper())
    assert info is not None
    assert (info.state, info.worker_id, info.attempt, info.queue, info.type) == (
        "active",
        "host.1.abcdef",
        1,
        "reports",
        "report.build",
    )
    assert info.started_at is not None and info.started_at >= before - timedelta(milliseconds=1)
    assert info.finished_at is None
    assert activity.active() == [info]


@pytest.mark.parametrize(
    ("events", "state"),
    [
        (["started", "succeeded"], "completed"),
        (["started", "failed"], "discarded"),
        (["started", "failed", "retried"], "retryable"),
        (["started", "failed", "dead-lettered"], "discarded"),
        (["started", "cancelled"], "cancelled"),
        (["cancelled"], "cancelled"),
        (["expired"], "discarded"),
        (["failed", "retried"], "retryable"),  # a redelivery counted as a lost attempt
    ],
)
def test_events_map_to_states(hub, events, state):
    lifecycle, activity = hub
    j = job()
    for event in events:
        lifecycle.emit(event, j, 2, error=FAILURE if event == "failed" else None)
    info = activity.lookup(j.id)
    assert info is not None and info.state == state
    assert info.finished_at is not None
    assert activity.active() == []
    assert (info.started_at is not None) == ("started" in events)
    if "failed" in events:
        assert info.error == FAILURE  # kept through retried / dead-lettered


def test_a_retry_that_starts_again_is_active_again(hub):
    lifecycle, activity = hub
    j = job()
    for event, attempt in (("started", 1), ("failed", 1), ("retried", 1), ("started", 2)):
        lifecycle.emit(event, j, attempt)
    info = activity.lookup(j.id)
    assert info is not None and (info.state, info.attempt) == ("active", 2)


def test_history_is_bounded_oldest_first(hub):
    lifecycle, activity = hub
    jobs = [job(n) for n in range(5)]
    for j in jobs:
        lifecycle.emit("started", j, 1)
        lifecycle.emit("succeeded", j, 1)
    assert [activity.lookup(j.id) is not None for j in jobs] == [False, False, True, True, True]
    assert len(activity) == 3
    running = job(9)
    lifecycle.emit("started", running, 1)
    assert len(activity) == 4  # running jobs are not bounded by the history (the concurrency bounds them)


def test_a_failure_settled_later_keeps_its_times_and_error(hub):
    lifecycle, activity = hub
    j = job()
    lifecycle.emit("started", j, 1)
    lifecycle.emit("failed", j, 1, error=FAILURE)
    failed = activity.lookup(j.id)
    lifecycle.emit("dead-lettered", j, 1)
    info = activity.lookup(j.id)
    assert failed is not None and info is not None
    assert info.state == "discarded" and info.error == FAILURE
    assert (info.started_at, info.finished_at) == (failed.started_at, failed.finished_at)
    assert info.started_at is not None and info.finished_at is not None


def test_events_info_cannot_answer_with_leave_the_job_unknown(hub, caplog):
    """An adapter's unvalidated job (an empty type) makes no JobInfo: INFO and the presence
    treat it as unknown (logged), never raise."""
    lifecycle, activity = hub
    bad = Job.model_construct(id="j-bad", type="", queue="reports", args=[])
    lifecycle.emit("started", bad, 1)
    assert activity.lookup("j-bad") is None
    assert activity.active() == [] and activity.active_jobs() == []
    lifecycle.emit("succeeded", bad, 1)
    assert activity.lookup("j-bad") is None
    assert "no valid INFO answer" in caplog.text


def test_history_must_be_positive():
    with pytest.raises(ValidationError):
        Activity(history=0)


def test_concurrent_events_from_many_threads_are_all_recorded():
    lifecycle = Lifecycle("w")
    activity = Activity(history=100_000)
    lifecycle.subscribe(activity.record)
    jobs = [job(n) for n in range(8 * 500)]
    barrier = threading.Barrier(8)

    def run(chunk: list[Job]) -> None:
        barrier.wait()
        for j in chunk:
            lifecycle.emit("started", j, 1)
            activity.active()
            lifecycle.emit("succeeded", j, 1)

    threads = [threading.Thread(target=run, args=(jobs[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert activity.active() == []
    assert len(activity) == len(jobs)
    assert all(activity.lookup(j.id).state == "completed" for j in jobs)


def test_memory_per_history_entry_is_about_350_bytes():
    lifecycle = Lifecycle("host.example.4242.a1b2c3")
    activity = Activity(history=2000)
    lifecycle.subscribe(activity.record)
    jobs = [job(n) for n in range(2000)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for j in jobs:
        lifecycle.emit("started", j, 1)
        lifecycle.emit("succeeded", j, 1)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    per_entry = sum(s.size_diff for s in after.compare_to(before, "filename")) / len(jobs)
    assert 250 < per_entry < 500, per_entry  # the module docstring says ~350 bytes


# -- JobInfo and the wire ----------------------------------------------------------------------


def sample(state: str = "completed", **changes) -> JobInfo:
    fields = {
        "job_id": "0190f3a4-0000-7000-8000-000000000001",
        "queue": "reports",
        "type": "report.build",
        "state": state,
        "worker_id": "h.1.abc",
        "attempt": 1,
        "started_at": datetime(2026, 11, 24, 14, 0, tzinfo=UTC),
        "finished_at": datetime(2026, 11, 24, 14, 0, 1, 500000, tzinfo=UTC),
        "error": None,
    }
    return JobInfo(**{**fields, **changes})


def test_job_info_json_round_trip():
    info = sample("discarded", error=FAILURE)
    data = json.loads(info.to_json())
    assert data["started_at"] == "2026-11-24T14:00:00.000Z"
    assert data["finished_at"] == "2026-11-24T14:00:01.500Z"
    assert JobInfo.from_json(info.to_json()) == info
    active = sample("active", finished_at=None)
    assert json.loads(active.to_json())["finished_at"] is None
    assert JobInfo.from_dict({**active.to_dict(), "future": 1}) == active


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"job_id": "x"},
        {**sample().to_dict(), "state": "running"},
        {**sample().to_dict(), "attempt": "1"},
        {**sample().to_dict(), "started_at": "yesterday"},
        {**sample().to_dict(), "worker_id": ""},
    ],
)
def test_job_info_refuses_malformed_data(data):
    with pytest.raises(ValidationError):
        JobInfo.from_dict(data)


def test_info_message_wire():
    message = info_message(" ABC-1 ", reply_to="amq.gen-1", correlation_id="c-1")
    assert message.properties["type"] == CONTROL_TYPE_INFO == "ojs.control.info"
    assert message.properties["reply_to"] == "amq.gen-1"
    assert message.properties["correlation_id"] == "c-1"
    assert isinstance(message.properties["timestamp"], int)
    assert message.properties["content_type"] == "application/json"
    assert json.loads(message.body) == {"job_id": "abc-1"}
    decoded = decode_control(message.body, {**message.properties, "timestamp": datetime(2026, 1, 1)})
    assert (decoded.reply_to, decoded.correlation_id, decoded.job_id) == ("amq.gen-1", "c-1", "abc-1")
    assert decoded.timestamp == datetime(2026, 1, 1, tzinfo=UTC)  # py-amqp's naive UTC, made aware


@pytest.mark.parametrize(
    "kwargs",
    [
        {"job_id": "", "reply_to": "q", "correlation_id": "c"},
        {"job_id": "j", "reply_to": "", "correlation_id": "c"},
        {"job_id": "j", "reply_to": "q", "correlation_id": None},
    ],
)
def test_info_message_refuses_bad_arguments(kwargs):
    with pytest.raises(ValidationError):
        info_message(kwargs.pop("job_id"), **kwargs)


def test_info_reply_round_trip_echoes_the_correlation_id():
    info = sample()
    reply = info_reply(info, correlation_id="c-9")
    assert reply.properties["type"] == CONTROL_TYPE_INFO_REPLY == "ojs.control.info.reply"
    assert reply.properties["correlation_id"] == "c-9"
    assert reply.properties["delivery_mode"] == 1
    assert decode_info_reply(reply.body, reply.properties) == ("c-9", info)
    assert "correlation_id" not in info_reply(info, correlation_id=None).properties


def test_decode_info_reply_refuses_other_messages():
    with pytest.raises(DecodeError):
        decode_info_reply(b'{"job_id":"x"}', {"type": CONTROL_TYPE_INFO_REPLY})
    with pytest.raises(DecodeError):
        decode_info_reply(sample().to_json().encode(), {"type": "ojs.control.cancel"})


def test_best_answer_prefers_active_then_the_latest_outcome():
    old = sample("retryable", finished_at=datetime(2026, 11, 24, 14, 0, 2, tzinfo=UTC))
    new = sample("completed", finished_at=datetime(2026, 11, 24, 14, 0, 9, tzinfo=UTC))
    active = sample("active", finished_at=None)
    assert best_answer([]) is None
    assert best_answer([new, old]) is new
    assert best_answer([old, new]) is new
    assert best_answer([new, active, old]) is active


def test_an_activity_that_follows_a_lifecycle_reads_its_deferred_events_on_every_read():
    """``follow`` subscribes as a deferred subscriber: lookup, active and len flush first."""
    lifecycle = Lifecycle("host.1.abcdef")
    activity = Activity(history=3)
    activity.follow(lifecycle)
    running, done = job(1), job(2)
    lifecycle.emit("started", running, 1)
    assert [info.job_id for info in activity.active()] == [running.id]
    lifecycle.emit("started", done, 1)
    lifecycle.emit("succeeded", done, 1)
    info = activity.lookup(done.id)
    assert info is not None and info.state == "completed" and info.started_at is not None
    lifecycle.emit("succeeded", running, 1)
    assert len(activity) == 2
    info = activity.lookup(running.id)
    assert info is not None and info.state == "completed"
    assert activity.active() == []
