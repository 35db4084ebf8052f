"""Scheduling accuracy of the TTL cascade: how late (never early) scheduled jobs run.

    python benchmarks/schedule.py [--count 2000] [--spread 10] [--queue-type quorum]
                                  [--delay-queue-type quorum|classic|same] [--url amqp://…]

Schedules ``--count`` jobs uniformly 0..``--spread`` seconds ahead, enqueued at
once in the order they fall due with ``Client.enqueue_many`` calls of
``--batch`` jobs (publishing 2,000 jobs takes about half a second, and a job
due before it is even published would measure the producer rather than the
scheduler), runs them with an ``ojs_kombu.Worker`` and records,
for each job, ``time.time() - scheduled_at`` when its handler starts.  Prints
how many ran early (must be 0) and the lateness p50 / p95 / p99 / max.  The
target is p99 <= 50 ms on an idle broker.  Everything is declared under a
unique prefix and deleted afterwards.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

from ojs_kombu import Client, Job, Worker, current_job
from ojs_kombu.amqp.connection import resolve_url
from ojs_kombu.wire.entities import QueueOptions


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--spread", type=float, default=10.0, help="schedule jobs 0..SPREAD seconds ahead")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--batch", type=int, default=100, help="jobs per enqueue_many call")
    parser.add_argument("--url", default=None, help="broker URL (default $OJS_AMQP_URL)")
    parser.add_argument(
        "--queue-type",
        choices=["classic", "quorum"],
        default=None,
        help="the job queue's type (default: the library's)",
    )
    parser.add_argument(
        "--delay-queue-type",
        choices=["classic", "quorum", "same"],
        default="quorum",
        help="QueueOptions.delay_queue_type, the cascade levels' type (same: None, the job queue's type)",
    )
    return parser.parse_args()


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def main() -> None:
    """Run the benchmark and print its table."""
    args = _args()
    url = resolve_url(args.url)
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    lateness: list[float] = []
    done = threading.Event()
    lock = threading.Lock()

    options = QueueOptions(
        queue_type=args.queue_type, delay_queue_type=None if args.delay_queue_type == "same" else args.delay_queue_type
    )
    worker = Worker(
        url, prefix=prefix, queues=["sched"], concurrency=args.concurrency, grace_period=5, queue_options=options
    )

    @worker.handler("bench.scheduled")
    def record(_: int) -> None:
        late = time.time() - current_job().scheduled_datetime.timestamp()
        with lock:
            lateness.append(late)
            if len(lateness) == args.count:
                done.set()

    client = Client(url, prefix=prefix, queue_options=options)
    try:
        worker.start()
        if not worker.wait_until_ready(30):
            sys.exit("the worker did not connect")
        client.declare_queue("sched", scheduling=True)  # a running producer has declared it already
        start = datetime.now(UTC)
        due = sorted(start + timedelta(seconds=random.uniform(0, args.spread)) for _ in range(args.count))
        started = time.perf_counter()
        results = []
        for first in range(0, args.count, args.batch):
            results += client.enqueue_many(
                [
                    Job.create("bench.scheduled", [i], queue="sched", scheduled_at=when)
                    for i, when in enumerate(due[first : first + args.batch], first)
                ]
            )
        publish_s = time.perf_counter() - started
        failed = sum(not r.ok for r in results)
        if failed:
            sys.exit(f"{failed} jobs were not enqueued")
        if not done.wait(args.spread + 60):
            sys.exit(f"only {len(lateness)} of {args.count} jobs ran")
    finally:
        worker.stop(timeout=5)
        worker.teardown()
        client.teardown()
        client.close()

    ms = [v * 1000 for v in lateness]
    rows = [
        ("jobs", f"{len(ms):,}"),
        ("delivered early", f"{sum(v < 0 for v in ms)}"),
        ("lateness p50", f"{percentile(ms, 50):.1f} ms"),
        ("lateness p95", f"{percentile(ms, 95):.1f} ms"),
        ("lateness p99", f"{percentile(ms, 99):.1f} ms  (target <= 50 ms)"),
        ("lateness max", f"{max(ms):.1f} ms"),
        (f"enqueueing ({args.batch} per call)", f"{publish_s * 1000:.0f} ms"),
    ]
    for label, value in rows:
        print(f"{label:<26} {value}")


if __name__ == "__main__":
    main()
