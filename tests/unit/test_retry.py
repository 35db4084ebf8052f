"""Retry decisions, the delay ladder and the failure record (DESIGN §5, §7), without a broker."""

from datetime import UTC, datetime, timedelta

import pytest

from ojs_kombu import DeadLetter, Discard, Job, RetryPolicy
from ojs_kombu.model.timefmt import parse_timestamp
from ojs_kombu.policy.retry import Failure, Outcome, decide, error_names, ladder_ms, ladder_ms_until, record_failure
from tools.schema import validate_job


class AuthTokenExpired(Exception):
    pass


def job(**retry) -> Job:
    return Job.create("a.b", [1], retry=RetryPolicy(**retry) if retry else None)


@pytest.mark.parametrize(
    "delay,expected",
    [
        (0, 1),
        (1, 1),
        (1.2, 2),
        (999, 1000),
        (1000, 1000),
        (1001, 1200),
        (1999, 2000),
        (2000, 2000),
        (2600, 3000),
        (7000, 8000),
        (9000, 10000),
        (300_000, 300_000),
        (300_001, 400_000),
    ],
)
def test_ladder_rounds_up(delay, expected):
    assert ladder_ms(delay) == expected


def test_ladder_is_never_early_and_at_most_a_third_late():
    for delay in range(1, 200_000, 7):
        step = ladder_ms(delay)
        assert delay <= step <= delay * 4 / 3 + 1


def test_ladder_keeps_the_retry_queue_count_bounded():
    steps = {ladder_ms(d) for d in range(1, 300_001)}
    assert len(steps) <= 60


@pytest.mark.parametrize("countdown", [1, 2, 5, 60])
@pytest.mark.parametrize("micros", [0, 1, 250, 999])
@pytest.mark.parametrize("elapsed_us", [0, 100, 900])
def test_a_countdown_rounded_up_to_the_millisecond_keeps_its_ladder_step(countdown, micros, elapsed_us):
    """Celery's ``retry(countdown=1)``: an ETA in microseconds, written to ``scheduled_at`` rounded up to
    the millisecond, published a little later: the 1 s queue, not the next step (1.2 s) for the up to
    1 ms that rounding added (it took 1.2 s when the publish came within that millisecond)."""
    moment = datetime(2026, 11, 27, 8, 0, 0, 123000 + micros, tzinfo=UTC)
    scheduled = parse_timestamp(Job.create("a.b", [], scheduled_at=moment + timedelta(seconds=countdown)).scheduled_at)
    assert scheduled >= moment + timedelta(seconds=countdown)  # never early
    assert ladder_ms_until(scheduled, moment + timedelta(microseconds=elapsed_us)) == countdown * 1000


def test_ladder_step_until_is_at_most_a_millisecond_short_and_never_a_step_too_far():
    now = datetime(2026, 11, 27, 8, 0, tzinfo=UTC)
    for delay_us in range(0, 400_000, 997):
        step = ladder_ms_until(now + timedelta(microseconds=delay_us), now)
        assert delay_us / 1000 - 1 <= step <= ladder_ms(delay_us / 1000)  # ≤ 1 ms short, never a step further
    assert ladder_ms_until(now - timedelta(seconds=1), now) == 1  # passed: the shortest queue


def test_exponential_retries_then_default_terminal_is_dead_letter():
    j = job(max_attempts=3, initial_interval="PT1S", backoff_coefficient=2.0, jitter=False)
    assert decide(j, 1, ValueError()).delay_ms == 1000
    assert decide(j, 2, ValueError()).delay_ms == 2000
    assert decide(j, 3, ValueError()).outcome is Outcome.DEAD_LETTER


def test_explicit_discard_on_exhaustion():
    j = job(max_attempts=1, on_exhaustion="discard")
    assert decide(j, 1, ValueError()).outcome is Outcome.DISCARD


def test_no_policy_means_three_attempts():
    j = Job.create("a.b", [])
    assert decide(j, 2, ValueError()).outcome is Outcome.RETRY
    assert decide(j, 3, ValueError()).outcome is Outcome.DEAD_LETTER


def test_non_retryable_exact_and_prefix():
    j = job(max_attempts=5, non_retryable_errors=["ValueError", "test_retry.*"])
    assert decide(j, 1, ValueError()).outcome is Outcome.DEAD_LETTER
    assert decide(j, 1, AuthTokenExpired()).outcome is Outcome.DEAD_LETTER  # test_retry.AuthTokenExpired
    assert decide(j, 1, KeyError()).outcome is Outcome.RETRY


def test_base_class_names_cover_subclasses():
    assert "LookupError" in error_names(KeyError())


def test_handler_codes_override_the_policy():
    j = job(max_attempts=5)
    assert decide(j, 1, Discard()).outcome is Outcome.DISCARD
    assert decide(j, 1, DeadLetter()).outcome is Outcome.DEAD_LETTER


def test_worker_lost_is_a_failed_attempt():
    j = job(max_attempts=2, jitter=False)
    assert decide(j, 1, error_type="worker_lost").outcome is Outcome.RETRY
    assert decide(j, 2, error_type="worker_lost").outcome is Outcome.DEAD_LETTER


def test_record_failure_keeps_the_envelope_valid_and_counts():
    j = job(max_attempts=5)
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        failure = Failure.from_exception(exc)
    once = record_failure(j, 1, failure)
    twice = record_failure(once, 2, failure)
    assert twice.attempt == 2
    assert [e["attempt"] for e in twice.errors] == [1, 2]
    assert twice.error.type == "RuntimeError" and twice.error.message == "boom"
    validate_job(twice.to_dict())
    assert Job.from_json(twice.to_json()) == twice
