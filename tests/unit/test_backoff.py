"""Unit tests of ojs_kombu.policy.backoff: the OJS retry formula and the reconnect back-off."""

from __future__ import annotations

import random

import pytest

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.policies import RetryPolicy
from ojs_kombu.policy.backoff import reconnect_delay, retry_delay


def policy(**fields) -> RetryPolicy:
    return RetryPolicy(**{"jitter": False, **fields})


# --------------------------------------------------------------------------- conformance cases


def test_exponential_defaults_wait_1s_then_2s():
    p = policy(initial_interval="PT1S", backoff_coefficient=2.0)
    assert [retry_delay(p, n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]


def test_spec_defaults_without_jitter_are_1s_then_2s():
    p = RetryPolicy(jitter=False)
    assert retry_delay(p, 1) == 1.0
    assert retry_delay(p, 2) == 2.0


def test_max_interval_caps_the_delay():
    p = policy(initial_interval="PT1S", backoff_coefficient=10.0, max_interval="PT2S")
    assert [retry_delay(p, n) for n in (1, 2, 3, 10)] == [1.0, 2.0, 2.0, 2.0]


def test_coefficient_one_is_constant():
    p = policy(initial_interval="PT3S", backoff_coefficient=1.0)
    assert {retry_delay(p, n) for n in range(1, 20)} == {3.0}


def test_jitter_stays_within_half_and_one_and_a_half():
    p = RetryPolicy(initial_interval="PT2S")  # jitter defaults to true
    rng = random.Random(7)
    delays = [retry_delay(p, 1, rand=rng.random) for _ in range(2000)]
    assert all(1.0 <= d < 3.0 for d in delays)
    assert min(delays) < 1.1 and max(delays) > 2.9  # the whole range is used
    assert retry_delay(p, 1, rand=lambda: 0.0) == 1.0
    assert retry_delay(p, 1, rand=lambda: 0.5) == 2.0


def test_linear_strategy():
    p = policy(initial_interval="PT1S", backoff_strategy="linear")
    assert [retry_delay(p, n) for n in (1, 2, 3)] == [1.0, 2.0, 3.0]


# --------------------------------------------------------------------------- other strategies and edges


def test_polynomial_strategy():
    p = policy(initial_interval="PT1S", backoff_coefficient=2.0, backoff_strategy="polynomial")
    assert [retry_delay(p, n) for n in (1, 2, 3)] == [1.0, 4.0, 9.0]


def test_none_strategy_is_the_initial_interval():
    p = policy(initial_interval="PT0.5S", backoff_coefficient=3.0, backoff_strategy="none")
    assert [retry_delay(p, n) for n in (1, 5, 50)] == [0.5, 0.5, 0.5]


def test_explicit_exponential_equals_default():
    a = policy(backoff_coefficient=3.0)
    b = policy(backoff_coefficient=3.0, backoff_strategy="exponential")
    assert [retry_delay(a, n) for n in range(1, 6)] == [retry_delay(b, n) for n in range(1, 6)]


def test_jitter_is_capped_at_max_interval():
    p = RetryPolicy(initial_interval="PT1S", max_interval="PT1S", jitter=True)
    assert retry_delay(p, 1, rand=lambda: 0.999) == 1.0
    p = RetryPolicy(initial_interval="PT1S", max_interval="PT5M")
    assert retry_delay(p, 100, rand=lambda: 0.999) == 300.0  # capped, jittered, capped again
    assert retry_delay(p, 100, rand=lambda: 0.0) == 150.0


@pytest.mark.parametrize("strategy", ["exponential", "linear", "polynomial", "none"])
@pytest.mark.parametrize("n", [10**5, 10**9, 10**400])
def test_huge_retry_numbers_do_not_overflow(strategy, n):
    p = policy(initial_interval="PT1S", backoff_coefficient=2.0, max_interval="PT1H", backoff_strategy=strategy)
    delay = retry_delay(p, n)
    assert delay == (1.0 if strategy == "none" else 3600.0)


def test_fractional_intervals():
    p = policy(initial_interval="PT0.25S", backoff_coefficient=1.5)
    assert retry_delay(p, 3) == pytest.approx(0.5625)


@pytest.mark.parametrize("n", [0, -1, True, 1.0, "1"])
def test_retry_number_must_be_a_positive_integer(n):
    with pytest.raises(ValidationError) as info:
        retry_delay(RetryPolicy(), n)  # type: ignore[arg-type]
    assert info.value.field == "retry_number"


# --------------------------------------------------------------------------- reconnect


def test_reconnect_delay_doubles_up_to_sixty_seconds():
    middle = lambda: 0.5  # noqa: E731  (no jitter)
    assert [reconnect_delay(n, rand=middle) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert reconnect_delay(10**9, rand=middle) == 60


def test_reconnect_delay_jitter_is_25_percent():
    assert reconnect_delay(3, rand=lambda: 0.0) == 3.0
    assert reconnect_delay(3, rand=lambda: 0.999999) == pytest.approx(5.0, abs=1e-4)
    rng = random.Random(1)
    delays = [reconnect_delay(7, rand=rng.random) for _ in range(1000)]
    assert all(45.0 <= d < 75.0 for d in delays)


@pytest.mark.parametrize("attempt", [0, -3, False, 2.0])
def test_reconnect_attempt_must_be_a_positive_integer(attempt):
    with pytest.raises(ValidationError):
        reconnect_delay(attempt)  # type: ignore[arg-type]
