"""Celery over stock ``pyamqp://`` vs over ``ojs://``: drain rate, and ETA tasks in the worker.

1. **Throughput.**  ``--tasks`` (5,000) no-op tasks are published, then one
   ``celery worker`` (a subprocess) drains them with identical settings for both
   transports: prefetch multiplier (4), ``acks_late``, ``ignore_result``; for each
   pool of ``--pools``: ``prefork`` with ``-c 2`` and ``threads`` with ``-c 4``.
   The two transports alternate over ``--rounds`` (3) pairs per pool (``pairs.py``).
   Prints each drain rate, the worker's CPU time per task (the worker process and
   its pool children; steadier than the rate on a shared machine; and the main
   process's share: with prefork it reads the broker, feeds the pool and acks,
   and is the bottleneck), the broker's CPU time per task over the same drain
   when the broker runs on this machine (the ``os_pid`` its management API
   reports, a local ``beam.smp``), and, per pool, the median ratio (target:
   OJS >= 1.0x) and the median CPU per task of the whole system (worker and
   broker), the steadier of the two: the same worker against itself moved ~8 %
   on the rate and ~2 % on it in one sitting of 5 pairs.
   ``--queue-type quorum`` makes both sides' task queue a quorum queue: stock Celery
   through ``task_queues`` with ``x-queue-type`` (Celery >= 5.5 then turns global QoS
   off), ``ojs://`` through its ``queue_type`` transport option.
2. **Countdown.**  ``--eta-tasks`` (20,000) tasks with ``countdown=600`` are
   published, a worker runs for ``--eta-wait`` seconds, then its RSS and the
   queue's unacknowledged count are read: stock Celery prefetches every ETA task
   and holds it unacked in memory; over OJS they wait in the scheduling cascade.
3. **A change against a baseline.**  ``--baseline PATH`` (another checkout of this
   repository, e.g. ``git worktree add ../base main``) compares two versions of
   ``ojs://`` instead of ``ojs://`` and stock: the worker of one side imports
   ``ojs_kombu`` and ``ojs_celery`` from this tree, the other's from PATH, alternated
   as above (the tasks are published by this tree's code for both).  Two versions of
   our code differ by less than the machine's speed moves between sittings, so a
   change is measured against its baseline in the same minutes.
4. **Effectively-once.**  ``--deduplicate`` compares ``ojs://`` with the transport option
   ``deduplicate`` (each success recorded in ``ojs.stream.completed.{q}``, confirmed, before its
   ack) against ``ojs://`` without it, alternated as above.

Run against a broker with the management plugin::

    OJS_AMQP_URL=amqp://guest:guest@localhost:5672// OJS_MANAGEMENT_URL=http://localhost:15672 \\
        python benchmarks/celery_throughput.py

Everything is declared under a unique prefix / queue name and deleted afterwards.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote, urlsplit

from pairs import alternate, report_ratio

HERE = Path(__file__).resolve()
DEFAULT_URL = "amqp://guest:guest@localhost:5672//"
CONCURRENCY = {"prefork": 2, "threads": 4}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
QUEUE_TYPE_VARIABLE = "OJS_BENCH_QUEUE_TYPE"  # --queue-type, read by the worker subprocesses too


def worker_settings(queue: str, concurrency: int, prefetch: int) -> dict:
    """The Celery settings both sides of a Celery benchmark run with (also ``delayed.py``'s)."""
    return dict(
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


def make_app(mode: str, url: str, queue: str, prefix: str, concurrency: int, prefetch: int):
    """The benchmark's Celery app; the same settings for both transports."""
    settings = worker_settings(queue, concurrency, prefetch)
    queue_type = os.environ.get(QUEUE_TYPE_VARIABLE) or None
    if mode.startswith("ojs"):
        from ojs_celery import Celery

        options = {"prefix": prefix} | ({"queue_type": queue_type} if queue_type else {})
        if mode == "ojs-dedupe":
            options["deduplicate"] = True
        app = Celery("bench", broker=url, broker_backend="ojs", broker_transport_options=options, **settings)
    else:
        from celery import Celery
        from kombu import Queue

        if queue_type:  # Celery >= 5.5 then turns global QoS off (worker_detect_quorum_queues)
            settings["task_queues"] = [Queue(queue, queue_arguments={"x-queue-type": queue_type})]
        app = Celery("bench", broker=url, **settings)

    app.task(name="bench.noop")(_noop)
    return app


def _noop(i):
    return None


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` alone (from /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and all its descendants (from /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
        children = " ".join(path.read_text() for path in Path(f"/proc/{pid}/task").glob("*/children")).split()
    except OSError:  # the process just exited
        return 0.0
    return total + sum(tree_cpu_seconds(int(child)) for child in children)


def local_broker_pid(url: str, management) -> int | None:
    """The OS pid of the RabbitMQ node the management API answers for, when it runs on this machine.

    The node reports it (``os_pid``); it counts when the AMQP URL is a loopback address and the pid
    is a local ``beam.smp``.  None otherwise, or when the API cannot say.
    """
    from ojs_kombu.amqp.management import ManagementError

    if urlsplit(url).hostname not in ("localhost", "127.0.0.1", "::1"):
        return None
    try:
        node = management.overview()["node"]
        pid = int(management.request("GET", f"/api/nodes/{quote(node, safe='')}")["os_pid"])
        local = Path(f"/proc/{pid}/comm").read_text().strip() == "beam.smp"
    except (ManagementError, KeyError, TypeError, ValueError, OSError):
        return None
    return pid if local else None


def run_worker(args) -> None:
    """The worker subprocess: count finished tasks, print the drain time, exit.

    The counters live in shared memory so that prefork's pool processes (forked
    from this one) update the same ones; the child that runs the last task reports.
    """
    from celery import signals

    app = make_app(args.mode, args.url, args.queue, args.prefix, args.concurrency, args.prefetch)
    root = os.getpid()
    done = multiprocessing.Value("q", 0)
    first = multiprocessing.Value("d", 0.0, lock=False)
    cpu = multiprocessing.Value("d", 0.0, lock=False)
    main_cpu = multiprocessing.Value("d", 0.0, lock=False)
    broker_cpu = multiprocessing.Value("d", 0.0, lock=False)
    broker = args.broker_pid

    @signals.task_prerun.connect
    def started(**_):
        if first.value == 0.0:
            with done.get_lock():
                if first.value == 0.0:
                    cpu.value = tree_cpu_seconds(root)
                    main_cpu.value = process_cpu_seconds(root)
                    broker_cpu.value = process_cpu_seconds(broker) if broker else 0.0
                    first.value = time.perf_counter()

    @signals.task_postrun.connect
    def finished(**_):
        with done.get_lock():
            done.value += 1
            last = done.value == args.count
        if last:
            elapsed = time.perf_counter() - first.value
            # The worker redirects sys.stdout to its logger: write to the pipe itself.
            total, main = tree_cpu_seconds(root) - cpu.value, process_cpu_seconds(root) - main_cpu.value
            beam = process_cpu_seconds(broker) - broker_cpu.value if broker else -1.0
            os.write(1, f"DRAINED {elapsed:.4f} {total:.4f} {main:.4f} {beam:.4f}\n".encode())

    print("READY", flush=True)
    app.worker_main(
        [
            "worker",
            f"--pool={args.pool}",
            f"--concurrency={args.concurrency}",
            "--loglevel=WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-n",
            f"bench-{uuid.uuid4().hex[:6]}@%h",
        ]
    )


def stop_worker(worker: subprocess.Popen) -> None:
    """Kill the worker and its pool processes (its own session)."""
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    worker.wait(timeout=60)


def spawn_worker(mode, url, queue, prefix, concurrency, prefetch, count, pool="threads", broker_pid=None, root=None):
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE),
            "--worker",
            "--pool",
            pool,
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
            "--broker-pid",
            str(broker_pid or 0),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(root or HERE.parent.parent), os.environ.get("PYTHONPATH")])
            ),
        },
    )


def publish(app, count: int, **options) -> float:
    noop = app.tasks["bench.noop"]
    start = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for i in range(count):
            noop.apply_async((i,), producer=producer, **options)
    return time.perf_counter() - start


#: CPU seconds per task of the whole system (worker and broker) of each drain, by side label.
SYSTEM_CPU: dict[str, list[float]] = {}


def throughput(mode, url, management, args, pool, root=None, label=None) -> float:
    """Publish ``args.tasks`` tasks, drain them with one worker, return its rate (tasks/s).

    ``root``: the tree the worker imports our packages from (default: this one); ``label``: the
    side's name in the output (default: ``mode``).
    """
    label = label or mode
    prefix, queue = f"bench{uuid.uuid4().hex[:8]}", f"bench-{mode}-{uuid.uuid4().hex[:6]}"
    concurrency = CONCURRENCY[pool]
    app = make_app(mode, url, queue, prefix, concurrency, args.prefetch)
    try:
        elapsed = publish(app, args.tasks)
        print(f"  {label:5s} published {args.tasks} in {elapsed:.1f}s ({args.tasks / elapsed:,.0f}/s)")
        worker = spawn_worker(
            mode, url, queue, prefix, concurrency, args.prefetch, args.tasks, pool, args.broker_pid, root
        )
        drained = cpu = main_cpu = broker_cpu = None
        try:
            for line in worker.stdout:
                if line.startswith("DRAINED"):
                    drained, cpu, main_cpu, broker_cpu = (float(word) for word in line.split()[1:5])
                    break
        finally:
            stop_worker(worker)
        if drained is None:
            sys.exit(f"the {mode} {pool} worker exited before draining {args.tasks} tasks")
        rate = args.tasks / drained
        broker = ""
        if broker_cpu >= 0:
            broker = f"; broker CPU {broker_cpu / args.tasks * 1e6:.0f} µs"
            SYSTEM_CPU.setdefault(f"{label} {pool}", []).append((cpu + broker_cpu) / args.tasks)
        print(
            f"  {label:5s} drained   {args.tasks} in {drained:.2f}s ({rate:,.0f} tasks/s; "
            f"worker CPU {cpu / args.tasks * 1e6:.0f} µs per task, of which the main process "
            f"{main_cpu / args.tasks * 1e6:.0f} µs{broker})"
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
            stop_worker(worker)
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
    if mode.startswith("ojs"):
        management.delete_by_prefix(prefix + ".")
    else:
        management.delete_queue(queue)
    # Celery declares its default exchange, named after the queue, over ojs:// too.
    management.delete_exchange(queue)


def report_system_cpu(ours: str, reference: str) -> None:
    """Print the median CPU per task of the whole system (worker and broker) for both sides, if measured."""
    if ours in SYSTEM_CPU and reference in SYSTEM_CPU:
        a, b = statistics.median(SYSTEM_CPU[ours]), statistics.median(SYSTEM_CPU[reference])
        print(
            f"  CPU per task, worker and broker (median): {ours} {a * 1e6:.0f} µs, {reference} {b * 1e6:.0f} µs "
            f"({b / a:.2f}x as much for {reference})",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("OJS_AMQP_URL", DEFAULT_URL))
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3, help="alternated pairs per pool")
    parser.add_argument("--pools", default="prefork,threads", help="comma-separated: prefork, threads")
    parser.add_argument("--eta-tasks", type=int, default=20_000)
    parser.add_argument("--eta-wait", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=4, help="the countdown phase's (threads pool)")
    parser.add_argument("--prefetch", type=int, default=4, help="worker_prefetch_multiplier (both transports)")
    parser.add_argument("--skip-eta", action="store_true")
    parser.add_argument(
        "--queue-type",
        choices=["classic", "quorum"],
        default=None,
        help="both sides' task queue: stock with x-queue-type, ojs:// with the queue_type option",
    )
    parser.add_argument(
        "--deduplicate", action="store_true", help="compare ojs:// with deduplicate against ojs:// without it"
    )
    parser.add_argument(
        "--baseline", type=Path, help="another checkout of this repository: compare ojs:// here with ojs:// there"
    )
    # worker subprocess
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--pool", default="threads", help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--broker-pid", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args)
        return
    if args.queue_type:
        os.environ[QUEUE_TYPE_VARIABLE] = args.queue_type

    from ojs_kombu.amqp.management import ManagementClient

    management = ManagementClient(os.environ.get("OJS_MANAGEMENT_URL", "http://localhost:15672"))
    args.broker_pid = local_broker_pid(args.url, management)  # the drains' workers read its CPU
    for pool in args.pools.split(","):
        print(
            f"throughput: {args.tasks} no-op tasks, {pool} pool -c {CONCURRENCY[pool]}, "
            f"prefetch multiplier={args.prefetch}, acks_late, results ignored, {args.rounds} alternated rounds"
        )
        if args.deduplicate:
            rates = alternate(
                [
                    (f"dedupe {pool}", lambda pool=pool: throughput("ojs-dedupe", args.url, management, args, pool)),
                    (f"ojs {pool}", lambda pool=pool: throughput("ojs", args.url, management, args, pool)),
                ],
                rounds=args.rounds,
                unit=" tasks/s",
            )
            report_ratio(rates, f"dedupe {pool}", f"ojs {pool}", "")
            report_system_cpu(f"dedupe {pool}", f"ojs {pool}")
            continue
        if args.baseline:
            reference = (
                f"base {pool}",
                lambda pool=pool: throughput("ojs", args.url, management, args, pool, args.baseline.resolve(), "base"),
            )
        else:
            reference = (f"stock {pool}", lambda pool=pool: throughput("stock", args.url, management, args, pool))
        rates = alternate(
            [(f"ojs {pool}", lambda pool=pool: throughput("ojs", args.url, management, args, pool)), reference],
            rounds=args.rounds,
            unit=" tasks/s",
        )
        report_ratio(rates, f"ojs {pool}", reference[0], "" if args.baseline else "target >= 1.0x")
        report_system_cpu(f"ojs {pool}", reference[0])
    if not args.skip_eta and not args.baseline and not args.deduplicate:
        print(f"countdown=600: {args.eta_tasks} tasks, worker observed for {args.eta_wait:.0f}s")
        countdown("stock", args.url, management, args)
        countdown("ojs", args.url, management, args)


if __name__ == "__main__":
    main()
