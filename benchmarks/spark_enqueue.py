"""Jobs from a Spark DataFrame: the ``ojs`` data source vs ``enqueue_partition`` vs ``Client.enqueue_many``.

    python benchmarks/spark_enqueue.py [--rows 100000] [--rounds 3] [--batch-size 1000] [--master 'local[2]']

One job per row (``bench.noop``, args ``[id, "user{id}@example.com"]``) into one durable
queue, purged between runs.  After a discarded warm-up of every side, each round runs,
in an order that rotates from round to round:

* the data source, ``df.write.format("ojs")``, on 1, 2 and 8 partitions;
* ``enqueue_partition`` under ``df.foreachPartition`` on 2 partitions;
* plain ``Client.enqueue_many`` in the driver, in chunks of the same batch size
  (building the jobs is timed too, as the data source converts rows).

It prints the median rows/s of each side, the fixed costs (a whole write of one row, and
per task from 8 one-row partitions against 1; the intercept of two sizes was tried and
is too noisy on a shared 2-core machine) and the ratio data source (2 and 8 partitions)
/ enqueue_many (target >= 0.8).  The machine's load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import kombu
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import ojs_kombu.spark
from ojs_kombu import Client, Job
from ojs_kombu.amqp.connection import resolve_url, safe_url
from ojs_kombu.spark import enqueue_partition

QUEUE = "bench"
TYPE = "bench.noop"


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--url", default=None, help="broker URL (default $OJS_AMQP_URL)")
    return parser.parse_args()


class Bench:
    """The session, the broker and the options shared by every side."""

    def __init__(self, spark: SparkSession, url: str, prefix: str, batch_size: int):
        self.spark = spark
        self.url = url
        self.prefix = prefix
        self.batch_size = batch_size
        self.client = Client(url, prefix=prefix)
        self.queue_name = self.client.declare_queue(QUEUE)

    def frame(self, rows: int, partitions: int) -> DataFrame:
        return self.spark.range(0, rows, numPartitions=partitions).select(
            F.col("id"), F.format_string("user%d@example.com", F.col("id")).alias("email")
        )

    def options(self) -> dict[str, str]:
        return {
            "url": self.url,
            "prefix": self.prefix,
            "queue": QUEUE,
            "type": TYPE,
            "argsColumns": "id,email",
            "batchSize": str(self.batch_size),
        }

    def purge(self) -> int:
        with kombu.Connection(self.url) as conn:
            return int(conn.channel().queue_purge(self.queue_name) or 0)

    def timed(self, run: Callable[[], None], rows: int) -> float:
        """Seconds ``run`` took; checks the queue got exactly ``rows`` jobs, then purges it."""
        self.purge()
        started = time.perf_counter()
        run()
        elapsed = time.perf_counter() - started
        got = self.purge()
        if got != rows:
            sys.exit(f"expected {rows} jobs in the queue, found {got}")
        return elapsed

    # -- the sides ---------------------------------------------------------------------------------

    def data_source(self, rows: int, partitions: int) -> float:
        frame = self.frame(rows, partitions)
        return self.timed(lambda: frame.write.format("ojs").mode("append").options(**self.options()).save(), rows)

    def foreach_partition(self, rows: int, partitions: int) -> float:
        frame = self.frame(rows, partitions)
        options = self.options()

        def each(partition: Iterable[Any]) -> None:
            enqueue_partition(partition, **options)

        return self.timed(lambda: frame.foreachPartition(each), rows)

    def enqueue_many(self, rows: int) -> float:
        def run() -> None:
            for start in range(0, rows, self.batch_size):
                jobs = [
                    Job.create(TYPE, [i, f"user{i}@example.com"], queue=QUEUE)
                    for i in range(start, min(rows, start + self.batch_size))
                ]
                failed = [r for r in self.client.enqueue_many(jobs) if not r.ok]
                if failed:
                    sys.exit(f"{len(failed)} jobs failed: {failed[0].error!r}")

        return self.timed(run, rows)

    def close(self) -> None:
        self.client.teardown()
        self.client.close()


def spark_session(master: str) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName("ojs spark_enqueue benchmark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    ojs_kombu.spark.register(spark)
    return spark


def main() -> None:
    args = _args()
    url = resolve_url(args.url)
    rows = args.rows
    load_before = os.getloadavg()
    spark = spark_session(args.master)
    slots = spark.sparkContext.defaultParallelism
    bench = Bench(spark, url, f"bench{uuid.uuid4().hex[:8]}", args.batch_size)
    sides: dict[str, Callable[[], float]] = {
        "data source, 1 partition": lambda: bench.data_source(rows, 1),
        "data source, 2 partitions": lambda: bench.data_source(rows, 2),
        "data source, 8 partitions": lambda: bench.data_source(rows, 8),
        "enqueue_partition, foreachPartition, 2 partitions": lambda: bench.foreach_partition(rows, 2),
        "Client.enqueue_many (driver)": lambda: bench.enqueue_many(rows),
    }
    small = max(2, rows // 10)
    fixed: dict[str, Callable[[], float]] = {
        "1 partition x 1 row": lambda: bench.data_source(1, 1),
        "8 partitions x 1 row": lambda: bench.data_source(8, 8),
    }
    seconds: dict[str, list[float]] = {label: [] for label in [*sides, *fixed]}
    try:
        print(f"broker {safe_url(url)}, Spark {spark.version} {args.master} ({slots} slots), {os.cpu_count()} cores")
        print(f"{rows:,} rows per run, batch size {args.batch_size}, {args.rounds} rounds after a warm-up", flush=True)
        bench.data_source(small, 2)
        bench.data_source(small, 8)
        bench.foreach_partition(small, 2)
        bench.enqueue_many(small)
        labels = list(sides)
        for index in range(args.rounds):
            shift = index % len(labels)
            for label in labels[shift:] + labels[:shift]:
                seconds[label].append(sides[label]())
            for label, run in fixed.items():
                seconds[label].append(run())
            print(f"  round {index + 1}: " + ", ".join(f"{s[-1]:.2f}s" for s in seconds.values()), flush=True)
    finally:
        bench.close()
        spark.stop()
    rates = {label: rows / statistics.median(seconds[label]) for label in sides}
    for label, rate in rates.items():
        spread = ", ".join(f"{rows / s:,.0f}" for s in seconds[label])
        print(f"{label:<52} {rate:>9,.0f} rows/s  (runs: {spread})")
    one, eight = (statistics.median(seconds[label]) for label in fixed)
    waves = -(-8 // slots)  # 8 one-row tasks run in this many waves of `slots` tasks
    per_task = (eight - one) / (waves - 1) if waves > 1 else float("nan")
    print(f"{'fixed cost of a write (1 partition, 1 row)':<52} {one * 1000:>9,.0f} ms")
    print(f"{'fixed cost per task ((8x1 row - 1x1 row) / (waves-1))':<52} {per_task * 1000:>9,.0f} ms")
    baseline = rates["Client.enqueue_many (driver)"]
    for label in ("data source, 2 partitions", "data source, 8 partitions"):
        print(f"{'ratio ' + label + ' / enqueue_many':<52} {rates[label] / baseline:>9.2f}x  (target >= 0.8x)")
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.2f} / after {load_after[0]:.2f} (1 min), {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
