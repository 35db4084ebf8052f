"""The per job type metrics (``ojs_job_*``) recorded from lifecycle events, on a registry of their own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, Histogram

from ojs_kombu.model.job import Job
from ojs_kombu.observability import job_metrics
from ojs_kombu.observability.job_metrics import JobMetrics
from ojs_kombu.runtime.lifecycle import JobEvent, JobEventName, Lifecycle

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
LABELS = {"queue": "email", "type": "email.send"}


def event(
    name: JobEventName,
    seconds: float,
    *,
    job_id: str = "j1",
    attempt: int = 1,
    enqueued: float | None = 0.0,
    scheduled: float | None = None,
) -> JobEvent:
    """An event ``seconds`` after T0 for a job enqueued (and scheduled) at those offsets from T0."""
    return JobEvent(
        name,
        job_id,
        "email.send",
        "email",
        attempt,
        "w1",
        at=T0 + timedelta(seconds=seconds),
        enqueued_at=None if enqueued is None else T0 + timedelta(seconds=enqueued),
        scheduled_at=None if scheduled is None else T0 + timedelta(seconds=scheduled),
    )


@pytest.fixture
def metrics() -> tuple[JobMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    return JobMetrics(registry), registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {**LABELS, **labels})


def test_runtime_is_observed_per_attempt_from_start_to_its_end(metrics: tuple[JobMetrics, CollectorRegistry]) -> None:
    recorder, registry = metrics
    recorder.record(event("started", 1.0))
    recorder.record(event("failed", 1.5))
    recorder.record(event("retried", 1.6))
    recorder.record(event("started", 3.0, attempt=2))
    recorder.record(event("succeeded", 5.0, attempt=2))

    assert sample(registry, "ojs_job_runtime_seconds_count") == 2
    assert sample(registry, "ojs_job_runtime_seconds_sum") == pytest.approx(2.5)
    assert sample(registry, "ojs_job_runtime_seconds_bucket", le="0.5") == 1
    assert sample(registry, "ojs_job_runtime_seconds_bucket", le="1.0") == 1
    assert sample(registry, "ojs_job_runtime_seconds_bucket", le="2.5") == 2


def test_outcomes_count_every_event_but_started(metrics: tuple[JobMetrics, CollectorRegistry]) -> None:
    recorder, registry = metrics
    for name, seconds in (("started", 1), ("failed", 2), ("retried", 2), ("started", 3), ("failed", 4)):
        recorder.record(event(name, seconds, attempt=1 if seconds < 3 else 2))  # type: ignore[arg-type]
    recorder.record(event("dead-lettered", 4, attempt=2))
    recorder.record(event("succeeded", 9, job_id="j2"))  # never seen starting: counted, no runtime
    recorder.record(event("expired", 9, job_id="j3"))
    recorder.record(event("cancelled", 9, job_id="j4"))

    counts = {
        outcome: sample(registry, "ojs_job_outcomes_total", outcome=outcome)
        for outcome in ("succeeded", "failed", "retried", "dead-lettered", "cancelled", "expired", "started")
    }
    assert counts == {
        "succeeded": 1,
        "failed": 2,
        "retried": 1,
        "dead-lettered": 1,
        "cancelled": 1,
        "expired": 1,
        "started": None,
    }
    assert sample(registry, "ojs_job_runtime_seconds_count") == 2  # the two failed attempts only


def test_queue_wait_runs_from_enqueued_at_to_the_first_start(metrics: tuple[JobMetrics, CollectorRegistry]) -> None:
    recorder, registry = metrics
    recorder.record(event("started", 0.2, enqueued=0.0))
    recorder.record(event("failed", 0.3))
    recorder.record(event("started", 30.0, attempt=2, enqueued=0.0))  # a retry: its wait is the back-off

    assert sample(registry, "ojs_job_queue_wait_seconds_count") == 1
    assert sample(registry, "ojs_job_queue_wait_seconds_sum") == pytest.approx(0.2)
    assert sample(registry, "ojs_job_schedule_lateness_seconds_count") == 0  # not a scheduled job


def test_a_scheduled_job_waits_from_scheduled_at_and_its_lateness_is_recorded(
    metrics: tuple[JobMetrics, CollectorRegistry],
) -> None:
    recorder, registry = metrics
    recorder.record(event("started", 60.04, enqueued=0.0, scheduled=60.0))

    assert sample(registry, "ojs_job_queue_wait_seconds_sum") == pytest.approx(0.04)
    assert sample(registry, "ojs_job_schedule_lateness_seconds_count") == 1
    assert sample(registry, "ojs_job_schedule_lateness_seconds_sum") == pytest.approx(0.04)
    assert sample(registry, "ojs_job_schedule_lateness_seconds_bucket", le="0.025") == 0
    assert sample(registry, "ojs_job_schedule_lateness_seconds_bucket", le="0.05") == 1


def test_a_producer_clock_ahead_of_the_worker_records_zero_never_negative(
    metrics: tuple[JobMetrics, CollectorRegistry],
) -> None:
    recorder, registry = metrics
    recorder.record(event("started", 1.0, enqueued=3.0, scheduled=2.0))

    assert sample(registry, "ojs_job_queue_wait_seconds_sum") == 0
    assert sample(registry, "ojs_job_schedule_lateness_seconds_sum") == 0


def test_starts_without_an_end_are_bounded(
    metrics: tuple[JobMetrics, CollectorRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder, registry = metrics
    monkeypatch.setattr(job_metrics, "MAX_RUNNING", 3)
    for index in range(5):
        recorder.record(event("started", index, job_id=f"j{index}"))
    for index in range(5):
        recorder.record(event("succeeded", 10, job_id=f"j{index}"))

    assert sample(registry, "ojs_job_runtime_seconds_count") == 3  # the oldest two starts were forgotten
    assert sample(registry, "ojs_job_runtime_seconds_sum") == pytest.approx(8 + 7 + 6)


def test_a_lifecycle_carries_enqueued_at_and_scheduled_at_to_the_metrics() -> None:
    registry = CollectorRegistry()
    recorder = JobMetrics(registry)
    lifecycle = Lifecycle("w1")
    recorder.subscribe(lifecycle)
    seen: list[JobEvent] = []
    lifecycle.subscribe(seen.append, deferred=True)
    job = Job.create("email.send", [], queue="email", scheduled_at=timedelta(seconds=-2))

    emitted = lifecycle.emit("started", job, 1)

    assert emitted is None  # only deferred subscribers: nothing is built until a flush
    assert sample(registry, "ojs_job_schedule_lateness_seconds_count") == 1  # a scrape flushes
    assert len(seen) == 1
    assert seen[0].enqueued_at == job.enqueued_datetime
    assert seen[0].scheduled_at == job.scheduled_datetime
    lateness = sample(registry, "ojs_job_schedule_lateness_seconds_sum")
    assert lateness is not None and 1.9 <= lateness < 60.0  # scheduled_at is rounded up to the ms


def test_a_malformed_timestamp_of_an_unvalidated_job_never_fails_the_event() -> None:
    """Adapters build jobs with ``Job.model_construct`` (no validation): the event still goes out."""
    seen: list[JobEvent] = []
    lifecycle = Lifecycle("w1")
    lifecycle.subscribe(seen.append)
    job = Job.model_construct(id="j1", type="email.send", queue="email", args=[], enqueued_at="yesterday")

    lifecycle.emit("started", job, 1)

    assert [(e.event, e.enqueued_at, e.scheduled_at) for e in seen] == [("started", None, None)]


def test_only_a_started_event_carries_the_jobs_moments() -> None:
    """Queue wait and lateness are measured at the start: the other events skip parsing them."""
    seen: list[JobEvent] = []
    lifecycle = Lifecycle("w1")
    lifecycle.subscribe(seen.append)
    job = Job.create("email.send", [], queue="email", scheduled_at=timedelta(seconds=-2))

    for name in ("started", "succeeded"):
        lifecycle.emit(name, job, 1)

    assert [(e.event, e.enqueued_at is not None, e.scheduled_at is not None) for e in seen] == [
        ("started", True, True),
        ("succeeded", False, False),
    ]


def test_a_scrape_collects_the_outcomes_before_the_runtimes(metrics: tuple[JobMetrics, CollectorRegistry]) -> None:
    """record() observes a run's runtime, then counts its outcome: collected in the other order, a
    scrape that sees the outcome sees the runtime too (a run may end between two families' reads)."""
    _, registry = metrics
    families = [family.name for family in registry.collect()]
    assert families.index("ojs_job_outcomes") < families.index("ojs_job_runtime_seconds")


def test_the_histograms_expose_what_prometheus_clients_own_histogram_would(
    metrics: tuple[JobMetrics, CollectorRegistry],
) -> None:
    """JobMetrics keeps its own buckets (one lock per event): the exposed samples are the same."""
    recorder, registry = metrics
    reference = CollectorRegistry()
    histogram = Histogram("ref_runtime_seconds", "reference", buckets=job_metrics.RUNTIME_BUCKETS, registry=reference)
    runtimes = [0.0, 0.005, 0.0051, 0.3, 1, 2.5, 59.9, 3600, 7200]  # on, between and beyond the bounds
    for index, seconds in enumerate(runtimes):
        recorder.record(event("started", 0, job_id=f"j{index}"))
        recorder.record(event("succeeded", seconds, job_id=f"j{index}"))
        histogram.observe(seconds)

    def samples(registry: CollectorRegistry, family: str, prefix: str) -> dict[tuple[str, str | None], float]:
        return {
            (sample.name.removeprefix(prefix), sample.labels.get("le")): sample.value
            for collected in registry.collect()
            if collected.name == family
            for sample in collected.samples
            if not sample.name.endswith("_created")
        }

    ours = samples(registry, "ojs_job_runtime_seconds", "ojs_job_")
    assert len(ours) == len(job_metrics.RUNTIME_BUCKETS) + 3  # the buckets, +Inf, _sum and _count
    assert ours == samples(reference, "ref_runtime_seconds", "ref_")


def test_a_registry_holds_one_job_metrics() -> None:
    registry = CollectorRegistry()
    JobMetrics(registry)
    with pytest.raises(ValueError, match="ojs_job_"):
        JobMetrics(registry)
