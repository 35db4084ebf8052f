"""Celery's ``rate_limit`` across all workers (celery#5732; issue 31 item 3): ``ojs_celery.limits``.

Two ``celery worker --pool=prefork`` processes run a task of ``rate_limit="5/s"`` with
``app.conf.ojs_rate_limits = True``: the ``ojs://`` transport throttles the task's starts across both.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from support import raw_channel, wait_until

from ojs_celery import Celery
from ojs_celery.limits import rate_limit_policy
from ojs_kombu.errors import ValidationError


def test_a_celery_rate_becomes_an_evenly_spaced_throttle_of_the_task_key() -> None:
    policy = rate_limit_policy("proj.add", "10/s")
    assert policy is not None and policy.key == "celery.proj.add"
    assert policy.throttle is not None and (policy.throttle.limit, policy.throttle.period) == (10, "PT1S")
    per_minute = rate_limit_policy("proj.add", "100/m")
    assert per_minute is not None and per_minute.throttle is not None and per_minute.throttle.period == "PT1M"
    half = rate_limit_policy("proj.add", "0.5/s")
    assert half is not None and half.throttle is not None
    assert (half.throttle.limit, half.throttle.period_seconds) == (1, timedelta(seconds=2).total_seconds())
    bare = rate_limit_policy("proj.add", 3)  # a number: per second
    assert bare is not None and bare.throttle is not None and bare.throttle.limit == 3
    assert rate_limit_policy("proj.add", "0") is None  # Celery: no limit
    with pytest.raises(ValidationError):
        rate_limit_policy("proj.add", "ten a second")
    with pytest.raises(ValidationError):
        rate_limit_policy("proj/add", "1/s")  # not a valid key: the task keeps Celery's per-worker limit


@pytest.mark.broker
def test_two_prefork_workers_share_one_task_rate_limit(
    amqp_url: str, prefix: str, celery_subprocess_worker, tmp_path, names
):
    log = tmp_path / "runs.log"
    producer = Celery("worker_app", broker=amqp_url, broker_backend="ojs", broker_transport_options={"prefix": prefix})
    env = {"OJS_RATE_LIMITS": "1"}
    try:
        with (
            celery_subprocess_worker(concurrency=2, extra_env=env),
            celery_subprocess_worker(concurrency=2, extra_env=env),
        ):
            queue = names.job_queue("celery")
            wait_until(lambda: _consumers(amqp_url, queue) == 2, timeout=60, message="both workers consuming")
            sent = time.time()
            for n in range(15):
                producer.send_task("worker_app.throttled", (str(log), n))
            wait_until(lambda: len(_runs(log, "run")) >= 15, timeout=60, message="15 tasks ran")
    finally:
        producer.close()
    runs, admitted = _runs(log, "run"), _runs(log, "admitted")
    assert sorted(n for n, _, _ in runs) == list(range(15))
    times = sorted(t for _, t, _ in runs)
    assert times[-1] - times[0] >= 2.0, times  # 5 a second, evenly spaced: 2.8 s at least
    # Received in the workers' main processes right after the transport admitted them, each on a start
    # token of its own 200 ms slot, none before the tasks were sent: the k-th is received no earlier
    # than the start of the k-th slot from then.  (A job admitted by a waiter thread reaches Celery when
    # the consumer's loop next runs, up to ~0.2 s later under load, so receipts bunch at times; they are
    # never early.)  Unlimited, the 15 are received within 0.1 s.
    moments = sorted(t for _, t, _ in admitted)
    assert len(moments) == 15
    assert all(t >= sent + 0.2 * (k - 1) for k, t in enumerate(moments)), [round(t - sent, 3) for t in moments]
    assert len({pid for _, _, pid in admitted}) == 2, "both workers ran tasks"
    print(f"celery rate limit: 15 tasks over {times[-1] - times[0]:.2f} s on 2 workers")


def _consumers(amqp_url: str, queue: str) -> int:
    try:
        with raw_channel(amqp_url) as channel:
            return int(channel.queue_declare(queue, passive=True).method.consumer_count)
    except Exception:  # noqa: BLE001 - not declared yet
        return 0


def _runs(log: Path, kind: str) -> list[tuple[int, float, int]]:
    if not log.exists():
        return []
    rows = [line.split(" ") for line in log.read_text().splitlines() if line.count(" ") == 3]
    return [(int(n), float(t), int(pid)) for what, n, t, pid in rows if what == kind]


@pytest.mark.broker
def test_a_celery_worker_honours_a_client_jobs_own_rate_limit(celery_app, worker_factory, client, prefix: str):
    """A job's own ``rate_limit`` (``Client.enqueue(..., rate_limit=...)``, concurrency 1) holds on a Celery
    worker of 4 threads over ``ojs://``: the transport's Limiter admits one at a time, permits back at the ack."""
    runs: list[tuple[float, float]] = []
    lock = threading.Lock()

    @celery_app.task(name="Limits.CallApi")
    def call_api(n):
        started = time.monotonic()
        time.sleep(0.1)
        with lock:
            runs.append((started, time.monotonic()))

    policy = {"key": f"{prefix}-celery-own", "concurrency": 1}
    for n in range(4):
        client.enqueue("limits.call_api", [n], queue="celery", rate_limit=policy)
    with worker_factory(celery_app, concurrency=4):
        wait_until(lambda: len(runs) == 4, timeout=30, message="4 jobs ran")
    runs.sort()
    assert all(end <= next_start for (_, end), (next_start, _) in zip(runs, runs[1:], strict=False)), runs
