"""Celery over stock ``pyamqp://`` vs over ``ojs://``: drain rate, and ETA tasks in the worker.

1. **Throughput.**  ``--tasks`` (10,000) no-op tasks are published, then one
   ``celery worker`` (a subprocess, ``threads`` pool) drains them with identical
   settings for both transports: concurrency, prefetch multiplier, ``acks_late``,
   ``ignore_result``.  Prints both drain rates, the worker's CPU time per task
   (steadier than the rate on a shared machine) and the ratio (target: OJS >= 1.0x).
2. **Countdown.**  ``--eta-tasks`` (20,000) tasks with ``countdown=600`` are
   published, a worker runs for ``--eta-wait`` seconds, then its RSS and the
   queue's unacknowledged count are read: stock Celery prefetches every ETA task
   and holds it unacked in memory; over OJS they wait in the scheduling cascade.

Run against a broker with the management plugin::

    OJS_AMQP_URL=amqp://guest:guest@localhost:5672// OJS_MANAGEMENT_URL=http://localhost:15672 \\
        python benchmarks/celery_throughput.py

Everything is declared under a unique prefix / queue name and deleted afterwards.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve()
DEFAULT_URL = "amqp://guest:guest@localhost:5672//"


def make_app(mode: str, url: str, queue: str, prefix: str, concurrency: int, prefetch: int):
    """The benchmark's Celery app; the same settings for both transports."""
    settings = dict(
        task_acks_late=True,
        task_acks_on_failure=False,
        worker_prefetch_multiplier=prefetch,
        worker_concurrency=concurrency,
        task_ignore_result=True,
        task_default_queue=queue,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    if mode == "ojs":
        from ojs_celery import Celery

        app = Celery("bench", broker=url, broker_backend="ojs", broker_transport_options={"prefix": prefix}, **settings)
    else:
        from celery import Celery

        app = Celery("bench", broker=url, **settings)

    app.task(name="bench.noop")(_noop)
    return app


def _noop(i):
    return None


def run_worker(args) -> None:
    """The worker subprocess: count finished tasks, print the drain time, exit."""
    from celery import signals

    app = make_app(args.mode, args.url, args.queue, args.prefix, args.concurrency, args.prefetch)
    state = {"done": 0, "first": None, "cpu": 0.0}

    def cpu_seconds() -> float:
        times = os.times()
        return times.user + times.system

    @signals.task_prerun.connect
    def started(**_):
        if state["first"] is None:
            state["first"] = time.perf_counter()
            state["cpu"] = cpu_seconds()

    @signals.task_postrun.connect
    def finished(**_):
        state["done"] += 1
        if state["done"] == args.count:
            # The worker redirects sys.stdout to its logger: write to the pipe itself.
            os.write(
                1, f"DRAINED {time.perf_counter() - state['first']:.4f} {cpu_seconds() - state['cpu']:.4f}\n".encode()
            )
            os._exit(0)

    print("READY", flush=True)
    app.worker_main(
        [
            "worker",
            "--pool=threads",
            f"--concurrency={args.concurrency}",
            "--loglevel=WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-n",
            f"bench-{uuid.uuid4().hex[:6]}@%h",
        ]
    )


def spawn_worker(mode, url, queue, prefix, concurrency, prefetch, count) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE),
            "--worker",
            "--mode",
            mode,
            "--url",
            url,
            "--queue",
            queue,
            "--prefix",
            prefix,
            "--concurrency",
            str(concurrency),
            "--prefetch",
            str(prefetch),
            "--count",
            str(count),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(HERE.parent.parent)},
    )


def publish(app, count: int, **options) -> float:
    noop = app.tasks["bench.noop"]
    start = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for i in range(count):
            noop.apply_async((i,), producer=producer, **options)
    return time.perf_counter() - start


def throughput(mode, url, management, args) -> float:
    prefix, queue = f"bench{uuid.uuid4().hex[:8]}", f"bench-{mode}-{uuid.uuid4().hex[:6]}"
    app = make_app(mode, url, queue, prefix, args.concurrency, args.prefetch)
    try:
        elapsed = publish(app, args.tasks)
        print(f"  {mode:5s} published {args.tasks} in {elapsed:.1f}s ({args.tasks / elapsed:,.0f}/s)")
        worker = spawn_worker(mode, url, queue, prefix, args.concurrency, args.prefetch, args.tasks)
        drained = cpu = None
        for line in worker.stdout:
            if line.startswith("DRAINED"):
                drained, cpu = (float(word) for word in line.split()[1:3])
                break
        worker.wait(timeout=60)
        rate = args.tasks / drained
        print(
            f"  {mode:5s} drained   {args.tasks} in {drained:.2f}s ({rate:,.0f} tasks/s; "
            f"worker CPU {cpu / args.tasks * 1e6:.0f} µs per task)"
        )
        return rate
    finally:
        cleanup(management, mode, prefix, queue)
        app.close()


def countdown(mode, url, management, args) -> tuple[float, int]:
    prefix, queue = f"bench{uuid.uuid4().hex[:8]}", f"bench-{mode}-{uuid.uuid4().hex[:6]}"
    app = make_app(mode, url, queue, prefix, args.concurrency, args.prefetch)
    worker = None
    try:
        elapsed = publish(app, args.eta_tasks, countdown=600)
        print(f"  {mode:5s} published {args.eta_tasks} ETA tasks in {elapsed:.1f}s")
        worker = spawn_worker(mode, url, queue, prefix, args.concurrency, args.prefetch, args.eta_tasks + 1)
        worker.stdout.readline()  # READY
        time.sleep(args.eta_wait)
        rss_kib = int(
            next(
                line.split()[1]
                for line in Path(f"/proc/{worker.pid}/status").read_text().splitlines()
                if line.startswith("VmRSS")
            )
        )
        amqp_queue = f"{prefix}.ojs.queue.{queue}" if mode == "ojs" else queue
        unacked = fresh_unacked(management, amqp_queue)
        print(
            f"  {mode:5s} after {args.eta_wait:.0f}s: worker RSS {rss_kib / 1024:.0f} MiB, "
            f"{unacked} unacknowledged on the job queue"
        )
        return rss_kib / 1024, unacked
    finally:
        if worker is not None:
            worker.kill()
            worker.wait()
        cleanup(management, mode, prefix, queue)
        app.close()


def fresh_unacked(management, amqp_queue: str, window: float = 7.0) -> int:
    """``messages_unacknowledged`` after one full statistics interval (the management API samples)."""
    deadline = time.monotonic() + window
    sample = None
    while time.monotonic() < deadline or sample is None:
        sample = management.queue(amqp_queue) or {}
        time.sleep(0.5)
    return int(sample.get("messages_unacknowledged", 0))


def cleanup(management, mode, prefix, queue) -> None:
    if mode == "ojs":
        management.delete_by_prefix(prefix + ".")
    else:
        management.delete_queue(queue)
        management.delete_exchange(queue)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("OJS_AMQP_URL", DEFAULT_URL))
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--eta-tasks", type=int, default=20_000)
    parser.add_argument("--eta-wait", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--prefetch", type=int, default=4, help="worker_prefetch_multiplier (both transports)")
    parser.add_argument("--skip-eta", action="store_true")
    # worker subprocess
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args)
        return

    from ojs_kombu.testing.management import ManagementClient

    management = ManagementClient(os.environ.get("OJS_MANAGEMENT_URL", "http://localhost:15672"))
    print(
        f"throughput: {args.tasks} no-op tasks, threads pool concurrency={args.concurrency}, "
        f"prefetch multiplier={args.prefetch}, acks_late"
    )
    stock = throughput("stock", args.url, management, args)
    ojs = throughput("ojs", args.url, management, args)
    print(f"  ratio OJS/stock: {ojs / stock:.2f}x")
    if not args.skip_eta:
        print(f"countdown=600: {args.eta_tasks} tasks, worker observed for {args.eta_wait:.0f}s")
        countdown("stock", args.url, management, args)
        countdown("ojs", args.url, management, args)


if __name__ == "__main__":
    main()
