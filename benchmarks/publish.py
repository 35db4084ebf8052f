"""Publish throughput: ``Client.enqueue_many`` vs the raw py-amqp ceiling, in one run.

    python benchmarks/publish.py [--count 20000] [--rounds 5] [--windowed] [--prebuilt]
                                 [--broker-pid PID] [--one-by-one] [--url amqp://…]

Sides alternated over ``--rounds`` rounds (see ``pairs.py``), each publishing ``--count``
persistent jobs to the same durable OJS job queue (``ojs.exchange.direct``, ``mandatory``),
which is deleted afterwards:

* ``enqueue_many``: builds the ``Job``\\ s (``Job.create``) and calls
  ``Client.enqueue_many`` (pipelined publishes, then all confirms), both timed; the client
  has published one job before (not counted), so its connection, confirm channel and queue
  declaration are ready when the clock starts, as the raw sides' connection and channel are;
* ``raw ceiling`` (issue 27): the same jobs are encoded and their py-amqp messages built
  before the clock starts; the timed part writes all of them with py-amqp's frame writer on
  one confirm-mode channel with ``mandatory``, with no window, and then reads every confirm.
  Its connection's ``TCP_USER_TIMEOUT`` is 60 s instead of py-amqp's 1 s: with no window, a
  broker that stops reading for a second (a stall under load) leaves the written bytes
  unacknowledged and the kernel would abort the connection (seen on 3.10 under load, and
  whenever the broker is paused with SIGSTOP); it changes nothing else;
* ``--windowed`` adds ``raw windowed``, the earlier ceiling: the pre-encoded jobs become py-amqp
  messages in the timed part and at most 1,000 publishes are left unconfirmed (a confirm is
  read whenever the window is full);
* ``--prebuilt`` adds ``enqueue_many, jobs prebuilt``: ``Job.create`` before the clock.

Prints each rate and the CPU per job of the timed part (this process; with ``--broker-pid``,
the broker's too, read from ``/proc``, declarations and deletion included), then each side's
per-round ratios to the ceiling and their median (target ``enqueue_many`` >= 0.85x).
``--one-by-one`` adds ``Client.enqueue`` one job at a time and kombu's ``Producer.publish``
with ``confirm_publish=True`` (a confirm round trip each).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import kombu
from amqp import spec
from amqp.basic_message import Message as WireMessage
from amqp.serialization import dumps
from pairs import alternate, report_ratio

from ojs_kombu import Client, Job
from ojs_kombu.amqp.connection import resolve_url
from ojs_kombu.wire.codec import OutgoingMessage, encode

WINDOW = 1000  # unconfirmed publishes, as ConfirmedPublisher's default
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BROKER_PID: int | None = None  # --broker-pid
TARGET = "target >= 0.85x"


def _args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--windowed", action="store_true", help="also the raw publisher with a window of 1,000")
    parser.add_argument("--prebuilt", action="store_true", help="also enqueue_many of jobs built before the clock")
    parser.add_argument("--broker-pid", type=int, default=None, help="a local broker's pid: its CPU per job too")
    parser.add_argument("--one-by-one", action="store_true", help="also time enqueue() and kombu one at a time")
    parser.add_argument("--url", default=None, help="broker URL (default $OJS_AMQP_URL)")
    return parser.parse_args()


def cpu_seconds() -> float:
    """This process's CPU time (user + system), in seconds."""
    times = os.times()
    return times.user + times.system


def broker_cpu_seconds() -> float:
    """The CPU time (user + system) of the ``--broker-pid`` process, in seconds; 0 without one."""
    if BROKER_PID is None:
        return 0.0
    fields = Path(f"/proc/{BROKER_PID}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


@contextmanager
def timed(label: str, count: int, rate: list[float]) -> Iterator[None]:
    """Time the block: append ``count`` / its seconds to ``rate``; print the CPU per job of this
    process (and of the broker, with ``--broker-pid``)."""
    cpu, broker, started = cpu_seconds(), broker_cpu_seconds(), time.perf_counter()
    yield
    rate.append(count / (time.perf_counter() - started))
    ours = (cpu_seconds() - cpu) / count * 1e6
    theirs = f", broker {(broker_cpu_seconds() - broker) / count * 1e6:.1f}" if BROKER_PID else ""
    print(f"    {label}: {ours:.1f}{theirs} µs CPU per job", flush=True)


def noop_job(i: int) -> Job:
    """The benchmark's job ``i``."""
    return Job.create("bench.noop", ["user@example.com", i], queue="bench")


def bench_enqueue_many(url: str, prefix: str, count: int, *, prebuilt: bool = False) -> float:
    """Build ``count`` jobs and ``enqueue_many`` them; jobs/s, both timed (``prebuilt``: the enqueue only)."""
    rate: list[float] = []
    with declared(url, prefix), Client(url, prefix=prefix) as client:
        # Connected, its channel in confirm mode and the queue declared before the clock, as the
        # raw sides' connection and channel are: one job, not counted.
        client.enqueue("bench.warmup", queue="bench")
        jobs = [noop_job(i) for i in range(count)] if prebuilt else []
        with timed("enqueue_many" + (", jobs prebuilt" if prebuilt else ""), count, rate):
            if not prebuilt:
                jobs = [noop_job(i) for i in range(count)]
            results = client.enqueue_many(jobs)
    failed = sum(not r.ok for r in results)
    if failed:
        sys.exit(f"{failed} jobs failed")
    return rate[0]


def confirm_channel(raw) -> tuple[object, list[int]]:
    """A confirm-mode channel of the py-amqp connection ``raw`` and its acked count (``[n]``)."""
    channel = raw.channel()
    channel.confirm_select()
    acked = [0]

    def on_ack(delivery_tag: int, multiple: bool) -> None:
        acked[0] = delivery_tag if multiple else acked[0] + 1

    channel.events["basic_ack"].add(on_ack)
    return channel, acked


def bench_raw_ceiling(url: str, prefix: str, count: int) -> float:
    """The ceiling of issue 27: every pre-encoded job published, then every confirm read; jobs/s."""
    rate: list[float] = []
    patient = {"socket_settings": {socket.TCP_USER_TIMEOUT: 60_000}}  # see the module docstring
    with declared(url, prefix) as exchange, kombu.Connection(url, transport_options=patient) as conn:
        raw = conn.connection  # the py-amqp Connection under kombu's pyamqp transport
        channel, acked = confirm_channel(raw)
        method_args = dumps("Bssbb", (0, exchange, "bench", True, False))  # mandatory
        wires = [
            WireMessage(m.body, application_headers=m.headers, **m.properties)
            for m in (encode(noop_job(i)) for i in range(count))
        ]
        write, channel_id, publish = raw.frame_writer, channel.channel_id, spec.Basic.Publish
        with timed("raw ceiling", count, rate):
            for wire in wires:
                write(1, channel_id, publish, method_args, wire)
            while acked[0] < count:
                raw.drain_events(timeout=30)
        channel.close()
    return rate[0]


def bench_raw_windowed(url: str, prefix: str, count: int) -> float:
    """The earlier ceiling: pre-encoded jobs, py-amqp messages built as they are published,
    at most :data:`WINDOW` unconfirmed; jobs/s."""
    rate: list[float] = []
    messages: list[OutgoingMessage] = [encode(noop_job(i)) for i in range(count)]
    with declared(url, prefix) as exchange, kombu.Connection(url) as conn:
        raw = conn.connection
        channel, acked = confirm_channel(raw)
        method_args = dumps("Bssbb", (0, exchange, "bench", True, False))
        with timed("raw windowed", count, rate):
            for sent, message in enumerate(messages, 1):
                wire = WireMessage(message.body, application_headers=message.headers, **message.properties)
                raw.frame_writer(1, channel.channel_id, spec.Basic.Publish, method_args, wire)
                while sent - acked[0] >= WINDOW:
                    raw.drain_events(timeout=30)
            while acked[0] < count:
                raw.drain_events(timeout=30)
        channel.close()
    return rate[0]


def bench_enqueue_one_by_one(url: str, prefix: str, count: int) -> float:
    """``Client.enqueue`` one job at a time (a confirm each); jobs/s."""
    with declared(url, prefix), Client(url, prefix=prefix) as client:
        started = time.perf_counter()
        for i in range(count):
            client.enqueue("bench.noop", ["user@example.com", i], queue="bench")
        return count / (time.perf_counter() - started)


def bench_kombu(url: str, prefix: str, count: int) -> float:
    """kombu's ``Producer.publish`` with ``confirm_publish=True``, one at a time; messages/s."""
    exchange = kombu.Exchange(f"{prefix}.kombu.direct", "direct", durable=True)
    queue = kombu.Queue(f"{prefix}.kombu.bench", exchange, routing_key="bench", durable=True)
    with kombu.Connection(url, transport_options={"confirm_publish": True}) as conn:
        producer = kombu.Producer(conn.channel(), exchange=exchange, routing_key="bench")
        queue(producer.channel).declare()
        started = time.perf_counter()
        for i in range(count):
            producer.publish(
                {"type": "bench.noop", "args": ["user@example.com", i], "id": str(uuid.uuid4())},
                serializer="json",
                delivery_mode=2,
            )
        rate = count / (time.perf_counter() - started)
        queue(conn.channel()).delete()
        exchange(conn.channel()).delete()
    return rate


@contextmanager
def declared(url: str, prefix: str) -> Iterator[str]:
    """Declare the ``bench`` queue's topology under ``prefix``; yield the direct exchange; delete it all after."""
    with Client(url, prefix=prefix) as client:
        client.declare_queue("bench")
        try:
            yield client.names.direct_exchange
        finally:
            client.teardown()


def isolated(bench: Callable[..., float], url: str, count: int, **options: bool) -> Callable[[], float]:
    """``bench`` as a no-argument run under a fresh prefix."""
    return lambda: bench(url, f"bench{uuid.uuid4().hex[:8]}", count, **options)


def main() -> None:
    global BROKER_PID
    args = _args()
    url = resolve_url(args.url)
    BROKER_PID = args.broker_pid
    print(f"{args.count:,} persistent jobs per side, {args.rounds} alternated rounds, {os.cpu_count()} cores")
    sides = [
        ("enqueue_many", isolated(bench_enqueue_many, url, args.count)),
        ("raw ceiling", isolated(bench_raw_ceiling, url, args.count)),
    ]
    if args.windowed:
        sides.append(("raw windowed", isolated(bench_raw_windowed, url, args.count)))
    if args.prebuilt:
        sides.append(("enqueue_many, jobs prebuilt", isolated(bench_enqueue_many, url, args.count, prebuilt=True)))
    started = time.time()
    rates = alternate(sides, rounds=args.rounds)
    print(f"  {time.strftime('%H:%M', time.gmtime(started))}–{time.strftime('%H:%M', time.gmtime())} UTC")
    for label, _ in sides:
        print(f"  {label}: median {statistics.median(rates[label]):,.0f}/s", flush=True)
    for label, _ in sides:
        if label != "raw ceiling":
            report_ratio(rates, label, "raw ceiling", TARGET if label == "enqueue_many" else "")
    if args.one_by_one:
        one = alternate(
            [
                ("enqueue one by one", isolated(bench_enqueue_one_by_one, url, args.count)),
                ("kombu confirm_publish", isolated(bench_kombu, url, args.count)),
            ],
            rounds=args.rounds,
        )
        report_ratio(one, "enqueue one by one", "kombu confirm_publish")


if __name__ == "__main__":
    main()
