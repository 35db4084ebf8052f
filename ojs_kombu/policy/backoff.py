"""Delay computations: the OJS retry back-off and the broker reconnect back-off.

Pure functions, no broker.  Randomness comes from ``rand`` (a function returning
a float in [0, 1)), so tests can pin it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.policies import RetryPolicy

RECONNECT_MAX_DELAY = 60.0
"""Longest reconnect delay before jitter, in seconds (DESIGN §9)."""

RECONNECT_JITTER = 0.25
"""Relative jitter of reconnect delays: ±25 % (DESIGN §9)."""


def _positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(f"{name} must be an integer >= 1, got {value!r}", field=name)
    return value


def retry_delay(policy: RetryPolicy, retry_number: int, *, rand: Callable[[], float] = random.random) -> float:
    """Return the wait in seconds before retry ``retry_number`` of a job (OJS retry spec §3, §5).

    ``retry_number`` 1 is the wait before attempt 2.  With initial interval ``I``,
    coefficient ``C`` and n = ``retry_number``, the raw delay is ``I*C**(n-1)``
    (exponential, the default), ``I*n`` (linear), ``I*n**C`` (polynomial) or ``I``
    (none), chosen by ``policy.backoff_strategy``.  It is capped at
    ``max_interval``; with ``jitter`` it is then multiplied by ``0.5 + rand()``
    (U[0.5, 1.5)) and capped again.  Huge ``retry_number`` values simply hit the cap.
    """
    n = _positive_int(retry_number, "retry_number")
    initial = policy.initial_interval_seconds
    cap = policy.max_interval_seconds
    coefficient = policy.backoff_coefficient
    strategy = policy.backoff_strategy or "exponential"
    try:
        if strategy == "exponential":
            raw = initial * coefficient ** (n - 1)
        elif strategy == "linear":
            raw = initial * n
        elif strategy == "polynomial":
            raw = initial * float(n) ** coefficient
        else:
            raw = initial
    except OverflowError:
        raw = cap
    delay = min(raw, cap)
    if policy.jitter:
        delay = min(delay * (0.5 + rand()), cap)
    return delay


def reconnect_delay(attempt: int, *, rand: Callable[[], float] = random.random) -> float:
    """Return the wait in seconds before reconnect ``attempt`` (1 = the first retry).

    ``min(2**(attempt-1), 60)`` seconds, then ±25 % jitter (×U[0.75, 1.25)), as in
    the AMQP binding §10 and DESIGN §9.  The jitter applies after the cap, so the
    longest wait is just under 75 s: that keeps reconnecting clients spread out.
    """
    n = _positive_int(attempt, "attempt")
    base = RECONNECT_MAX_DELAY if n > 7 else min(float(2 ** (n - 1)), RECONNECT_MAX_DELAY)
    return base * (1.0 - RECONNECT_JITTER + 2 * RECONNECT_JITTER * rand())


__all__ = ["RECONNECT_JITTER", "RECONNECT_MAX_DELAY", "reconnect_delay", "retry_delay"]
