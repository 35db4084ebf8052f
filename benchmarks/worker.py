"""Consuming throughput: ``ojs_kombu.Worker`` vs a plain pika consumer, in one run.

    python benchmarks/worker.py [--count 10000] [--concurrency 10] [--rounds 3] [--queue-type quorum] [--url amqp://…]
    python benchmarks/worker.py --deduplicate …   # Worker(deduplicate=True) vs Worker(), instead of pika
    python benchmarks/worker.py --batch 100 [...]   # plain handler vs batch handler, both Workers

Each side drains ``--count`` no-op jobs loaded into one queue with
``Client.enqueue_many``: an ``ojs_kombu.Worker`` (``--concurrency`` handler
threads, prefetch the same; a new Worker each round) and a plain pika consumer
(``basic_qos(prefetch_count=concurrency)``, manual ``basic_ack``, no decoding).
Each rate is jobs / seconds from the first delivery to the last job run, so
connecting, declaring and loading are not counted (for a Worker the first delivery is
the first one it receives: a batch handler's first batch is collected inside the time).  The sides alternate over
``--rounds`` pairs (see ``pairs.py``); prints each rate, the per-round ratios and
their median (target Worker >= 0.9x pika), and each side's process CPU per job
(``os.times``, first to last delivery); for the Worker also its split between the
consumer thread and the handler threads (Linux: ``/proc/self/task``).  Everything is declared under a unique
prefix and deleted afterwards.

``--deduplicate`` compares ``Worker(deduplicate=True)`` (every completed id recorded in the
stream, confirmed, before its ack) with a plain ``Worker`` instead (target: >= 0.5x, "not
halved"); each round loads fresh job ids, so no round's jobs are skipped as completed.
With ``--batch SIZE`` the other side is not pika but the same Worker with a batch handler
(``Worker.batch_handler("bench.noop", size=SIZE, timeout=0.1)``; prefetch concurrency + SIZE):
the ratio is plain / batch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import pika
from pairs import alternate, report_ratio

from ojs_kombu import Client, Job, Worker
from ojs_kombu.amqp.connection import resolve_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support import pika_parameters


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--deduplicate", action="store_true", help="Worker(deduplicate=True) against Worker() instead of pika"
    )
    parser.add_argument("--url", default=None, help="broker URL (default $OJS_AMQP_URL)")
    parser.add_argument(
        "--queue-type",
        choices=["classic", "quorum"],
        default=None,
        help="the job queue's type (default: the library's)",
    )
    parser.add_argument(
        "--batch", type=int, default=0, metavar="SIZE", help="compare with a batch handler of SIZE, not pika"
    )
    return parser.parse_args()


def noop_jobs(count: int, queue: str = "bench") -> list[Job]:
    """``count`` ``bench.noop`` jobs of ``queue``, the workload :func:`bench_worker` drains."""
    return [Job.create("bench.noop", ["user@example.com", i], queue=queue) for i in range(count)]


def load(client: Client, jobs: list[Job]) -> None:
    """Enqueue ``jobs``; exit if any was not confirmed."""
    failed = sum(not r.ok for r in client.enqueue_many(jobs))
    if failed:
        sys.exit(f"{failed} jobs were not enqueued")


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads, summed per name prefix
    (``ojs-consumer``, ``ojs-handler``); empty where ``/proc`` is missing."""
    names = {thread.native_id: thread.name.rstrip("0123456789").rstrip("-") for thread in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    totals: dict[str, float] = {}
    for task in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        name = names.get(int(task))
        try:
            with open(f"/proc/self/task/{task}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue  # the thread ended
        if name is not None:
            totals[name] = totals.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return totals


class Clock:
    """First and last event times, and a count; ``done`` is set at ``expected`` events."""

    def __init__(self, expected: int):
        self.expected = expected
        self.threads_first: dict[str, float] = {}
        self.threads_last: dict[str, float] = {}
        self.count = 0
        self.first = self.last = 0.0
        self.cpu_first = self.cpu_last = 0.0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def begin(self) -> None:
        """The first delivery arrived (before the first event, if it is to count from there)."""
        with self._lock:
            if not self.first:
                self.first = time.perf_counter()
                self.cpu_first = _cpu()
                self.threads_first = thread_cpu()

    def tick(self) -> None:
        """Record one event."""
        now = time.perf_counter()
        with self._lock:
            if not self.first:
                self.first = now
                self.cpu_first = _cpu()
                self.threads_first = thread_cpu()
            self.count += 1
            self.last = now
            if self.count == self.expected:
                self.cpu_last = _cpu()
                self.threads_last = thread_cpu()
                self.done.set()

    @property
    def rate(self) -> float:
        """Events per second between the first and the last."""
        return (self.count - 1) / (self.last - self.first) if self.count > 1 and self.last > self.first else 0.0

    @property
    def cpu_us(self) -> float:
        """Process CPU (user + system) per event between the first and the last, in µs."""
        return (self.cpu_last - self.cpu_first) / (self.count - 1) * 1e6 if self.count > 1 else 0.0


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


#: Each Worker run's process CPU per job (µs), by its batch size (0: a plain handler).
CPU_US: dict[int, list[float]] = {}


def bench_worker(worker: Worker, count: int, batch: int = 0) -> float:
    """Drain ``count`` jobs with ``worker`` (with a batch handler of ``batch`` jobs if not 0); returns jobs/s."""
    clock = Clock(count)
    received = worker.processing.received

    def first_delivery() -> None:
        if not clock.first:
            clock.begin()
        received()

    worker.processing.received = first_delivery  # type: ignore[method-assign]
    if batch:

        @worker.batch_handler("bench.noop", size=batch, timeout=0.1)
        def noop_batch(jobs: list[Job]) -> None:
            for _ in jobs:
                clock.tick()

    else:
        worker.handler("bench.noop", lambda *_: clock.tick())
    worker.start()
    try:
        if not clock.done.wait(300):
            sys.exit(f"the worker ran {clock.count} of {count} jobs")
    finally:
        worker.stop(timeout=10)
    split = ", ".join(
        f"{name} threads {(clock.threads_last[name] - clock.threads_first.get(name, 0.0)) / count * 1e6:.0f}"
        for name in ("ojs-consumer", "ojs-handler", "ojs-batch-bench.noop")
        if name in clock.threads_last
    )
    print(f"    Worker: {clock.cpu_us:.0f} µs of process CPU per job ({split})", flush=True)
    CPU_US.setdefault(batch, []).append(clock.cpu_us)
    return clock.rate


def bench_pika(url: str, queue: str, count: int, prefetch: int) -> float:
    """Drain ``count`` messages of ``queue`` with pika: manual ack, ``prefetch`` unacked."""
    clock = Clock(count)
    connection = pika.BlockingConnection(pika_parameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)

    def on_message(ch, method, _properties, _body) -> None:
        ch.basic_ack(method.delivery_tag)
        clock.tick()
        if clock.done.is_set():
            ch.stop_consuming()

    channel.basic_consume(queue, on_message, auto_ack=False)
    channel.start_consuming()
    connection.close()
    print(f"    pika: {clock.cpu_us:.0f} µs of process CPU per message", flush=True)
    return clock.rate


def main() -> None:
    """Alternate the two sides and print the rates and the median ratio."""
    args = _args()
    url = resolve_url(args.url)
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    jobs = noop_jobs(args.count)
    client = Client(url, prefix=prefix, queue_type=args.queue_type)
    workers: list[Worker] = []

    def worker_side(deduplicate: bool = False, batch: int = 0) -> float:
        load(client, noop_jobs(args.count) if args.deduplicate else jobs)
        worker = Worker(
            url,
            prefix=prefix,
            queues=["bench"],
            concurrency=args.concurrency,
            grace_period=5,
            queue_type=args.queue_type,
            deduplicate=deduplicate,
        )
        workers.append(worker)
        return bench_worker(worker, args.count, batch)

    def pika_side() -> float:
        load(client, jobs)
        return bench_pika(url, client.names.job_queue("bench"), args.count, args.concurrency)

    worker_label = f"ojs_kombu.Worker, concurrency {args.concurrency}"
    pika_label = f"pika consumer, manual ack, prefetch {args.concurrency}"
    if args.batch:
        pika_label = f"ojs_kombu.Worker, batch handler of {args.batch}"
        pika_side = lambda: worker_side(batch=args.batch)  # noqa: E731 - the other side of the pair
    kind = args.queue_type or "default"
    print(f"{args.count:,} no-op jobs per side, {args.rounds} alternated rounds, {os.cpu_count()} cores, {kind} queues")
    dedupe_label = f"ojs_kombu.Worker(deduplicate=True), concurrency {args.concurrency}"
    try:
        client.declare_queue("bench")
        if args.deduplicate:
            sides = [(dedupe_label, lambda: worker_side(deduplicate=True)), (worker_label, worker_side)]
        else:
            sides = [(worker_label, worker_side), (pika_label, pika_side)]
        rates = alternate(sides, rounds=args.rounds, unit=" jobs/s")
    finally:
        if workers:
            workers[-1].teardown()  # the worker also declared the scheduling cascade
        client.teardown()
        client.close()
    if args.deduplicate:
        with pika.BlockingConnection(pika_parameters(url)) as connection:
            connection.channel().queue_delete(client.names.completed_stream("bench"))
        report_ratio(rates, dedupe_label, worker_label, "target >= 0.5x")
    else:
        report_ratio(rates, worker_label, pika_label, "target <= 0.5x" if args.batch else "target >= 0.9x")
    if args.batch:
        plain, batched = (statistics.median(CPU_US.get(size, [0.0])) for size in (0, args.batch))
        print(f"  process CPU per job, median: {plain:.0f} µs plain, {batched:.0f} µs batch")


if __name__ == "__main__":
    main()
