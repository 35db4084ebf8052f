"""``Client.enqueue`` with a unique policy vs without: the cost of the lock on the enqueue path.

Sides, alternated round by round (:mod:`pairs`), each ``--jobs`` (300) enqueues from one
``Client`` on one thread:

* ``plain``: ``client.enqueue(type, [i])``, no policy (one confirmed publish);
* ``unique new key``: ``unique=UniquePolicy(keys=["type", "args"], period="PT1H")``, a new key
  each (the lock's two queues declared, token and holder's record published, confirmed);
* ``unique duplicate``: the same job again while the first holds the key (``DuplicateJobError``:
  a nacked token and a read of the holder's record; nothing is published);
* ``unique batch of 100``: ``client.enqueue_many`` of 100 jobs with a new key each (their locks
  taken together: ``UniqueLocks.acquire_many``), counted per job;
* with ``--redis URL`` (or ``$OJS_REDIS_URL``): ``redis new key`` and ``redis duplicate``, the same
  through ``Client(unique_backend=URL)`` (``SET NX PX``); then the server's ``used_memory`` per
  live lock (every lock of the rounds is still held: ``PT1H``).

Every job of a round stays queued (nobody consumes); the round's queue and locks are deleted
afterwards.  The machine is a shared 2-core box: the rates move ±20 % from round to round, so the
median of the per-round ratios is the figure to quote.

    OJS_AMQP_URL=amqp://guest:guest@localhost:5672// OJS_MANAGEMENT_URL=http://localhost:15672 \\
        python benchmarks/unique_enqueue.py [--jobs 300] [--rounds 5] [--redis redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from pairs import alternate, report_ratio

from ojs_kombu import Client, DuplicateJobError, Job, UniquePolicy
from ojs_kombu.amqp.management import ManagementClient

POLICY = UniquePolicy(keys=["type", "args"], period="PT1H")


def redis_sides(client: Client, jobs: int) -> list[tuple[str, Callable[[], float]]]:
    """``redis new key`` and ``redis duplicate``: as the RabbitMQ sides, on ``client`` (``unique_backend=`` Redis)."""
    client.enqueue("bench.warm", [0], unique=POLICY)
    client.enqueue("bench.rheld", [0], unique=POLICY)
    counter = [0]

    def new_key() -> float:
        base = counter[0]
        counter[0] += jobs
        start = time.perf_counter()
        for i in range(base, base + jobs):
            client.enqueue("bench.redis", [i], unique=POLICY)
        return jobs / (time.perf_counter() - start)

    def duplicate() -> float:
        start = time.perf_counter()
        for _ in range(jobs):
            try:
                client.enqueue("bench.rheld", [0], unique=POLICY)
            except DuplicateJobError:
                pass
            else:
                raise AssertionError("a duplicate was accepted")
        return jobs / (time.perf_counter() - start)

    return [("redis new key", new_key), ("redis duplicate", duplicate)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis", default=os.environ.get("OJS_REDIS_URL"), help="also measure the Redis backend")
    options = parser.parse_args()
    url = os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@localhost:5672//")
    management = ManagementClient(
        os.environ.get("OJS_MANAGEMENT_URL", "http://localhost:15672"),
        os.environ.get("OJS_MANAGEMENT_USER", "guest"),
        os.environ.get("OJS_MANAGEMENT_PASSWORD", "guest"),
    )
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    jobs = options.jobs
    try:
        with contextlib.ExitStack() as stack:
            client = stack.enter_context(Client(url, prefix=prefix))
            client.enqueue("bench.warm", [0], unique=POLICY)  # connection, channels, declarations

            def plain() -> float:
                start = time.perf_counter()
                for i in range(jobs):
                    client.enqueue("bench.plain", [i])
                return jobs / (time.perf_counter() - start)

            counter = [0]

            def unique_new() -> float:
                base = counter[0]
                counter[0] += jobs
                start = time.perf_counter()
                for i in range(base, base + jobs):
                    client.enqueue("bench.unique", [i], unique=POLICY)
                return jobs / (time.perf_counter() - start)

            client.enqueue("bench.held", [0], unique=POLICY)

            def duplicate() -> float:
                start = time.perf_counter()
                for _ in range(jobs):
                    try:
                        client.enqueue("bench.held", [0], unique=POLICY)
                    except DuplicateJobError:
                        pass
                    else:
                        raise AssertionError("a duplicate was accepted")
                return jobs / (time.perf_counter() - start)

            def batch() -> float:
                base = counter[0]
                counter[0] += jobs
                start = time.perf_counter()
                for first in range(base, base + jobs, 100):
                    size = min(100, base + jobs - first)
                    jobs_ = [Job.create("bench.unique", [i], unique=POLICY) for i in range(first, first + size)]
                    assert all(result.ok for result in client.enqueue_many(jobs_))
                return jobs / (time.perf_counter() - start)

            sides = [
                ("plain", plain),
                ("unique new key", unique_new),
                ("unique duplicate", duplicate),
                ("unique batch of 100", batch),
            ]
            if options.redis:
                redis_client = stack.enter_context(Client(url, prefix=prefix, unique_backend=options.redis))
                sides += redis_sides(redis_client, jobs)
                store = redis.Redis.from_url(options.redis)
                memory_before, keys_before = store.info("memory")["used_memory"], store.dbsize()

            print(f"{jobs} enqueues per side and round, one Client, one thread", flush=True)
            rates = alternate(sides, rounds=options.rounds)
            for label, values in rates.items():
                median = statistics.median(values)
                print(f"  {label:<19} median {median:8,.0f}/s  ({1000 / median:.2f} ms per enqueue)")
            for label, _ in sides[1:]:
                report_ratio(rates, label, "plain")
            if options.redis:
                keys = store.dbsize() - keys_before
                memory = store.info("memory")["used_memory"] - memory_before
                print(
                    f"  Redis: {keys:,} live locks, used_memory +{memory / 1e6:.1f} MB = {memory / max(keys, 1):.0f} B per lock"
                )
                leftovers = store.keys(f"{prefix}.*")
                if leftovers:
                    store.delete(*leftovers)
    finally:
        management.delete_by_prefix(prefix + ".")


if __name__ == "__main__":
    main()
