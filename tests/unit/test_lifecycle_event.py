"""``Lifecycle.emit`` builds the same immutable :class:`JobEvent` its constructor builds (pure logic)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ojs_kombu.model.job import Job
from ojs_kombu.runtime.lifecycle import JobEvent, Lifecycle, _new_event


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
