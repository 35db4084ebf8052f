"""The control plane's costs (issue 11): cancel latency, INFO round trip, start-up replay, drain rate.

    python benchmarks/control.py [--samples 200] [--cancels 100000] [--rounds 6] [--skip-info] [--url amqp://…]

Runs against ``$OJS_AMQP_URL`` (``--url`` overrides it); without either, a broker
is provisioned by :func:`ojs_kombu.testing.broker.provision_broker` (a Docker
container or a private node).  Everything is declared under a unique prefix and
deleted at the end.  Four sections:

1. **Cancel to interrupt**: a Worker runs ``--concurrency`` jobs at once, all of
   them busy (``while True: pass``, interrupt mode) or all cooperative (waiting on
   ``current_job().cancelled``, ``cancel_running="cooperative"``).  One running
   job after the other is cancelled; the latency is from just before the
   ``Client.cancel()`` call to the moment its handler observes ``Cancelled`` (busy)
   or the event (cooperative); the cancelled job is then replaced, so the number
   of running jobs stays the same.  The cancels come from a client in another
   process.  p50/p99 of ``--samples`` cancels per kind.
2. **INFO round trip** (``--skip-info`` leaves it out): ``Client.info(job_id,
   queue=…, timeout=2.0)`` for a running job and for a finished one, p50/p99 of
   up to ``--info-samples`` calls, at most ``--info-budget`` seconds per kind.
3. **Start-up replay**: ``--cancels`` cancels are published to one control
   stream (pipelined, confirmed, on one channel), then a new Worker is timed
   from ``start()`` to ``wait_until_ready()``, against a Worker of a queue with an
   empty control stream (the reference), alternately, ``--replay-rounds`` times each.
4. **Drain rate**: ``benchmarks/worker.py``'s workload (``--drain-count`` no-op
   jobs, ``--concurrency`` threads), drained by a Worker with its control stream
   consumed and by one without, alternating the order each round, ``--rounds``
   rounds; the median of the per-round ratios.  "Without" has no public switch:
   the benchmark sets ``worker.consumer.control = None`` before ``start()``, so
   no control channel is opened and nothing is replayed; the per-job cancel
   bookkeeping (``Cancellations.running``, ``is_cancelled``) stays in both, and is
   timed on its own.  Target: within 5 %.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
import timeit
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import kombu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from schedule import percentile
from worker import bench_worker, load, noop_jobs

from ojs_kombu import Cancelled, Client, Job, Worker, current_job
from ojs_kombu.amqp.management import ManagementClient, ManagementError
from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.model.naming import Names
from ojs_kombu.runtime.control import Cancellations
from ojs_kombu.testing.broker import provision_broker
from ojs_kombu.wire.control import cancel_message


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200, help="cancels timed per kind (busy, cooperative)")
    parser.add_argument("--concurrency", type=int, default=4, help="handler threads (sections 1, 2 and 4)")
    parser.add_argument("--skip-info", action="store_true", help="leave out the INFO round trip")
    parser.add_argument("--info-samples", type=int, default=200, help="INFO calls per kind (running, finished)")
    parser.add_argument("--info-budget", type=float, default=45.0, help="seconds of INFO calls per kind at most")
    parser.add_argument("--cancels", type=int, default=100_000, help="cancels in the replayed control stream")
    parser.add_argument("--replay-rounds", type=int, default=3, help="worker start-ups per side")
    parser.add_argument("--drain-count", type=int, default=5_000, help="no-op jobs per drain")
    parser.add_argument("--rounds", type=int, default=6, help="drain rounds (each drains once per side)")
    parser.add_argument("--sections", default="1234", help="which sections to run (default 1234)")
    parser.add_argument("--url", default=None, help="broker URL (default $OJS_AMQP_URL)")
    parser.add_argument(
        "--node-dir", type=Path, default=None, help="the broker node's data directory, to read the stream's disk size"
    )
    return parser.parse_args()


@dataclass
class Bench:
    """What every section shares: the broker, the entity names, a client."""

    url: str
    prefix: str
    client: Client
    management: ManagementClient
    concurrency: int

    def worker(self, queue_name: str, **options: Any) -> Worker:
        """A Worker of ``queue_name`` under the run's prefix (not started)."""
        options.setdefault("concurrency", self.concurrency)
        return Worker(self.url, prefix=self.prefix, queues=[queue_name], grace_period=5, **options)

    @staticmethod
    def start(worker: Worker) -> None:
        """Start ``worker`` and wait until it is ready; exit when it does not get there."""
        worker.start()
        if not worker.wait_until_ready(60):
            sys.exit(f"the worker of {', '.join(worker.queues)} did not get ready: {worker.error}")


def ms(values: list[float]) -> str:
    """``p50 / p99 / max`` of ``values`` (seconds), in milliseconds."""
    return (
        f"p50 {percentile(values, 50) * 1000:7.2f} ms   p99 {percentile(values, 99) * 1000:7.2f} ms"
        f"   max {max(values) * 1000:7.2f} ms"
    )


# -- 1. cancel to interrupt --------------------------------------------------------------------


class RunningJobs:
    """Jobs whose handler has started, and when each handler saw its cancel."""

    def __init__(self) -> None:
        self.started: queue.Queue[str] = queue.Queue()
        self.observed: dict[str, float] = {}
        self.seen = threading.Condition()

    def start(self) -> str:
        """Record that the current job's handler runs; returns its id."""
        job_id = current_job().id
        self.started.put(job_id)
        return job_id

    def saw_cancel(self, job_id: str) -> None:
        """Record the moment the handler of ``job_id`` observed its cancel."""
        now = time.perf_counter()
        with self.seen:
            self.observed[job_id] = now
            self.seen.notify_all()

    def wait_observed(self, job_id: str, timeout: float = 10.0) -> float:
        """When the handler of ``job_id`` observed its cancel; exits after ``timeout``."""
        with self.seen:
            if not self.seen.wait_for(lambda: job_id in self.observed, timeout):
                sys.exit(f"job {job_id} did not observe its cancel within {timeout}s")
            return self.observed.pop(job_id)

    def busy(self, *_: object) -> None:
        """A pure-Python busy loop, ended only by ``Cancelled`` raised in its thread."""
        job_id = self.start()
        try:
            while True:
                pass
        except Cancelled:
            self.saw_cancel(job_id)
            raise

    def cooperative(self, *_: object) -> None:
        """Waits for ``current_job().cancelled``, as a cooperative handler polls it."""
        job_id = self.start()
        if current_job().cancelled.wait(60):
            self.saw_cancel(job_id)


def _canceller(url: str, prefix: str, queue_name: str, requests: Connection) -> None:
    """In a process of its own: cancel every job id received on ``requests``; answer
    ``(perf_counter() before the call, seconds the call took)``.  ``None`` ends it."""
    with Client(url, prefix=prefix) as client:
        client.cancel(str(uuid.uuid4()), queue=queue_name)  # connected before the first timed call
        requests.send("ready")
        while (job_id := requests.recv()) is not None:
            before = time.perf_counter()
            client.cancel(job_id, queue=queue_name)
            requests.send((before, time.perf_counter() - before))


def cancel_latency(bench: Bench, kind: str, samples: int) -> tuple[list[float], list[float]]:
    """Cancel ``samples`` running jobs one after the other, ``bench.concurrency`` running at any time.

    The cancels come from another process, as in production: a client in the worker's process
    would wait for the GIL its busy handlers hold, and add that wait to the figure.  Both
    processes read ``time.perf_counter()`` (``CLOCK_MONOTONIC``: one clock for the machine).

    Returns:
        The latencies (``Client.cancel()`` call to handler observing) and the durations of
        the ``Client.cancel()`` calls themselves (a confirmed publish), in seconds.
    """
    queue_name = f"cancel-{kind}"
    bench.client.declare_queue(queue_name)
    context = multiprocessing.get_context("spawn")
    requests, child_end = context.Pipe()
    canceller = context.Process(target=_canceller, args=(bench.url, bench.prefix, queue_name, child_end), daemon=True)
    canceller.start()
    if not requests.poll(60) or requests.recv() != "ready":
        sys.exit("the cancelling process did not start")
    jobs = RunningJobs()
    worker = bench.worker(queue_name, cancel_running="interrupt" if kind == "busy" else "cooperative")
    worker.handler("bench.hold", jobs.busy if kind == "busy" else jobs.cooperative)
    bench.start(worker)
    latencies: list[float] = []
    calls: list[float] = []
    try:
        running: deque[str] = deque()

        def run_one() -> None:
            bench.client.enqueue("bench.hold", [], queue=queue_name)
            running.append(jobs.started.get(timeout=30))

        for _ in range(bench.concurrency):
            run_one()
        for _ in range(samples):
            job_id = running.popleft()
            requests.send(job_id)
            observed = jobs.wait_observed(job_id)
            before, call = requests.recv()
            calls.append(call)
            latencies.append(observed - before)
            run_one()
        for job_id in running:  # let the last ones go, so stop() does not wait for them
            bench.client.cancel(job_id, queue=queue_name)
    finally:
        requests.send(None)
        canceller.join(10)
        worker.stop(timeout=10)
    return latencies, calls


# -- 2. INFO round trip ------------------------------------------------------------------------


@dataclass
class InfoResult:
    """INFO round trips (seconds) and the answers they got (``None`` or a state)."""

    seconds: list[float]
    answers: dict[str, int]


def info_round_trips(bench: Bench, job_id: str, queue_name: str, samples: int, budget: float) -> InfoResult:
    """Call ``Client.info(job_id, queue=queue_name, timeout=2.0)`` up to ``samples`` times within ``budget`` s.

    Raises:
        AttributeError: the client has no ``info`` yet (or its ``JobInfo`` has no ``state``).
    """
    info: Callable[..., Any] = bench.client.info  # built in parallel (issue 11): AttributeError until merged
    result = InfoResult([], {})
    deadline = time.monotonic() + budget
    while len(result.seconds) < samples and time.monotonic() < deadline:
        before = time.perf_counter()
        answer = info(job_id, queue=queue_name, timeout=2.0)
        result.seconds.append(time.perf_counter() - before)
        state = "None" if answer is None else str(answer.state)
        result.answers[state] = result.answers.get(state, 0) + 1
    return result


def info_section(bench: Bench, samples: int, budget: float) -> dict[str, InfoResult] | None:
    """INFO for a running job and for a finished one; ``None`` when ``Client.info`` does not exist yet."""
    queue_name = "info"
    release = threading.Event()
    started: queue.Queue[str] = queue.Queue()
    finished = threading.Event()
    worker = bench.worker(queue_name)
    worker.handler("bench.hold", lambda: (started.put(current_job().id), release.wait(120)))
    worker.handler("bench.noop", lambda: finished.set())
    bench.client.declare_queue(queue_name)
    bench.start(worker)
    results: dict[str, InfoResult] = {}
    try:
        running = bench.client.enqueue("bench.hold", [], queue=queue_name)
        started.get(timeout=30)
        results["running"] = info_round_trips(bench, running.id, queue_name, samples, budget)
        done = bench.client.enqueue("bench.noop", [], queue=queue_name)
        if not finished.wait(30):
            sys.exit("the no-op job did not run")
        results["finished"] = info_round_trips(bench, done.id, queue_name, samples, budget)
    except AttributeError as exc:
        print(f"  INFO skipped: Client.info is not available in this build ({exc}); run it after issue 11's INFO")
        return None
    finally:
        release.set()
        worker.stop(timeout=10)
    return results


# -- 3. start-up replay ------------------------------------------------------------------------


def publish_cancels(url: str, names: Names, queue_name: str, count: int) -> float:
    """Publish ``count`` cancels of fresh ids to the control stream of ``queue_name``; returns seconds.

    Pipelined on one channel (``ConfirmedPublisher``: at most 1,000 unconfirmed), then every confirm.
    """
    with kombu.Connection(url) as conn:
        conn.connect()
        publisher = ConfirmedPublisher(conn.connection, window=1000)
        exchange, key = names.direct_exchange, names.control_routing_key(queue_name)
        started = time.perf_counter()
        tickets = [
            publisher.publish(cancel_message(str(uuid.uuid4())), exchange=exchange, routing_key=key, queue=queue_name)
            for _ in range(count)
        ]
        publisher.wait_all(60)
        elapsed = time.perf_counter() - started
        publisher.close()
    failed = sum(t.error is not None for t in tickets)
    if failed:
        sys.exit(f"{failed} cancels were not confirmed")
    return elapsed


@dataclass
class StartUp:
    """One timed worker start: seconds to ready, control messages replayed, cancelled ids known."""

    seconds: float
    replayed: int
    cancelled_ids: int


def time_start(bench: Bench, queue_name: str) -> StartUp:
    """Time a new Worker of ``queue_name`` from ``start()`` to ``wait_until_ready()``."""
    worker = bench.worker(queue_name, concurrency=1)
    before = time.perf_counter()
    worker.start()
    ready = worker.wait_until_ready(300)
    seconds = time.perf_counter() - before
    try:
        if not ready:
            sys.exit(f"the worker of {queue_name} did not get ready: {worker.error}")
        control = worker.consumer.control
        replayed = control.replayed if control is not None else 0
        return StartUp(seconds, replayed, len(worker.cancellations.ids))
    finally:
        worker.stop(timeout=5)


def stream_size(management: ManagementClient, name: str, expected: int, node_dir: Path | None) -> str:
    """The stream ``name``'s message count (management API, waited for up to ``expected`` for 20 s at
    most: its statistics lag) and, when the node's data directory is readable, its files' size on disk."""
    parts = []
    messages: object = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            messages = (management.queue(name) or {}).get("messages")
        except ManagementError:
            break
        if isinstance(messages, int) and messages >= expected:
            break
        time.sleep(0.5)
    if isinstance(messages, int):
        parts.append(f"{messages:,} messages (management API{'' if messages >= expected else ', lagging'})")
    if node_dir is not None:
        # A stream's directory is named after its virtual host and name, dots as underscores.
        files = [f for d in node_dir.glob(f"**/stream/*_{name.replace('.', '_')}_*") for f in d.iterdir()]
        if files:
            parts.append(f"{sum(f.stat().st_size for f in files) / 1e6:.1f} MB on disk in {len(files)} files")
    return ", ".join(parts) or "n/a"


def replay_section(
    bench: Bench, cancels: int, rounds: int, node_dir: Path | None
) -> tuple[float, dict[str, list[StartUp]], str]:
    """Fill one control stream with ``cancels`` cancels, then time worker start-ups against an empty one."""
    full, empty = "replay-full", "replay-empty"
    for queue_name in (full, empty):
        bench.client.declare_queue(queue_name)
    publish_s = publish_cancels(bench.url, bench.client.names, full, cancels)
    starts: dict[str, list[StartUp]] = {full: [], empty: []}
    for index in range(rounds):
        for queue_name in (full, empty) if index % 2 == 0 else (empty, full):
            starts[queue_name].append(time_start(bench, queue_name))
    return publish_s, starts, stream_size(bench.management, bench.client.names.control_queue(full), cancels, node_dir)


# -- 4. drain rate with and without the control stream -----------------------------------------


def drain_once(bench: Bench, jobs: list[Job], control: bool) -> float:
    """Load ``jobs`` and drain them with a new Worker (``benchmarks/worker.py``); returns jobs/s."""
    load(bench.client, jobs)
    worker = bench.worker("drain")
    if not control:
        worker.consumer.control = None  # no public switch: the benchmark's private way to leave it out
    return bench_worker(worker, len(jobs))


def drain_section(bench: Bench, count: int, rounds: int) -> dict[str, list[float]]:
    """``rounds`` rounds, each draining once with the control stream consumed and once without."""
    bench.client.declare_queue("drain")
    bench.client.cancel(str(uuid.uuid4()), queue="drain")  # a control stream with something in it
    jobs = noop_jobs(count, queue="drain")
    rates: dict[str, list[float]] = {"on": [], "off": []}
    for index in range(rounds):
        for side in ("on", "off") if index % 2 == 0 else ("off", "on"):
            rates[side].append(drain_once(bench, jobs, control=side == "on"))
        print(f"  round {index + 1}: on {rates['on'][-1]:>8,.0f} jobs/s   off {rates['off'][-1]:>8,.0f} jobs/s")
    return rates


def bookkeeping_cost(number: int = 100_000) -> float:
    """Seconds per job of the cancel bookkeeping every job pays, control stream or not."""
    cancellations = Cancellations()
    job_id = str(uuid.uuid4())

    def one_job() -> None:
        with cancellations.running(job_id, "q"):
            pass
        cancellations.is_cancelled(job_id)

    return timeit.timeit(one_job, number=number) / number


# -- main ----------------------------------------------------------------------------------------


@dataclass
class Report:
    """The summary table's rows and the README sentence's clauses, filled section by section."""

    rows: list[tuple[str, str]]
    clauses: list[str]

    def add(self, label: str, value: str, clause: str) -> None:
        """One summary row and its README clause."""
        self.rows.append((label, value))
        self.clauses.append(clause)


def p50_p99(values: list[float]) -> str:
    """``p50 X ms / p99 Y ms`` of ``values`` (seconds), for the README sentence."""
    return f"p50 {percentile(values, 50) * 1000:.1f} ms / p99 {percentile(values, 99) * 1000:.1f} ms"


def report_cancels(bench: Bench, args: argparse.Namespace, report: Report) -> None:
    """Section 1."""
    print(f"1. cancel -> handler observes it: {args.samples} cancels per kind, {bench.concurrency} jobs running")
    for kind in ("busy", "cooperative"):
        latencies, calls = cancel_latency(bench, kind, args.samples)
        call = statistics.median(calls) * 1000
        print(f"  {kind:<12} {ms(latencies)}   (the Client.cancel() call itself: p50 {call:.2f} ms)")
        what = "a busy handler is interrupted" if kind == "busy" else "a cooperative handler sees the event"
        report.add(f"cancel latency, {kind}", ms(latencies), f"{what} {p50_p99(latencies)} after Client.cancel()")


def report_info(bench: Bench, args: argparse.Namespace, report: Report) -> None:
    """Section 2."""
    if args.skip_info:
        print("2. INFO round trip: skipped (--skip-info)")
        return
    print(f"2. INFO round trip: up to {args.info_samples} calls per kind, {args.info_budget:.0f} s at most each")
    results = info_section(bench, args.info_samples, args.info_budget)
    if results is None:
        report.rows.append(("INFO round trip", "not run: Client.info missing"))
        return
    for kind, result in results.items():
        answers = ", ".join(f"{state} x{n}" for state, n in sorted(result.answers.items()))
        print(f"  {kind:<12} {ms(result.seconds)}   {len(result.seconds)} calls: {answers}")
        report.add(
            f"INFO round trip, {kind} job", ms(result.seconds), f"INFO on a {kind} job {p50_p99(result.seconds)}"
        )


def report_replay(bench: Bench, args: argparse.Namespace, report: Report) -> None:
    """Section 3."""
    print(f"3. start-up replay: {args.cancels:,} cancels in a control stream, {args.replay_rounds} start-ups per side")
    publish_s, starts, size = replay_section(bench, args.cancels, args.replay_rounds, args.node_dir)
    print(f"  published in {publish_s:.2f} s ({args.cancels / publish_s:,.0f} cancels/s, pipelined confirms)")
    print(f"  stream: {size}")
    medians = {}
    for queue_name, runs in starts.items():
        medians[queue_name] = statistics.median(s.seconds for s in runs)
        seconds = ", ".join(f"{s.seconds:.2f}" for s in runs)
        print(
            f"  {queue_name:<12} start() -> ready: median {medians[queue_name]:.2f} s ({seconds}); "
            f"replayed {runs[-1].replayed:,} messages, {runs[-1].cancelled_ids:,} cancelled ids"
        )
    full, empty = medians["replay-full"], medians["replay-empty"]
    rate = args.cancels / max(full - empty, 1e-9)
    report.add(
        f"start-up with {args.cancels:,} cancels",
        f"{full:.2f} s (empty stream {empty:.2f} s; {rate:,.0f} cancels/s replayed)",
        f"a worker starts in {full:.1f} s with {args.cancels:,} cancels retained ({empty:.2f} s with none)",
    )


def report_drain(bench: Bench, args: argparse.Namespace, report: Report) -> None:
    """Section 4."""
    print(
        f"4. drain rate of benchmarks/worker.py's workload: {args.drain_count:,} no-op jobs, concurrency "
        f"{bench.concurrency}, {args.rounds} rounds, sides alternated"
    )
    rates = drain_section(bench, args.drain_count, args.rounds)
    ratio = statistics.median(on / off for on, off in zip(rates["on"], rates["off"], strict=True))
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    print(f"  median on {on:,.0f} jobs/s, off {off:,.0f} jobs/s; median ratio on/off {ratio:.3f} (target 0.95..1.05)")
    print(f"  per-job cancel bookkeeping (paid on both sides): {bookkeeping_cost() * 1e6:.2f} µs")
    report.add(
        "drain rate, control on / off",
        f"{ratio:.3f} (median of {args.rounds} rounds; target within 5 %)",
        f"consuming the control stream changes the drain rate by {(ratio - 1) * 100:+.1f} % (median of "
        f"{args.rounds} alternated rounds)",
    )


def main() -> None:
    """Provision the broker, run the sections and print the summary table."""
    args = _args()
    if args.url:
        os.environ["OJS_AMQP_URL"] = args.url
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    print(
        f"settings: {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
        f"GIL switch interval {sys.getswitchinterval() * 1000:.0f} ms, prefix {prefix}"
    )
    report = Report([], [])
    with provision_broker() as broker:
        management = broker.management()
        client = Client(broker.url, prefix=prefix)
        bench = Bench(broker.url, prefix, client, management, args.concurrency)
        if args.node_dir is None and broker.node is not None:
            args.node_dir = broker.node.dir  # a private node of this run
        try:
            for number, section in enumerate((report_cancels, report_info, report_replay, report_drain), 1):
                if str(number) in args.sections:
                    section(bench, args, report)
        finally:
            client.close()
            management.delete_by_prefix(prefix + ".")
    print()
    print("summary")
    for label, value in report.rows:
        print(f"  {label:<36} {value}")
    print()
    print(f"README: On {os.cpu_count()} cores (benchmarks/control.py), " + "; ".join(report.clauses) + ".")


if __name__ == "__main__":
    main()
