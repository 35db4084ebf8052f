"""Execution de-duplication at scale: memory and replay time of 1 M completed job ids.

    python benchmarks/completed_ids.py [--count 1000000] [--url amqp://…]

1. Memory: ``CompletedIds`` holding ``--count`` UUIDv7 ids (``tracemalloc``: what the
   structure itself allocates), and the time to add and to look them up.
2. The stream: ``--count`` ids recorded through a ``CompletedLog`` (records of 1,000 ids,
   confirmed), then a second ``CompletedLog`` started cold: its replay time (start to caught
   up) and its process's resident memory growth.  Everything is declared under a unique
   prefix and deleted afterwards.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
import tracemalloc
import uuid
from pathlib import Path

import pika

from ojs_kombu.amqp.connection import resolve_url
from ojs_kombu.model.ids import new_job_id
from ojs_kombu.model.naming import Names
from ojs_kombu.runtime.completed import CompletedIds, CompletedLog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support import pika_parameters


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--url", default=None, help="broker URL (default $OJS_AMQP_URL)")
    args = parser.parse_args()
    url = resolve_url(args.url)
    ids = [new_job_id() for _ in range(args.count)]

    tracemalloc.start()
    held = CompletedIds(7 * 86400, 2 * args.count)
    started = time.perf_counter()
    now = time.time()
    for start in range(0, len(ids), 1000):
        held.add_many(ids[start : start + 1000], now)
    added = time.perf_counter() - started
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    started = time.perf_counter()
    assert all(i in held for i in ids)
    looked = time.perf_counter() - started
    print(
        f"CompletedIds: {len(held):,} ids, {size / 1e6:.1f} MB ({size / len(held):.0f} B/id); "
        f"add {added / len(ids) * 1e6:.2f} us/id, lookup {looked / len(ids) * 1e6:.2f} us/id"
    )
    del held

    names = Names(f"bench-completed-{uuid.uuid4().hex[:8]}")
    writer = CompletedLog(url, ["bench"], names=names)
    assert writer.start(60)
    started = time.perf_counter()
    confirmed = 0
    done_lock = threading.Lock()

    def done(ok: bool) -> None:
        nonlocal confirmed
        with done_lock:
            confirmed += ok

    for job_id in ids:
        writer.record(job_id, "bench", done)
    while confirmed < len(ids):
        time.sleep(0.05)
    recorded = time.perf_counter() - started
    print(f"recorded {len(ids):,} ids in {recorded:.1f}s ({len(ids) / recorded:,.0f} ids/s, one thread)")
    writer.stop()
    del writer

    rss = _rss_mb()
    reader = CompletedLog(url, ["bench"], names=names)
    started = time.perf_counter()
    assert reader.start(300), "no catch-up within 300 s"
    replay = time.perf_counter() - started
    grown = _rss_mb() - rss
    assert all(reader.is_completed(i) for i in ids[:: max(1, len(ids) // 1000)])
    print(
        f"cold start: {reader.replayed:,} ids replayed in {replay:.2f}s "
        f"({reader.replayed / replay:,.0f} ids/s); resident memory +{grown:.0f} MB; "
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB"
    )
    reader.stop()
    with pika.BlockingConnection(pika_parameters(url)) as connection:
        connection.channel().queue_delete(names.completed_stream("bench"))


if __name__ == "__main__":
    main()
