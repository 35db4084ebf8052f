"""Publish throughput: ojs_kombu.Client vs kombu's confirmed Producer, in one run.

    python benchmarks/publish.py [--count 20000] [--url amqp://…]

Prints jobs/s for ``Client.enqueue_many`` (pipelined publishes, then all
confirms), ``Client.enqueue`` one by one (a confirm per job), and kombu's
``Producer.publish`` with ``confirm_publish=True`` one by one, then the ratio
``enqueue_many / kombu``.  Each phase publishes persistent messages of the same
size to its own durable queue, which is deleted afterwards.  The target is
``enqueue_many / kombu >= 8``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

import kombu

from ojs_kombu import Client, Job
from ojs_kombu.amqp.connection import resolve_url


def _args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--url", default=None, help="broker URL (default $OJS_AMQP_URL)")
    return parser.parse_args()


def bench_enqueue_many(url: str, prefix: str, count: int) -> float:
    with Client(url, prefix=prefix) as client:
        client.declare_queue("bench")
        started = time.perf_counter()
        jobs = [Job.create("bench.noop", ["user@example.com", i], queue="bench") for i in range(count)]
        results = client.enqueue_many(jobs)
        elapsed = time.perf_counter() - started
    failed = sum(not r.ok for r in results)
    if failed:
        sys.exit(f"{failed} jobs failed")
    return count / elapsed


def bench_enqueue_one_by_one(url: str, prefix: str, count: int) -> float:
    with Client(url, prefix=prefix) as client:
        client.declare_queue("bench")
        started = time.perf_counter()
        for i in range(count):
            client.enqueue("bench.noop", ["user@example.com", i], queue="bench")
        return count / (time.perf_counter() - started)


def bench_kombu(url: str, prefix: str, count: int) -> float:
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


def _cleanup(url: str, prefix: str) -> None:
    with kombu.Connection(url) as conn:
        channel = conn.channel()
        for name in (f"{prefix}.ojs.queue.bench", f"{prefix}.ojs.queue.dlx.bench"):
            channel.queue_delete(name)
        for name in ("direct", "dlx", "retry"):
            channel.exchange_delete(f"{prefix}.ojs.exchange.{name}")


def main() -> None:
    args = _args()
    url = resolve_url(args.url)
    count = args.count
    rates = {}
    for label, bench in (
        ("enqueue_many (pipelined confirms)", bench_enqueue_many),
        ("enqueue one by one", bench_enqueue_one_by_one),
        ("kombu Producer.publish, confirm_publish=True", bench_kombu),
    ):
        prefix = f"bench{uuid.uuid4().hex[:8]}"
        try:
            rates[label] = bench(url, prefix, count)
        finally:
            _cleanup(url, prefix)
        print(f"{label:<48} {rates[label]:>10,.0f} jobs/s", flush=True)
    ratio = rates["enqueue_many (pipelined confirms)"] / rates["kombu Producer.publish, confirm_publish=True"]
    print(f"{'ratio enqueue_many / kombu':<48} {ratio:>10.1f}x  (target >= 8x)")
    print(f"({count:,} jobs per phase, {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
