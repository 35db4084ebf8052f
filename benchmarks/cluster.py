"""Classic vs quorum queues, one node vs a 3-node cluster, in one run.

    python benchmarks/cluster.py [--count 5000] [--concurrency 10] [--scheduled 300] [--rounds 2]

Starts its own brokers (``ojs_kombu.testing``): a private node and a private 3-node
cluster, both removed at the end (it never touches ``$OJS_AMQP_URL``).  For each set-up,
classic queues on one node, quorum queues on one node and quorum queues on the cluster
(Client and Worker on its first node):

* publish: ``Client.enqueue_many`` of ``--count`` jobs, building the ``Job``s included,
  until every confirm is in;
* drain: an ``ojs_kombu.Worker`` (``--concurrency``) runs them, first to last delivery.

The set-ups alternate over ``--rounds`` (rotating the order, see ``pairs.py``); each
figure is the median of its rounds, printed with the load average.  Then, on quorum queues
(one node and the cluster), ``--scheduled`` jobs are scheduled 1–3 s ahead in a burst and
their lateness (run time minus ``scheduled_at``) is reported as p50 / p99.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from pairs import load
from worker import bench_worker, noop_jobs

from ojs_kombu import Client, Job, Worker, current_job
from ojs_kombu.testing.broker import PrivateNode
from ojs_kombu.testing.cluster import Cluster
from ojs_kombu.wire.entities import QueueType


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=5_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--scheduled", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    return parser.parse_args()


def publish_and_drain(url: str, queue_type: QueueType | None, count: int, concurrency: int) -> tuple[float, float]:
    """``(publish jobs/s, drain jobs/s)`` of ``count`` no-op jobs under a fresh prefix."""
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    with Client(url, prefix=prefix, queue_type=queue_type) as client:
        client.declare_queue("bench")
        started = time.perf_counter()
        results = client.enqueue_many(noop_jobs(count))
        published = count / (time.perf_counter() - started)
        if not all(r.ok for r in results):
            sys.exit("some jobs were not enqueued")
        worker = Worker(url, prefix=prefix, queues=["bench"], concurrency=concurrency, queue_type=queue_type)
        drained = bench_worker(worker, count)
        client.teardown()
    return published, drained


def lateness(url: str, queue_type: QueueType, count: int) -> list[float]:
    """Seconds each of ``count`` jobs scheduled 1–3 s ahead (one burst) ran after its ``scheduled_at``."""
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    late: list[float] = []
    lock = threading.Lock()
    done = threading.Event()

    def run(*_: object) -> None:
        due = current_job().scheduled_datetime
        assert due is not None
        with lock:
            late.append((datetime.now(UTC) - due).total_seconds())
            if len(late) == count:
                done.set()

    with Client(url, prefix=prefix, queue_type=queue_type) as client:
        client.declare_queue("bench", scheduling=True)
        worker = Worker(url, prefix=prefix, queues=["bench"], concurrency=10, queue_type=queue_type)
        worker.handler("bench.later", run)
        worker.start()
        try:
            jobs = [
                Job.create("bench.later", [i], queue="bench", scheduled_at=timedelta(seconds=random.uniform(1, 3)))
                for i in range(count)
            ]
            if not all(r.ok for r in client.enqueue_many(jobs)):
                sys.exit("some scheduled jobs were not enqueued")
            if not done.wait(120):
                sys.exit(f"only {len(late)} of {count} scheduled jobs ran")
        finally:
            worker.stop(timeout=10)
            worker.teardown()
        client.teardown()
    return late


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    """Start the brokers, measure every set-up, print the table, remove the brokers."""
    args = _args()
    base = tempfile.mkdtemp(prefix="ojs-bench-cluster-")
    node = PrivateNode(base)
    cluster = Cluster(3, base)
    try:
        print(f"starting a private node and a 3-node cluster under {base} ...", flush=True)
        node.start()
        cluster.start()
        setups: list[tuple[str, str, QueueType | None]] = [
            ("classic, 1 node", node.url, None),
            ("quorum, 1 node", node.url, "quorum"),
            ("quorum, 3 nodes", cluster.urls[0], "quorum"),
        ]
        figures: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _, _ in setups}
        for index in range(args.rounds):
            shift = index % len(setups)
            for label, url, queue_type in setups[shift:] + setups[:shift]:
                published, drained = publish_and_drain(url, queue_type, args.count, args.concurrency)
                figures[label].append((published, drained, load()))
                print(
                    f"  round {index + 1} {label:16} publish {published:8,.0f}/s  drain {drained:8,.0f}/s  "
                    f"(load {load():.2f})",
                    flush=True,
                )
        print(
            f"\n{args.count:,} jobs per run, Worker concurrency {args.concurrency}, medians of {args.rounds} "
            f"rounds, {os.cpu_count()} cores"
        )
        print("| set-up | enqueue_many jobs/s | Worker drain jobs/s | load |\n|---|---|---|---|")
        for label, rows in figures.items():
            publish = statistics.median(r[0] for r in rows)
            drain = statistics.median(r[1] for r in rows)
            print(f"| {label} | {publish:,.0f} | {drain:,.0f} | {statistics.median(r[2] for r in rows):.2f} |")
        print(f"\n{args.scheduled} jobs scheduled 1-3 s ahead in one burst; lateness after scheduled_at:")
        print("| set-up | p50 | p99 | max | load |\n|---|---|---|---|---|")
        schedules: list[tuple[str, Callable[[], list[float]]]] = [
            ("quorum, 1 node", lambda: lateness(node.url, "quorum", args.scheduled)),
            ("quorum, 3 nodes", lambda: lateness(cluster.urls[0], "quorum", args.scheduled)),
        ]
        for label, measure in schedules:
            late = measure()
            print(
                f"| {label} | {percentile(late, 0.5) * 1000:.0f} ms | {percentile(late, 0.99) * 1000:.0f} ms | "
                f"{max(late) * 1000:.0f} ms | {load():.2f} |",
                flush=True,
            )
    finally:
        cluster.cleanup()
        node.cleanup()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
