"""A delayed backlog on quorum queues: stock Celery's native delayed delivery vs Celery over ``ojs://``.

    python benchmarks/delayed.py [--tasks 2000] [--window 20] [--offset 5] [--rounds 3]

Both sides are Celery apps with one quorum task queue and a ``threads`` worker (a
subprocess, ``-c --concurrency``, ``worker_prefetch_multiplier`` ``--prefetch``,
``acks_late``, results ignored):

* **stock**: ``pyamqp://``, the task queue declared through ``task_queues`` with
  ``x-queue-type: quorum`` and bound to a *topic* exchange.  Celery >= 5.5 then uses its
  native delayed delivery (``kombu.transport.native_delayed_delivery``): the worker's
  ``DelayedDelivery`` bootstep declares 28 ``celery_delayed_<level>`` queues
  (``broker_native_delayed_delivery_queue_type``, quorum here) and their topic exchanges,
  and ``send_task`` publishes a countdown/ETA task to ``celery_delayed_27`` with the
  delay's bits, in whole seconds (``int(countdown)``), in the routing key.  With a
  *direct* exchange (Celery's default) it logs a warning and the worker holds every ETA
  task unacknowledged in memory instead, as on classic queues.
* **ojs**: ``ojs_celery`` with ``broker_transport_options={"queue_type": "quorum"}``: an ETA
  is the OJS ``scheduled_at`` and the job waits in the library's scheduling cascade.

Each run starts a fresh worker, waits until it is ready (the stock worker declares the
delay queues and binds the task queue at start-up), then publishes ``--tasks`` tasks with
``eta`` spread uniformly over ``--window`` seconds starting ``--offset`` seconds ahead,
in the order they fall due (so publishing does not delay the first ones).  While the
backlog waits the benchmark samples, about once a second, the worker's RSS and the task
queue's unacknowledged count (management API), and the messages waiting in the broker's
delay queues (their maxima are reported).  Each task records ``time.time() - due`` when it starts; per run: how many
ran early (before their ETA), the lateness p50 / p95 / p99 / max, and the largest
lateness of the first 10 tasks due (those that meet a cold path: the first use of a
delay queue, a fresh connection).  The worker also records when its consumer received each
task (Celery's ``task_received``) against the ETA: how many reached it after their ETA, and
the p50 / p99 of that arrival (negative: early, the worker then holds the task unacknowledged
until its ETA), which tells the broker's part of the lateness from the worker's.  The two sides
alternate over ``--rounds`` rounds (``pairs.py``'s order); printed: each run, then per
side the median and the spread (min–max) of each figure over the rounds.

Needs ``$OJS_AMQP_URL`` and ``$OJS_MANAGEMENT_URL`` of a RabbitMQ >= 3.10 (quorum
queues with message TTL; 4.x for the figures in ``docs/performance.md``), e.g.
``python -m ojs_kombu.testing.broker run --rabbitmq 4.3 -- python benchmarks/delayed.py``.
Every queue and exchange the run declares is deleted at the end, including Celery's
``celery_delayed_*`` queues and exchanges (their names are fixed: do not run this
against a broker where another Celery app uses native delayed delivery).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from celery_throughput import worker_settings
from pairs import load
from schedule import percentile

HERE = Path(__file__).resolve()
LEVELS = 28  # kombu.transport.native_delayed_delivery.MAX_NUMBER_OF_BITS_TO_USE
SIDES = ("stock", "ojs")


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--window", type=float, default=20.0, help="ETAs spread over this many seconds")
    parser.add_argument("--offset", type=float, default=5.0, help="the first ETA this many seconds ahead")
    parser.add_argument("--rounds", type=int, default=3, help="runs per side, alternated")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--prefetch", type=int, default=4, help="worker_prefetch_multiplier (both sides)")
    parser.add_argument("--url", default=os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@localhost:5672//"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args()


def make_app(mode: str, url: str, queue: str, prefix: str, concurrency: int, prefetch: int):
    """The side's Celery app: one quorum task queue, the same worker settings for both."""
    settings = worker_settings(queue, concurrency, prefetch)
    if mode == "ojs":
        from ojs_celery import Celery

        options = {"prefix": prefix, "queue_type": "quorum"}
        app = Celery("bench", broker=url, broker_backend="ojs", broker_transport_options=options, **settings)
    else:
        from celery import Celery
        from kombu import Exchange, Queue

        # Native delayed delivery needs a topic (or fanout) exchange; with Celery's default
        # direct exchange the ETA tasks would wait unacked in the worker.
        exchange = Exchange(queue, type="topic")
        settings["task_queues"] = [
            Queue(queue, exchange, routing_key=queue, queue_arguments={"x-queue-type": "quorum"})
        ]
        settings["task_default_exchange"] = queue
        settings["task_default_exchange_type"] = "topic"
        settings["task_default_routing_key"] = queue
        settings["broker_native_delayed_delivery_queue_type"] = "quorum"
        app = Celery("bench", broker=url, **settings)
    return app


def run_worker(args: argparse.Namespace) -> None:
    """The worker subprocess: each task appends its lateness (seconds) to ``args.out``."""
    from celery import signals

    app = make_app(args.mode, args.url, args.queue, args.prefix, args.concurrency, args.prefetch)
    out = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    @app.task(name="bench.delayed")
    def delayed(i: int, due: float) -> None:
        os.write(out, f"{i} {time.time() - due:.6f}\n".encode())

    arrivals = os.open(args.out + ".arrivals", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    @signals.task_received.connect
    def received(request, **_):  # the worker's consumer has the delivery: how long before its ETA
        i, due = request.args[:2]
        os.write(arrivals, f"{i} {time.time() - due:.6f}\n".encode())

    @signals.worker_ready.connect
    def ready(**_):
        os.write(1, b"READY\n")  # the worker redirects sys.stdout to its logger

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


def spawn_worker(mode: str, args: argparse.Namespace, queue: str, prefix: str, out: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(HERE), "--worker", "--mode", mode, "--url", args.url, "--queue", queue]
        + ["--prefix", prefix, "--out", out, "--concurrency", str(args.concurrency), "--prefetch", str(args.prefetch)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent.parent), os.environ.get("PYTHONPATH")])),
        },
    )


def stop_worker(worker: subprocess.Popen) -> None:
    """Kill the worker (its own session) and reap it."""
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    worker.wait(timeout=60)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0


def lines(path: str) -> dict[int, float]:
    """``{task index: lateness in seconds}`` of the tasks that ran (by due order)."""
    return {int(i): float(v) for i, v in (line.split() for line in Path(path).read_text().splitlines())}


def one_run(mode: str, args: argparse.Namespace, management) -> dict[str, float]:
    """One side once: a fresh queue and worker, the backlog, its figures."""
    prefix, queue = f"bench{uuid.uuid4().hex[:8]}", f"bench-{mode}-{uuid.uuid4().hex[:6]}"
    job_queue = f"{prefix}.ojs.queue.{queue}" if mode == "ojs" else queue
    out = tempfile.NamedTemporaryFile(prefix="ojs-delayed-", delete=False).name
    app = make_app(mode, args.url, queue, prefix, args.concurrency, args.prefetch)
    worker = spawn_worker(mode, args, queue, prefix, out)
    try:
        if not any(line.strip() == "READY" for line in worker.stdout):  # after Celery's banner
            sys.exit(f"the {mode} worker did not start")
        idle_rss = rss_mib(worker.pid)
        start = time.time() + args.offset
        due = sorted(start + random.uniform(0, args.window) for _ in range(args.tasks))
        began = time.perf_counter()
        with app.producer_or_acquire() as producer:
            for i, when in enumerate(due):
                app.send_task("bench.delayed", (i, when), eta=datetime.fromtimestamp(when, UTC), producer=producer)
        publish_s = time.perf_counter() - began
        max_unacked = max_rss = 0.0
        waiting_in_broker = 0
        deadline = due[-1] + 30
        while time.time() < deadline:
            done = len(lines(out))
            if done >= args.tasks:
                break
            sample = management.queue(job_queue) or {}
            max_unacked = max(max_unacked, int(sample.get("messages_unacknowledged", 0)))
            max_rss = max(max_rss, rss_mib(worker.pid))
            waiting_in_broker = max(waiting_in_broker, delay_queue_messages(mode, prefix, job_queue, management))
            time.sleep(1.0)
        late = lines(out)
        arrived = lines(out + ".arrivals")
        if len(late) < args.tasks:
            sys.exit(f"{mode}: only {len(late)} of {args.tasks} tasks ran")
    finally:
        stop_worker(worker)
        cleanup(mode, prefix, queue, management)
        app.close()
        for path in (out, out + ".arrivals"):
            if os.path.exists(path):
                os.unlink(path)
    ms = [v * 1000 for v in late.values()]
    first_due = [late[i] * 1000 for i in range(min(10, args.tasks))]
    figures = {
        "early": sum(v < 0 for v in ms),
        "p50": percentile(ms, 50),
        "p95": percentile(ms, 95),
        "p99": percentile(ms, 99),
        "max": max(ms),
        "max of first 10": max(first_due),
        "arrived late": sum(v > 0 for v in arrived.values()),
        "arrival p50": percentile([v * 1000 for v in arrived.values()], 50),
        "arrival p99": percentile([v * 1000 for v in arrived.values()], 99),
        "max unacked": max_unacked,
        "max in delay queues": waiting_in_broker,
        "idle RSS": idle_rss,
        "max RSS": max_rss,
        "publish s": publish_s,
    }
    print(
        f"  {mode:5s} early {figures['early']:.0f}, lateness p50 {figures['p50']:.1f} / p95 {figures['p95']:.1f} / "
        f"p99 {figures['p99']:.1f} / max {figures['max']:.1f} ms (first 10 due: max {max(first_due):.1f}); "
        f"{figures['arrived late']:.0f} reached the worker after their ETA "
        f"(arrival p50 {figures['arrival p50']:+.1f} / p99 {figures['arrival p99']:+.1f} ms); unacked max {max_unacked:.0f}; "
        f"max {waiting_in_broker} in delay queues; RSS {idle_rss:.1f} -> max {max_rss:.1f} MiB; "
        f"published in {publish_s:.1f}s  (load {load():.2f})",
        flush=True,
    )
    return figures


def delay_queue_messages(mode: str, prefix: str, job_queue: str, management) -> int:
    """Messages (ready + unacked) in the side's delay queues, the job queue excluded."""
    pattern = prefix + "." if mode == "ojs" else "celery_delayed_"
    return sum(int(q.get("messages", 0)) for q in management.queues(pattern) if q["name"] != job_queue)


def cleanup(mode: str, prefix: str, queue: str, management) -> None:
    if mode == "ojs":
        management.delete_by_prefix(prefix + ".")
    else:
        management.delete_queue(queue)
    management.delete_exchange(queue)  # Celery declares an exchange named after the queue, over ojs:// too


def delete_native_delayed_delivery(management) -> None:
    """Celery's fixed-name delay queues and exchanges (declared by the stock worker)."""
    for level in range(LEVELS):
        management.delete_queue(f"celery_delayed_{level}")
        management.delete_exchange(f"celery_delayed_{level}")
    management.delete_exchange("celery_delayed_delivery")


def main() -> None:
    args = _args()
    if args.worker:
        run_worker(args)
        return
    from ojs_kombu.amqp.management import ManagementClient

    management = ManagementClient(os.environ.get("OJS_MANAGEMENT_URL", "http://localhost:15672"))
    version = management.overview().get("rabbitmq_version", "?")
    print(
        f"RabbitMQ {version}: {args.tasks} tasks due {args.offset:.0f}–{args.offset + args.window:.0f}s ahead, "
        f"quorum queues, threads -c {args.concurrency}, prefetch multiplier {args.prefetch}, "
        f"{args.rounds} alternated rounds, {os.cpu_count()} cores"
    )
    results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    try:
        for index in range(args.rounds):
            shift = index % len(SIDES)
            for mode in SIDES[shift:] + SIDES[:shift]:
                results[mode].append(one_run(mode, args, management))
    finally:
        delete_native_delayed_delivery(management)
    print("median (min–max) over the rounds:")
    for key in results["ojs"][0]:
        cells = []
        for mode in SIDES:
            values = [r[key] for r in results[mode]]
            cells.append(f"{mode} {statistics.median(values):,.1f} ({min(values):,.1f}–{max(values):,.1f})")
        print(f"  {key:16s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
