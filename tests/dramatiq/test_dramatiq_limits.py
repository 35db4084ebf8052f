"""``OjsConcurrentRateLimiter``: Dramatiq's concurrent rate limiter on the broker's permits, no Redis (issue 31 item 3)."""

from __future__ import annotations

import threading
import time

import dramatiq
import pytest
from dramatiq.rate_limits import RateLimitExceeded
from support import wait_until

from ojs_dramatiq import OjsConcurrentRateLimiter
from ojs_kombu import RateLimitPolicy

pytestmark = pytest.mark.timeout(120)


def test_the_limiter_holds_a_dramatiq_worker_to_the_key_and_refuses_past_it(ojs_broker, start_worker, prefix: str):
    limiter = OjsConcurrentRateLimiter(RateLimitPolicy(key=f"{prefix}-api", concurrency=2), wait=10)
    runs: list[tuple[float, float]] = []
    lock = threading.Lock()

    @dramatiq.actor(queue_name="limited")
    def call_api(n):
        with limiter.acquire():
            started = time.monotonic()
            time.sleep(0.1)
            with lock:
                runs.append((started, time.monotonic()))

    start_worker(worker_threads=8)
    for n in range(8):
        call_api.send(n)
    wait_until(lambda: len(runs) == 8, timeout=30, message="8 messages ran")
    edges = sorted([(s, 1) for s, _ in runs] + [(e, -1) for _, e in runs])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak == 2

    now = OjsConcurrentRateLimiter(f"{prefix}-api", limit=2, broker=ojs_broker)  # another limiter, same key
    with now.acquire(), now.acquire():
        with now.acquire(raise_on_failure=False) as acquired:
            assert acquired is False
        with pytest.raises(RateLimitExceeded), now.acquire():
            pass
    with now.acquire(raise_on_failure=False) as acquired:  # both given back
        assert acquired is True
