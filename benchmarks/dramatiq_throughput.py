"""Dramatiq over OJS vs Dramatiq's own RabbitmqBroker, in one run.

    python benchmarks/dramatiq_throughput.py [--messages 5000] [--rounds 3] [--threads 8] [--skip-delayed]
    python benchmarks/dramatiq_throughput.py --per-job
    python benchmarks/dramatiq_throughput.py --queue-type quorum   # every side on quorum queues

``--per-job`` only prints what the consumer side costs per message in our code, in-process and
without a broker (µs of thread CPU, min of 9 × 5,000 calls; steady on a loaded machine): the
lifecycle events ``started`` + ``succeeded`` with a worker's subscribers (``worker_lifecycle``:
``Activity``, the job metrics), ``Cancellations.enter`` + ``leave``, ``job_to_message``, and
``OjsRunning``'s whole round (its before and after hooks, with all of these).

1. Throughput: ``--messages`` no-op messages (``max_retries=0``) are sent one by
   one with ``actor.send()`` (enqueue rate), then drained by an **in-process**
   ``dramatiq.Worker(worker_threads=--threads)`` (drain rate: from the worker's
   start until the last message ran; 8 threads, as many as ``dramatiq -p 2 -t 4``
   has, in one process), over OjsBroker (confirms always on) and RabbitmqBroker
   with and without ``confirm_delivery``; with each drain, the time until its first message ran
   (start-up: connections, declarations) and the process's CPU per message (``os.times``, the
   steadier figure on a loaded machine).  The three sides rotate over
   ``--rounds`` rounds (``pairs.py``); the median drain ratios are printed.
   Also the rate of ``OjsBroker.enqueue_many`` (pipelined confirms), once.
   Targets: OJS drain >= 1.0x stock with confirms and >= 0.9x stock without.
2. Delayed backlog: ``--delayed`` messages sent with ``delay=600000`` (10 min),
   then a worker process (same settings) runs for ``--settle`` seconds: its RSS
   and the number of messages it holds unacknowledged (management API).
   Stock Dramatiq moves them into worker memory (``.DQ`` prefetch); OJS keeps
   them in the broker's scheduling cascade.

Needs ``$OJS_AMQP_URL`` and ``$OJS_MANAGEMENT_URL`` (``make bench`` style:
``python -m ojs_kombu.testing.broker run -- python benchmarks/dramatiq_throughput.py``).
Every queue the run creates is deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from urllib.parse import quote, urlsplit, urlunsplit

import dramatiq
from dramatiq.brokers.rabbitmq import DEAD_MESSAGE_TTL, RabbitmqBroker, xq_name
from dramatiq.message import Message
from pairs import alternate, report_ratio

from ojs_dramatiq import OjsBroker
from ojs_dramatiq.encoder import job_to_message, message_to_job
from ojs_dramatiq.running import OjsRunning, RunningMessage
from ojs_kombu.amqp.connection import resolve_url
from ojs_kombu.amqp.management import ManagementClient
from ojs_kombu.model.job import Job
from ojs_kombu.runtime.activity import worker_lifecycle
from ojs_kombu.runtime.control import Cancellations

DELAY_MS = 600_000


def _args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-delayed", action="store_true", help="only the throughput part")
    parser.add_argument("--delayed", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--settle", type=float, default=15.0, help="seconds the delayed-backlog worker runs")
    parser.add_argument("--url", default=None, help="broker URL (default $OJS_AMQP_URL)")
    parser.add_argument(
        "--queue-type",
        choices=["classic", "quorum"],
        default=None,
        help="every side's queues: OjsBroker's queue_type, RabbitmqBroker's queues declared with x-queue-type",
    )
    parser.add_argument("--per-job", action="store_true", help="only the in-process costs per message (no broker)")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "NAME", "THREADS"), help=argparse.SUPPRESS)
    return parser.parse_args()


def pika_url(url: str) -> str:
    """kombu's ``amqp://u:p@h:port//`` -> pika's ``amqp://u:p@h:port/%2F``."""
    parts = urlsplit(url)
    vhost = parts.path[1:] or "/"
    return urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), "", ""))


QUEUE_TYPE_VARIABLE = "OJS_BENCH_QUEUE_TYPE"  # --queue-type, read by the delayed backlog's worker process too


class QuorumRabbitmqBroker(RabbitmqBroker):
    """``RabbitmqBroker`` with its three queues per actor queue (``q``, ``q.DQ``, ``q.XQ``) declared quorum.

    Dramatiq has no queue-type option; its arguments otherwise stay as they are (at-most-once
    dead-lettering into ``.XQ``).
    """

    def _build_queue_arguments(self, queue_name):
        return {**super()._build_queue_arguments(queue_name), "x-queue-type": "quorum"}

    def _declare_xq_queue(self, queue_name):
        return self.channel.queue_declare(
            queue=xq_name(queue_name),
            durable=True,
            arguments={"x-message-ttl": DEAD_MESSAGE_TTL, "x-queue-type": "quorum"},
        )


def make_broker(kind: str, url: str, name: str) -> dramatiq.Broker:
    """``kind``: ``stock`` / ``stock-confirm`` (RabbitmqBroker, queue ``name``) or ``ojs`` (prefix ``name``)."""
    queue_type = os.environ.get(QUEUE_TYPE_VARIABLE) or None
    if kind == "ojs":
        return OjsBroker(url, prefix=name, queue_type=queue_type)
    stock = QuorumRabbitmqBroker if queue_type == "quorum" else RabbitmqBroker
    return stock(url=pika_url(url), confirm_delivery=kind == "stock-confirm")


def queue_name(kind: str, name: str) -> str:
    return "bench" if kind == "ojs" else name


class Counter:
    def __init__(self):
        self.value = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.target = None
        self.first: float | None = None  # perf_counter() when the first message ran

    def incr(self) -> None:
        with self.lock:
            if self.first is None:
                self.first = time.perf_counter()
            self.value += 1
            if self.value == self.target:
                self.done.set()


def cpu_seconds() -> float:
    """This process's CPU time so far (user + system, every thread)."""
    times = os.times()
    return times.user + times.system


def throughput(kind: str, url: str, count: int, threads: int) -> tuple[float, float, str, str]:
    """(enqueue rate, drain rate, queue prefix, what the drain cost: start-up ms and CPU µs per message)."""
    name = f"bench{uuid.uuid4().hex[:8]}"
    broker = make_broker(kind, url, name)
    counter = Counter()
    counter.target = count
    noop = dramatiq.actor(
        lambda i: counter.incr(), broker=broker, actor_name="noop", queue_name=queue_name(kind, name), max_retries=0
    )
    started = time.perf_counter()
    for i in range(count):
        noop.send(i)
    enqueue_rate = count / (time.perf_counter() - started)
    worker = dramatiq.Worker(broker, worker_threads=threads)
    cpu = cpu_seconds()
    started = time.perf_counter()
    worker.start()
    if not counter.done.wait(600):
        sys.exit(f"{kind}: only {counter.value} of {count} messages ran")
    drain_rate = count / (time.perf_counter() - started)
    cost = (
        f"start-up {(counter.first - started) * 1000:.0f} ms, CPU {(cpu_seconds() - cpu) / count * 1e6:.0f} µs/message"
    )
    worker.stop()
    broker.close()
    return enqueue_rate, drain_rate, name, cost


def enqueue_many_rate(url: str, count: int) -> tuple[float, str]:
    name = f"bench{uuid.uuid4().hex[:8]}"
    broker = OjsBroker(url, prefix=name, queue_type=os.environ.get(QUEUE_TYPE_VARIABLE) or None)
    noop = dramatiq.actor(lambda i: None, broker=broker, actor_name="noop", queue_name="bench")
    broker.declare_queue("bench", ensure=True)
    started = time.perf_counter()
    broker.enqueue_many(noop.message(i) for i in range(count))
    rate = count / (time.perf_counter() - started)
    broker.close()
    return rate, name


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def delayed_backlog(
    kind: str, url: str, management: ManagementClient, count: int, threads: int, settle: float
) -> tuple[int, int, int, str]:
    """(worker RSS KiB without backlog, with backlog, messages unacked) for ``count`` messages delayed 10 min."""
    name = f"bench{uuid.uuid4().hex[:8]}"
    idle = _worker_rss(kind, url, name, threads, settle / 3, management, name)[0]
    broker = make_broker(kind, url, name)
    noop = dramatiq.actor(lambda: None, broker=broker, actor_name="noop", queue_name=queue_name(kind, name))
    if isinstance(broker, OjsBroker):
        for start in range(0, count, 5000):
            broker.enqueue_many([noop.message() for _ in range(start, min(count, start + 5000))], delay=DELAY_MS)
    else:
        for _ in range(count):
            noop.send_with_options(delay=DELAY_MS)
    broker.close()
    rss, unacked = _worker_rss(kind, url, name, threads, settle, management, name)
    return idle, rss, unacked, name


def _worker_rss(kind, url, name, threads, settle, management, prefix) -> tuple[int, int]:
    child = subprocess.Popen([sys.executable, __file__, "--url", url, "--child", kind, name, str(threads)])
    try:
        time.sleep(settle)
        rss = rss_kib(child.pid)
        unacked = sum(q.get("messages_unacknowledged", 0) for q in management.queues(prefix))
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(120)
    return rss, unacked


def run_child(kind: str, url: str, name: str, threads: int) -> None:
    broker = make_broker(kind, url, name)
    dramatiq.actor(lambda: None, broker=broker, actor_name="noop", queue_name=queue_name(kind, name))
    worker = dramatiq.Worker(broker, worker_threads=threads)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    worker.start()
    stop.wait()
    worker.stop(timeout=30_000)
    broker.close()


def per_job_costs(count: int = 5_000, repeat: int = 9) -> None:
    """Print the in-process costs per message of the consumer side (see the module docstring)."""
    jobs = [
        Job.from_json(message_to_job(Message("default", "noop", (i,), {}, {})).to_json(), strict=False)
        for i in range(count)
    ]
    lifecycle, _ = worker_lifecycle("bench.1.abcdef")
    cancellations = Cancellations()
    running = OjsRunning(cancellations, lifecycle)

    def events() -> None:
        for job in jobs:
            lifecycle.emit("started", job, 1)
            lifecycle.emit("succeeded", job, 1)

    def enter_leave() -> None:
        for job in jobs:
            cancellations.leave(cancellations.enter(job.id, job.queue, aliases=(job.id[:8],)))

    def to_message() -> None:
        for job in jobs:
            job_to_message(job, "default")

    def middleware() -> None:
        for job in jobs:
            message = RunningMessage(job_to_message(job, "default"), job, None)  # no delivery: never settled here
            running.before_process_message(None, message)
            running.after_process_message(None, message)

    for label, run in (
        ("lifecycle started + succeeded (worker_lifecycle)", events),
        ("Cancellations.enter + leave", enter_leave),
        ("job_to_message", to_message),
        ("OjsRunning round (all of the above + RunningMessage)", middleware),
    ):
        best = min(_thread_cpu(run) for _ in range(repeat))
        print(f"  {label:<55} {best / count * 1e6:6.2f} µs", flush=True)


def _thread_cpu(run) -> float:
    started = time.thread_time()
    run()
    return time.thread_time() - started


def main() -> None:
    args = _args()
    if args.per_job:
        per_job_costs()
        return
    url = resolve_url(args.url)
    if args.queue_type:
        os.environ[QUEUE_TYPE_VARIABLE] = args.queue_type
    if args.child:
        run_child(args.child[0], url, args.child[1], int(args.child[2]))
        return
    management = ManagementClient(
        os.environ.get("OJS_MANAGEMENT_URL", "http://127.0.0.1:15672"),
        os.environ.get("OJS_MANAGEMENT_USER", "guest"),
        os.environ.get("OJS_MANAGEMENT_PASSWORD", "guest"),
    )
    created: list[str] = []
    try:
        print(
            f"1. {args.messages:,} no-op messages, in-process worker_threads={args.threads}, "
            f"{args.rounds} rotated rounds, {os.cpu_count()} cores"
        )

        def side(kind: str):
            def run() -> float:
                enqueue, drain, name, cost = throughput(kind, url, args.messages, args.threads)
                created.append(name)
                print(f"  {kind:<13} enqueue (send() one by one) {enqueue:,.0f}/s; drain: {cost}", flush=True)
                return drain  # the rate compared

            return run

        labels = {
            "ojs": "OjsBroker",
            "stock-confirm": "RabbitmqBroker(confirm_delivery=True)",
            "stock": "RabbitmqBroker(confirm_delivery=False)",
        }
        rates = alternate([(label, side(kind)) for kind, label in labels.items()], rounds=args.rounds)
        report_ratio(rates, labels["ojs"], labels["stock-confirm"], "target >= 1.0x")
        report_ratio(rates, labels["ojs"], labels["stock"], "target >= 0.9x")
        many, name = enqueue_many_rate(url, args.messages)
        created.append(name)
        print(f"   {'OjsBroker.enqueue_many':<40} {many:>10,.0f}/s")
        if args.skip_delayed:
            return

        print(f"2. {args.delayed:,} messages delayed 10 min, a worker process running {args.settle:.0f}s")
        print(f"   {'broker':<40} {'RSS idle':>10} {'RSS':>10} {'unacked':>8}")
        for kind, label in (("stock", "RabbitmqBroker"), ("ojs", "OjsBroker")):
            idle, rss, unacked, name = delayed_backlog(kind, url, management, args.delayed, args.threads, args.settle)
            created.append(name)
            print(f"   {label:<40} {idle / 1024:>8.1f}MB {rss / 1024:>8.1f}MB {unacked:>8,}", flush=True)
    finally:
        for name in created:
            management.delete_by_prefix(name)


if __name__ == "__main__":
    main()
