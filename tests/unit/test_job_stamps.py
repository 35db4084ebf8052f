"""Job.create's created_at / enqueued_at come from a per-millisecond cache that must equal formatting now."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ojs_kombu import Job
from ojs_kombu.model import job_create
from ojs_kombu.model.timefmt import _format_ts


@pytest.mark.parametrize(
    ("time_ns", "expected"),
    [
        (1_700_000_000_999_999_999, "2023-11-14T22:13:20.999Z"),  # truncated, never rounded up
        (1_700_000_001_000_000_000, "2023-11-14T22:13:21.000Z"),
        (1_000_000, "1970-01-01T00:00:00.001Z"),
    ],
)
def test_the_stamp_of_a_nanosecond_clock(monkeypatch: pytest.MonkeyPatch, time_ns: int, expected: str) -> None:
    monkeypatch.setattr(job_create.time, "time_ns", lambda: time_ns)
    assert job_create._Stamps().now() == expected


def test_created_jobs_carry_the_current_millisecond() -> None:
    before = _format_ts(datetime.now(UTC))
    job = Job.create("a.b", [1])
    after = _format_ts(datetime.now(UTC))
    assert job.created_at is not None and before <= job.created_at <= after
    assert job.enqueued_at == job.created_at


def test_a_relative_schedule_and_created_at_share_one_moment() -> None:
    from datetime import timedelta

    job = Job.create("a.b", [1], scheduled_at=timedelta(seconds=10))
    assert job.scheduled_datetime is not None and job.created_datetime is not None
    assert (
        timedelta(seconds=10) <= job.scheduled_datetime - job.created_datetime < timedelta(seconds=10, milliseconds=2)
    )
