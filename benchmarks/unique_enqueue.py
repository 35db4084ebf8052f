"""``Client.enqueue`` with a unique policy vs without: the cost of the lock on the enqueue path.

Sides, alternated round by round (:mod:`pairs`), each ``--jobs`` (300) enqueues from one
``Client`` on one thread:

* ``plain``: ``client.enqueue(type, [i])``, no policy (one confirmed publish);
* ``unique new key``: ``unique=UniquePolicy(keys=["type", "args"], period="PT1H")``, a new key
  each (the lock's two queues declared, token and holder's record published, confirmed);
* ``unique duplicate``: the same job again while the first holds the key (``DuplicateJobError``:
  a nacked token and a read of the holder's record; nothing is published).

Every job of a round stays queued (nobody consumes); the round's queue and locks are deleted
afterwards.  The machine is a shared 2-core box: the rates move ±20 % from round to round, so the
median of the per-round ratios is the figure to quote.

    OJS_AMQP_URL=amqp://guest:guest@localhost:5672// OJS_MANAGEMENT_URL=http://localhost:15672 \\
        python benchmarks/unique_enqueue.py [--jobs 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pairs import alternate, report_ratio

from ojs_kombu import Client, DuplicateJobError, UniquePolicy
from ojs_kombu.amqp.management import ManagementClient

POLICY = UniquePolicy(keys=["type", "args"], period="PT1H")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
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
        with Client(url, prefix=prefix) as client:
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

            print(f"{jobs} enqueues per side and round, one Client, one thread", flush=True)
            rates = alternate(
                [("plain", plain), ("unique new key", unique_new), ("unique duplicate", duplicate)],
                rounds=options.rounds,
            )
            for label, values in rates.items():
                median = statistics.median(values)
                print(f"  {label:<17} median {median:8,.0f}/s  ({1000 / median:.2f} ms per enqueue)")
            report_ratio(rates, "unique new key", "plain")
            report_ratio(rates, "unique duplicate", "plain")
    finally:
        management.delete_by_prefix(prefix + ".")


if __name__ == "__main__":
    main()
