"""Unique-job locks (``ojs_kombu.amqp.locks``): operations per second, and what a live lock costs a node.

1. **Rate.**  On one connection, ``--ops`` (2,000) rounds of: acquire a new key + release it;
   then acquire one key that is held (the duplicate path: a nack and a read of the holder's
   id); also a plain confirmed publish of the same size to one queue, as the floor.
2. **Live locks.**  ``--locks`` (5,000) locks acquired and kept (each is two classic queues:
   the lock and its holder record); the node's open files (``fd_used``: one per queue holding a
   persistent message, so the node's file limit bounds the live locks) and memory (``mem_used``
   and the largest parts of its breakdown, management API) are read before and after, each after
   ``--settle`` seconds, and reported per 1,000 locks.  ``--transient``: tokens not persistent.  The
   locks are then released (the queues deleted) and the memory read again.

Run against a broker with the management plugin::

    OJS_AMQP_URL=amqp://guest:guest@localhost:5672// OJS_MANAGEMENT_URL=http://localhost:15672 \\
        python benchmarks/unique_locks.py [--ops 2000] [--locks 10000]

Everything is declared under a unique prefix and deleted afterwards.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import kombu

from ojs_kombu import Names
from ojs_kombu.amqp.locks import Acquired, Held, UniqueLocks
from ojs_kombu.amqp.management import ManagementClient
from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.wire.codec import OutgoingMessage


def node_memory(management: ManagementClient) -> dict[str, float]:
    """The first node's memory in MB: ``mem_used`` and every part of its breakdown."""
    node = management.request("GET", "/api/nodes")[0]
    breakdown = management.request("GET", f"/api/nodes/{quote(node['name'], safe='')}/memory")["memory"]
    out = {"mem_used": node["mem_used"] / 1e6, "fd_used": float(node.get("fd_used") or 0)}
    for part, value in breakdown.items():
        if isinstance(value, dict):  # "total" is {"rss": ..., "allocated": ..., "erlang": ...}
            for sub, number in value.items():
                out[f"{part}.{sub}"] = number / 1e6
        elif isinstance(value, (int, float)):
            out[part] = value / 1e6
    return out


def rates(locks: UniqueLocks, connection: Any, names: Names, ops: int) -> None:
    period = timedelta(minutes=5)
    start = time.perf_counter()
    for i in range(ops):
        key = f"{i:064x}"
        assert isinstance(locks.acquire(key, f"job-{i}", period), Acquired)
        assert locks.release(key, f"job-{i}")
    elapsed = time.perf_counter() - start
    print(f"acquire+release (new key each): {ops / elapsed:8.0f} /s  ({elapsed / ops * 1e3:.2f} ms each)")

    held = "f" * 64
    locks.acquire(held, "holder", period)
    start = time.perf_counter()
    for i in range(ops):
        assert locks.acquire(held, f"dup-{i}", period) == Held(held, "holder")
    elapsed = time.perf_counter() - start
    kept = UniqueLocks(connection, names=names, delete_on_release=False)
    start = time.perf_counter()
    for i in range(ops):
        assert isinstance(kept.acquire("e" * 64, f"job-{i}", period), Acquired)
        assert kept.release("e" * 64, f"job-{i}")
    elapsed = time.perf_counter() - start
    print(
        f"acquire+release (same key, delete_on_release=False): {ops / elapsed:8.0f} /s  ({elapsed / ops * 1e3:.2f} ms each)"
    )
    kept.close()

    print(f"acquire of a held key (Held):   {ops / elapsed:8.0f} /s  ({elapsed / ops * 1e3:.2f} ms each)")
    locks.release(held, "holder")

    queue = names.job_queue("floor")
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, auto_delete=False)
    publisher = ConfirmedPublisher(connection)
    start = time.perf_counter()
    for _ in range(ops):
        ticket = publisher.publish(
            OutgoingMessage(b"job-x", {"delivery_mode": 2}), exchange="", routing_key=queue, queue=queue
        )
        publisher.wait([ticket])
    elapsed = time.perf_counter() - start
    print(f"floor: one confirmed publish:   {ops / elapsed:8.0f} /s  ({elapsed / ops * 1e3:.2f} ms each)")
    channel.queue_delete(queue)
    publisher.close()


def live_locks(locks: UniqueLocks, management: ManagementClient, count: int, settle: float) -> None:
    time.sleep(settle)
    before = node_memory(management)
    period = timedelta(hours=1)
    start = time.perf_counter()
    for i in range(count):
        assert isinstance(locks.acquire(f"{i:064x}", f"job-{i}", period), Acquired)
    elapsed = time.perf_counter() - start
    print(f"{count} locks acquired in {elapsed:.1f}s ({count / elapsed:.0f} /s)")
    time.sleep(settle)
    after = node_memory(management)
    print(f"node with {count} live locks ({2 * count} queues): MB (fd_used: files) before -> after (per 1k locks)")
    deltas = {part: value - before.get(part, 0.0) for part, value in after.items()}
    shown = ["fd_used", "mem_used", "total.rss", "total.erlang"] + sorted(
        (p for p in deltas if not p.startswith(("fd_used", "mem_used", "total"))), key=lambda p: -deltas[p]
    )[:8]
    for part in shown:
        value, delta = after.get(part, 0.0), deltas.get(part, 0.0)
        print(f"  {part:15s} {before.get(part, 0.0):9.1f} -> {value:9.1f}  ({delta / count * 1000:6.2f} per 1k)")
    start = time.perf_counter()
    for i in range(count):
        assert locks.release(f"{i:064x}", f"job-{i}")
    elapsed = time.perf_counter() - start
    print(f"{count} locks released in {elapsed:.1f}s ({count / elapsed:.0f} /s)")
    time.sleep(settle)
    print(f"  mem_used after release: {node_memory(management)['mem_used']:.1f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--locks", type=int, default=5_000)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--transient", action="store_true", help="UniqueLocks(persistent=False)")
    args = parser.parse_args()
    url = os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@localhost:5672//")
    management = ManagementClient(
        os.environ.get("OJS_MANAGEMENT_URL", "http://localhost:15672"),
        os.environ.get("OJS_MANAGEMENT_USER", "guest"),
        os.environ.get("OJS_MANAGEMENT_PASSWORD", "guest"),
    )
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    names = Names(prefix)
    print(f"RabbitMQ {management.overview().get('rabbitmq_version')}")
    try:
        with kombu.Connection(url) as connection:
            connection.connect()
            locks = UniqueLocks(connection.connection, names=names, persistent=not args.transient)
            if args.ops:
                rates(locks, connection.connection, names, args.ops)
            if args.locks:
                live_locks(locks, management, args.locks, args.settle)
            locks.close()
    finally:
        management.delete_by_prefix(prefix + ".")


if __name__ == "__main__":
    main()
