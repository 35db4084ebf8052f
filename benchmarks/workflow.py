"""Workflow throughput: a batch of no-op members vs as many plain no-op jobs, on one Worker.

    python benchmarks/workflow.py [--count 500] [--concurrency 8] [--rounds 5] [--url amqp://…]

Each side loads its jobs first, then starts a new in-process ``ojs_kombu.Worker``
(``--concurrency`` handler threads) on the queue and measures the milliseconds from the first
delivery to the end: for the plain side the last job's handler; for the workflow side the batch's
``on_complete`` callback (which runs once every member's report was counted, so every member's
completion hook is in the time).  The sides alternate over ``--rounds`` rounds (``pairs.py``); prints
each time, the per-round ratios ``workflow / plain`` and their median.  Everything lives under a
unique prefix, deleted afterwards.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid

from kombu import Connection
from pairs import alternate, report_ratio

from ojs_kombu import Client, Job, Worker, batch
from ojs_kombu.amqp.connection import resolve_url

workflow_ids: list[str] = []  # their record streams are deleted at the end


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", default=None, help="broker URL (default $OJS_AMQP_URL)")
    return parser.parse_args()


class Span:
    """The first delivery's time, and the time the end was seen."""

    def __init__(self) -> None:
        self.first = 0.0
        self.last = 0.0
        self.count = 0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def tick(self, end: int) -> None:
        """One handler ran; ``end`` handlers make the end."""
        with self._lock:
            now = time.perf_counter()
            if not self.count:
                self.first = now
            self.count += 1
            if self.count >= end:
                self.last = now
                self.done.set()

    def finish(self) -> None:
        """The end (the callback ran)."""
        self.last = time.perf_counter()
        self.done.set()


def run(client: Client, workers: list[Worker], url: str, count: int, concurrency: int, *, workflow: bool) -> float:
    """Load ``count`` no-op jobs (a batch of them with ``on_complete`` if ``workflow``), drain them; return ms."""
    span = Span()
    jobs = [Job.create("bench.noop", [i], queue="bench") for i in range(count)]
    if workflow:
        workflow_ids.append(
            client.enqueue_workflow(batch(jobs, on_complete=Job.create("bench.done", [], queue="bench")))
        )
    else:
        failed = sum(not r.ok for r in client.enqueue_many(jobs))
        if failed:
            sys.exit(f"{failed} jobs were not enqueued")
    worker = Worker(url, prefix=client.names.prefix, queues=["bench"], concurrency=concurrency, grace_period=5)
    worker.handler("bench.noop", lambda *_: span.tick(count + 1 if workflow else count))
    worker.handler("bench.done", lambda *_: span.finish())
    workers.append(worker)
    worker.start()
    try:
        if not span.done.wait(120):
            sys.exit(f"the worker ran {span.count} of {count} jobs")
    finally:
        worker.stop(timeout=10)
    return (span.last - span.first) * 1000


def main() -> None:
    """Alternate the two sides; print the times and the median ratio."""
    args = _args()
    url = resolve_url(args.url)
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    label_wf = f"batch of {args.count} + on_complete"
    label_plain = f"{args.count} plain jobs"
    print(
        f"{args.count} no-op jobs per side, concurrency {args.concurrency}, {args.rounds} rounds, {os.cpu_count()} cores"
    )
    client = Client(url, prefix=prefix)
    workers: list[Worker] = []
    try:
        times = alternate(
            [
                (label_wf, lambda: run(client, workers, url, args.count, args.concurrency, workflow=True)),
                (label_plain, lambda: run(client, workers, url, args.count, args.concurrency, workflow=False)),
            ],
            rounds=args.rounds,
            unit=" ms",
        )
    finally:
        if workers:
            workers[-1].teardown()  # the worker also declared the scheduling cascade
        with Connection(url) as connection:
            channel = connection.default_channel
            for workflow_id in workflow_ids:
                channel.queue_delete(client.names.workflow_log_stream(workflow_id))
        client.teardown()
        client.close()
    for label, values in times.items():
        per = [args.count / v * 1000 for v in values]
        print(f"  {label}: median {statistics.median(values):,.0f} ms ({statistics.median(per):,.0f} jobs/s)")
    report_ratio(times, label_wf, label_plain)


if __name__ == "__main__":
    main()
