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


def test_a_dramatiq_worker_honours_a_client_jobs_own_rate_limit(ojs_broker, start_worker, client, prefix: str):
    """A job's own ``rate_limit`` (concurrency 2, 5 starts a second) holds on a Dramatiq worker of 8 threads,
    through the consumer's Limiter: never more than 2 at once, never more than 5 starts in a window, all ran."""
    runs: list[tuple[float, float, float]] = []
    lock = threading.Lock()

    @dramatiq.actor(queue_name="own-limit")
    def call_api(n):
        started, wall = time.monotonic(), time.time()
        time.sleep(0.1)
        with lock:
            runs.append((started, time.monotonic(), wall))

    start_worker(worker_threads=8)
    policy = RateLimitPolicy(key=f"{prefix}-own", concurrency=2, rate={"limit": 5, "period": "PT1S"})
    for n in range(10):
        client.enqueue("call_api", [n], queue="own-limit", rate_limit=policy)
    wait_until(lambda: len(runs) == 10, timeout=30, message="10 jobs ran")
    edges = sorted([(s, 1) for s, _, _ in runs] + [(e, -1) for _, e, _ in runs])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak <= 2
    per_window: dict[int, int] = {}
    for *_, wall in runs:
        per_window[int(wall)] = per_window.get(int(wall), 0) + 1
    assert max(per_window.values()) <= 5, per_window
    assert max(wall for *_, wall in runs) - min(wall for *_, wall in runs) >= 1.0  # two windows at least
