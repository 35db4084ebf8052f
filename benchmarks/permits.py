"""Concurrency permits (``ojs_kombu.Permits``): acquire + release per second, and what contention costs.

1. **One connection, uncontended.**  ``--cycles`` (2,000) ``acquire`` + ``release`` of one key
   with ``concurrency=1`` on one connection: the floor cost of a limited job (a ``Basic.Get`` of
   the token, an exclusive ``Basic.Consume`` on the index queue and its ``Basic.Cancel``, a
   ``Basic.Nack(requeue=True)``).
2. **Contended.**  ``--connections`` (4) threads, each with its own connection, cycle a key of
   ``concurrency=2`` for ``--seconds`` (5): total cycles per second, the most holders seen at once
   (must be 2), and how many token copies were removed (must be 0: seeding is exact).

The broker is provisioned by :func:`ojs_kombu.testing.broker.provision_broker` (``$OJS_AMQP_URL``
when set, else a Docker container or a private node).  Everything is declared under a unique
prefix and deleted at the end::

    OJS_AMQP_URL=amqp://guest:guest@localhost:5672// OJS_MANAGEMENT_URL=http://localhost:15672 \\
        python benchmarks/permits.py
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid

from ojs_kombu.amqp.permits import Permits
from ojs_kombu.model.naming import Names
from ojs_kombu.testing.broker import provision_broker


def uncontended(url: str, names: Names, cycles: int) -> float:
    """Cycles per second of acquire + release on one connection."""
    with Permits(url, names=names) as permits:
        permits.ensure("bench-solo", 1)
        for _ in range(50):  # warm up: channels opened, queues declared
            permit = permits.acquire("bench-solo", timeout=5)
            assert permit is not None
            permit.release()
        started = time.perf_counter()
        for _ in range(cycles):
            permit = permits.acquire("bench-solo", timeout=5)
            assert permit is not None
            permit.release()
        return cycles / (time.perf_counter() - started)


def contended(url: str, names: Names, connections: int, seconds: float) -> tuple[float, int, int]:
    """``(cycles per second in total, most holders at once, copies removed)`` of ``connections`` threads."""
    lock = threading.Lock()
    state = {"holding": 0, "peak": 0, "cycles": 0, "removed": 0}
    end = time.monotonic() + seconds

    def run() -> None:
        with Permits(url, names=names) as permits:
            permits.ensure("bench-shared", 2)
            while time.monotonic() < end:
                permit = permits.acquire("bench-shared", timeout=5)
                if permit is None:
                    continue
                with lock:
                    state["holding"] += 1
                    state["peak"] = max(state["peak"], state["holding"])
                time.sleep(0.001)  # the job
                with lock:
                    state["holding"] -= 1
                    state["cycles"] += 1
                permit.release()
            with lock:
                state["removed"] += permits.duplicates_removed

    threads = [threading.Thread(target=run) for _ in range(connections)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    return state["cycles"] / (time.monotonic() - started), state["peak"], state["removed"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    names = Names(prefix)
    print(f"settings: {os.cpu_count()} cores, prefix {prefix}")
    with provision_broker() as broker:
        management = broker.management()
        try:
            rate = uncontended(broker.url, names, args.cycles)
            print(f"one connection: {rate:,.0f} acquire+release per second ({1000 / rate:.2f} ms each)")
            total, peak, removed = contended(broker.url, names, args.connections, args.seconds)
            print(
                f"{args.connections} connections, concurrency 2: {total:,.0f} cycles per second in total, "
                f"at most {peak} held at once, {removed} token copies removed"
            )
        finally:
            management.delete_by_prefix(prefix + ".")


if __name__ == "__main__":
    main()
