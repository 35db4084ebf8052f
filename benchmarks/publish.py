"""Publish throughput: ``Client.enqueue_many`` vs the raw py-amqp ceiling, in one run.

    python benchmarks/publish.py [--count 20000] [--rounds 3] [--one-by-one] [--url amqp://…]

Two sides, alternated over ``--rounds`` pairs (see ``pairs.py``), each publishing
``--count`` persistent jobs to the same durable OJS job queue (``ojs.exchange.direct``,
``mandatory``), which is deleted afterwards:

* ``enqueue_many``: builds the ``Job``\\ s (``Job.create``) and calls
  ``Client.enqueue_many`` (pipelined publishes, then all confirms), both timed;
* ``raw py-amqp``: the ceiling.  The same jobs are encoded before the clock
  starts; the timed part writes their pre-encoded bytes straight to py-amqp's
  frame writer on a confirm-mode channel, pipelined with the same window of
  1,000 unconfirmed publishes, and reads the confirms.

Prints each rate, the per-round ratios and their median (target ``enqueue_many`` >=
0.8x the ceiling).  ``--one-by-one`` adds ``Client.enqueue`` one job at a time and
kombu's ``Producer.publish`` with ``confirm_publish=True`` (a confirm round trip each).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import kombu
from amqp import spec
from amqp.basic_message import Message as WireMessage
from amqp.serialization import dumps
from pairs import alternate, report_ratio

from ojs_kombu import Client, Job
from ojs_kombu.amqp.connection import resolve_url
from ojs_kombu.wire.codec import OutgoingMessage, encode

WINDOW = 1000  # unconfirmed publishes, as ConfirmedPublisher's default


def _args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one-by-one", action="store_true", help="also time enqueue() and kombu one at a time")
    parser.add_argument("--url", default=None, help="broker URL (default $OJS_AMQP_URL)")
    return parser.parse_args()


def cpu_seconds() -> float:
    """This process's CPU time (user + system), in seconds."""
    times = os.times()
    return times.user + times.system


def report_cpu(label: str, cpu: float, count: int) -> None:
    """Print the CPU per job of a timed part (the broker's CPU is not counted)."""
    print(f"    {label}: {cpu / count * 1e6:.1f} µs CPU per job", flush=True)


def noop_job(i: int) -> Job:
    """The benchmark's job ``i``."""
    return Job.create("bench.noop", ["user@example.com", i], queue="bench")


def bench_enqueue_many(url: str, prefix: str, count: int) -> float:
    """Build ``count`` jobs and ``enqueue_many`` them; jobs/s, both timed."""
    with declared(url, prefix):
        with Client(url, prefix=prefix) as client:
            cpu, started = cpu_seconds(), time.perf_counter()
            jobs = [noop_job(i) for i in range(count)]
            results = client.enqueue_many(jobs)
            elapsed = time.perf_counter() - started
            report_cpu("enqueue_many", cpu_seconds() - cpu, count)
    failed = sum(not r.ok for r in results)
    if failed:
        sys.exit(f"{failed} jobs failed")
    return count / elapsed


def bench_raw(url: str, prefix: str, count: int) -> float:
    """The ceiling: pre-encoded jobs, pipelined py-amqp publishes with confirms; jobs/s."""
    messages: list[OutgoingMessage] = [encode(noop_job(i)) for i in range(count)]
    with declared(url, prefix) as exchange, kombu.Connection(url) as conn:
        raw = conn.connection  # the py-amqp Connection under kombu's pyamqp transport
        channel = raw.channel()
        channel.confirm_select()
        acked = [0]

        def on_ack(delivery_tag: int, multiple: bool) -> None:
            acked[0] = delivery_tag if multiple else acked[0] + 1

        channel.events["basic_ack"].add(on_ack)
        method_args = dumps("Bssbb", (0, exchange, "bench", True, False))
        cpu, started = cpu_seconds(), time.perf_counter()
        for sent, message in enumerate(messages, 1):
            wire = WireMessage(message.body, application_headers=message.headers, **message.properties)
            raw.frame_writer(1, channel.channel_id, spec.Basic.Publish, method_args, wire)
            while sent - acked[0] >= WINDOW:
                raw.drain_events(timeout=30)
        while acked[0] < count:
            raw.drain_events(timeout=30)
        rate = count / (time.perf_counter() - started)
        report_cpu("raw py-amqp", cpu_seconds() - cpu, count)
        channel.close()
    return rate


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


def isolated(bench, url: str, count: int):
    """``bench`` as a no-argument run under a fresh prefix."""
    return lambda: bench(url, f"bench{uuid.uuid4().hex[:8]}", count)


def main() -> None:
    args = _args()
    url = resolve_url(args.url)
    print(f"{args.count:,} persistent jobs per side, {args.rounds} alternated rounds, {os.cpu_count()} cores")
    rates = alternate(
        [
            ("enqueue_many", isolated(bench_enqueue_many, url, args.count)),
            ("raw py-amqp", isolated(bench_raw, url, args.count)),
        ],
        rounds=args.rounds,
    )
    report_ratio(rates, "enqueue_many", "raw py-amqp", "target >= 0.8x")
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
