"""Concurrency limits across worker processes (ojs-rate-limiting.md §5.1, RL-001..RL-003; issue 31 item 3).

Two ``Worker`` processes with ``concurrency=8`` each run jobs of one key limited to 3: the handlers
record their start and end (one monotonic clock for the machine), and the drill asserts that never
more than 3 ran at once, that every job completed, and that the permits of a SIGKILLed worker came
back by themselves (the survivor alone reaches 3 at once again).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY
from support import read_stream, wait_until

from ojs_kombu import Client, Job, RateLimitPolicy, RetryPolicy

LIMITED_WORKER = Path(__file__).resolve().parent.parent / "helpers" / "limited_worker.py"


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])  # ends first on ties
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def test_two_worker_processes_never_run_more_than_the_key_allows_and_a_killed_ones_permits_return(
    amqp_url: str, prefix: str, client: Client, tmp_path: Path
):
    log = tmp_path / "runs.log"
    stderr = open(tmp_path / "workers.stderr", "ab")  # closed in finally
    processes: list[subprocess.Popen] = []

    def spawn() -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, str(LIMITED_WORKER), "--prefix", prefix, "--log", str(log), "--concurrency", "8"],
            env={**os.environ, "OJS_AMQP_URL": amqp_url},
            stdout=stderr,
            stderr=stderr,
        )
        processes.append(process)
        return process

    def events() -> list[tuple[str, float, int, int]]:
        if not log.exists():
            return []
        rows = [line.split(" ") for line in log.read_text().splitlines() if line.count(" ") == 3]
        return [(kind, float(t), int(n), int(pid)) for kind, t, n, pid in rows]

    policy = RateLimitPolicy(key=f"{prefix}-api", concurrency=3)
    retry = RetryPolicy(max_attempts=5, initial_interval="PT0.1S", jitter=False)
    total = 40
    try:
        victim, survivor = spawn(), spawn()
        client.enqueue_many(
            [Job.create("limited.run", [n], queue="limited", rate_limit=policy, retry=retry) for n in range(total)]
        )

        def victim_mid_run() -> bool:  # ten jobs done, and the victim holds a permit (a run of its started, not ended)
            rows = events()
            opened = {n for kind, _, n, pid in rows if kind == "start" and pid == victim.pid}
            closed = {n for kind, _, n, pid in rows if kind == "end" and pid == victim.pid}
            return sum(kind == "end" for kind, *_ in rows) >= 10 and bool(opened - closed)

        wait_until(victim_mid_run, timeout=30, interval=0.01, message="the victim running a job after 10 runs")
        victim.kill()
        victim.wait()
        killed_at = time.monotonic()
        wait_until(
            lambda: {n for kind, _, n, _ in events() if kind == "end"} == set(range(total)),
            timeout=60,
            message="every job completed",
        )
        rows = events()
        starts = {(n, pid): t for kind, t, n, pid in rows if kind == "start"}
        ends = {(n, pid): t for kind, t, n, pid in rows if kind == "end"}
        # A run the SIGKILL interrupted held its permit until the kill.
        intervals = [(t, ends.get(run, killed_at)) for run, t in starts.items()]
        assert _max_overlap(intervals) <= 3, sorted(intervals)
        pids = {pid for _, _, _, pid in rows}
        assert pids == {victim.pid, survivor.pid}, "both workers ran jobs"
        assert any(pid == victim.pid and run not in ends for run in starts for _, pid in [run]), "killed mid-run"
        after_kill = [
            (t, end)
            for (n, pid), t in starts.items()
            if pid == survivor.pid and t > killed_at
            for end in [ends[(n, pid)]]
        ]
        assert _max_overlap(after_kill) == 3, "the survivor took the killed worker's permits"
        assert survivor.poll() is None
        print(f"limits drill: {len(starts)} runs, peak {_max_overlap(intervals)}, {len(after_kill)} after the kill")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        stderr.close()


def _sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_queue_policy_on_limit_actions_and_metrics_in_one_worker(
    client: Client, worker_factory, prefix: str, names, amqp_url: str
):
    """A queue's policy holds its jobs to 1 at once; a paused key (concurrency 0) drops, reschedules or
    keeps waiting per ``on_limit`` (never running); the ``ojs_rate_limit_*`` metrics tell it, and the
    events stream the ``rate_limit.*`` events (spec §11.1); a stopping worker hands its waiting job
    back to the queue."""
    queue_key, paused = f"{prefix}-queue", f"{prefix}-paused"
    worker = worker_factory(
        ("lq",), concurrency=4, rate_limits={"lq": {"key": queue_key, "concurrency": 1}}, events=True
    )
    runs: list[tuple[float, float]] = []
    ran: list[int] = []
    events: list[Any] = []
    worker.lifecycle.subscribe(events.append)

    @worker.handler("limited.run")
    def run(n: int) -> None:
        started = time.monotonic()
        ran.append(n)
        time.sleep(0.1)
        runs.append((started, time.monotonic()))

    worker.start()
    drop = Job.create("limited.run", [-1], queue="lq", rate_limit={"key": paused, "concurrency": 0, "on_limit": "drop"})
    again = RateLimitPolicy(key=paused, concurrency=0, on_limit="reschedule")
    waits = Job.create("limited.run", [-3], queue="lq", rate_limit={"key": paused, "concurrency": 0})
    client.enqueue_many([drop, Job.create("limited.run", [-2], queue="lq", rate_limit=again), waits])
    client.enqueue_many([Job.create("limited.run", [n], queue="lq") for n in range(5)])
    wait_until(lambda: (_sample("ojs_rate_limit_waiting", key=queue_key) or 0) >= 1, message="a job waiting")
    wait_until(lambda: len(runs) == 5, timeout=20, message="the queue's jobs ran")
    assert sorted(ran) == list(range(5))
    assert _max_overlap(runs) == 1
    wait_until(
        lambda: (_sample("ojs_rate_limit_exceeded_total", key=paused, strategy="concurrency") or 0) >= 3,
        timeout=10,
        message="the rescheduled job came back and was held again",
    )
    failed = [e for e in events if e.event == "failed" and e.job_id == drop.id]
    assert len(failed) == 1 and failed[0].error["code"] == "rate_limited"
    assert not [e for e in events if e.event == "retried" and e.job_id == drop.id]
    assert not {-1, -2, -3} & set(ran)
    wait_until(lambda: _sample("ojs_rate_limit_active", key=queue_key) == 0, message="the last run's permit back")
    assert (_sample("ojs_rate_limit_exceeded_total", key=queue_key, strategy="concurrency") or 0) >= 1
    assert _sample("ojs_rate_limit_waiting", key=paused) == 1  # the "wait" job, parked
    worker.stop(timeout=5)
    counts = client.queue_counts([names.job_queue("lq")])[names.job_queue("lq")]
    assert counts is not None and counts.ready >= 1  # handed back (the rescheduled one may be in the cascade)
    assert not [e for e in events if e.job_id == waits.id]  # never started, never failed

    def rate_limit_event(kind: str, **data: Any) -> dict[str, Any]:
        def matches(_: Any, properties: Any, body: bytes) -> bool:
            if properties.type != f"ojs.event.rate_limit.{kind}":
                return False
            return json.loads(body)["data"].items() >= data.items()

        found = read_stream(amqp_url, names.events_stream, predicate=matches)
        return next(json.loads(body) for record in found if matches(*record) for *_, body in [record])

    dropped = rate_limit_event("dropped", job_id=drop.id)
    assert dropped["event"] == "rate_limit.dropped"
    assert dropped["data"] | {"worker_id": "?"} == {
        "key": paused,
        "strategy": "concurrency",
        "limit": 0,
        "job_id": drop.id,
        "job_type": "limited.run",
        "queue": "lq",
        "worker_id": "?",
    }
    assert rate_limit_event("exceeded", key=queue_key, strategy="concurrency", limit=1)["data"]["worker_id"]
    assert rate_limit_event("released", key=queue_key, strategy="concurrency")


def test_a_rate_window_holds_each_window_to_its_limit_in_a_worker(client: Client, worker_factory, prefix: str):
    """A key of 5 starts per second (spec §5.2): 15 jobs on a worker of concurrency 8 start at most 5 in
    each one-second window (aligned to the epoch, the broker's token refills) and take at least 2 s;
    the jobs the window stopped waited (``on_limit`` "wait") and every one ran once.  A window that
    opens only next hour drops a job with ``on_limit`` "drop" and sends a waiting one to the cascade."""
    key, hourly = f"{prefix}-rate", f"{prefix}-hourly"
    worker = worker_factory(("lr",), concurrency=8)
    starts: list[tuple[float, int]] = []
    events: list[Any] = []
    worker.lifecycle.subscribe(events.append)

    @worker.handler("limited.rate")
    def run(n: int) -> None:
        starts.append((time.time(), n))

    worker.start()
    policy = RateLimitPolicy(key=key, rate={"limit": 5, "period": "PT1S"})
    once_an_hour = {"key": hourly, "rate": {"limit": 1, "period": "PT1H"}}  # nothing before the next hour
    drop = Job.create("limited.rate", [-1], queue="lr", rate_limit={**once_an_hour, "on_limit": "drop"})
    later = Job.create("limited.rate", [-2], queue="lr", rate_limit=once_an_hour)
    client.enqueue_many([drop, later])
    client.enqueue_many([Job.create("limited.rate", [n], queue="lr", rate_limit=policy) for n in range(15)])
    wait_until(lambda: len(starts) >= 15, timeout=20, message="every job started")
    assert sorted(n for _, n in starts) == list(range(15))  # neither -1 nor -2 ran
    failed = [e for e in events if e.event == "failed" and e.job_id == drop.id]
    assert len(failed) == 1 and failed[0].error["code"] == "rate_limited"
    assert not [e for e in events if e.job_id == later.id]  # in the cascade until the next hour, not parked
    assert _sample("ojs_rate_limit_waiting", key=hourly) in (None, 0.0)
    assert (_sample("ojs_rate_limit_exceeded_total", key=hourly, strategy="rate") or 0) >= 2
    per_window: dict[int, int] = {}
    for t, _ in starts:
        per_window[int(t)] = per_window.get(int(t), 0) + 1
    assert max(per_window.values()) <= 5, per_window
    times = sorted(t for t, _ in starts)
    assert times[-1] - times[0] >= 2.0, per_window
    assert worker.limiter.refills.leading(key, "rate") and worker.limiter.refills.refills
    assert (_sample("ojs_rate_limit_exceeded_total", key=key, strategy="rate") or 0) >= 1
    print(f"rate window: 15 starts over {times[-1] - times[0]:.2f} s, per window {sorted(per_window.items())}")
