"""A data pipeline on Spark: one OJS job per row, then the failures back into a DataFrame.

    python examples/spark_pipeline.py [--rows 100000] [--master 'local[2]'] [--archive DIR]

Against ``$OJS_AMQP_URL`` (``make setup`` installs PySpark and Java 17), under a
random entity prefix that is deleted at the end, it:

1. builds a DataFrame of ``--rows`` customers and keeps the active ones on a
   paid plan;
2. writes one ``email.send`` job per kept row with the ``ojs`` data source,
   ``keyColumns=customer_id`` (so a retried Spark task re-sends the same ids);
3. runs an in-process :class:`ojs_kombu.Worker` whose handler fails for every
   customer id divisible by 997 (a permanent failure: it raises
   :class:`ojs_kombu.DeadLetter`, so the job goes to the dead letter queue at
   once, with the error attached: ``dead_letter_mode="republish"``);
4. waits until every job ran and the failures sit in the dead letter queue;
5. reads the dead letters into a DataFrame (non-destructively), archives them to
   Parquet and purges exactly the archived ids from the dead letter queue.

It prints a short summary; the last line, ``SUMMARY {...}``, is JSON for tests.
On a cluster the same file runs with ``spark-submit`` (the library installed on the
executors, see the README's "Producing jobs from Spark")::

    spark-submit --master spark://spark-master:7077 --archives pipeline_env.tar.gz#environment \
        examples/spark_pipeline.py --archive s3a://bucket/dead-letters
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
import uuid

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import ojs_kombu.spark
from ojs_kombu import Client, DeadLetter, Worker

QUEUE = "email"
CAMPAIGN = "example.welcome-campaign"  # idNamespace: one per logical run of the pipeline
CAMPAIGN_STARTED = "2026-11-24T09:00:00Z"
FAILING_MODULUS = 997  # customer ids divisible by this fail (the deterministic "bad address")


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="customers in the DataFrame")
    parser.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the customer DataFrame")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the worker")
    parser.add_argument("--prefix", default=None, help="entity prefix (default: a random one)")
    parser.add_argument(
        "--archive", default=None, help="archive directory, local or shared (hdfs://, s3a://); default: a new temp dir"
    )
    return parser.parse_args()


def spark_session(master: str | None) -> SparkSession:
    """The Spark session: on ``master``, else spark-submit's ``--master``, else PySpark's ``local[*]``.

    Small and quiet: no web UI, few shuffle partitions, Python workers on this interpreter
    unless ``$PYSPARK_PYTHON`` says otherwise (a cluster's packed environment).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("ojs spark_pipeline example")
    if master is not None:
        builder = builder.master(master)
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    ojs_kombu.spark.register(spark)
    return spark


def customers(spark: SparkSession, rows: int, partitions: int) -> DataFrame:
    """``rows`` synthetic customers: id, e-mail address, plan, active flag."""
    plans = F.array(F.lit("free"), F.lit("pro"), F.lit("team"))
    return spark.range(0, rows, numPartitions=partitions).select(
        F.col("id").alias("customer_id"),
        F.format_string("customer%d@example.com", F.col("id")).alias("email"),
        F.element_at(plans, (F.col("id") % 3 + 1).cast("int")).alias("plan"),
        (F.col("id") % 10 != 0).alias("active"),
    )


def main() -> None:
    args = _args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    prefix = args.prefix or f"sparkex{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    spark = spark_session(args.master)
    client = Client(prefix=prefix)
    worker = Worker(queues=[QUEUE], concurrency=4, prefix=prefix, grace_period=10, dead_letter_mode="republish")
    lock = threading.Lock()
    outcomes = {"sent": 0, "failed": 0}

    @worker.handler("email.send")
    def send_email(customer_id: int, email: str, *, template: str) -> None:
        with lock:
            failing = customer_id % FAILING_MODULUS == 0
            outcomes["failed" if failing else "sent"] += 1
        if failing:
            raise DeadLetter(f"mail server refused {email}")

    archive = (args.archive or tempfile.mkdtemp(prefix="ojs-dead-letters-")).rstrip("/") + "/email.parquet"
    try:
        client.declare_queue(QUEUE)  # so that client.teardown() removes it at the end
        worker.start()
        if not worker.wait_until_ready(timeout=30):
            raise SystemExit(f"the worker did not connect: {worker.error}")

        # 1-2. Select the customers and write one job per row.
        selected = customers(spark, args.rows, args.partitions).where("active AND plan != 'free'")
        jobs = selected.select(
            "customer_id",
            "email",
            F.when(F.col("plan") == "team", "welcome-team").otherwise("welcome").alias("template"),
        ).cache()
        expected = jobs.count()
        expected_failures = jobs.where(F.col("customer_id") % FAILING_MODULUS == 0).count()
        write_started = time.monotonic()
        (
            jobs.write.format("ojs")
            .mode("append")
            .option("prefix", prefix)
            .option("queue", QUEUE)
            .option("type", "email.send")
            .option("argsColumns", "customer_id,email")
            .option("kwargsColumns", "template")
            .option("keyColumns", "customer_id")
            .option("idNamespace", CAMPAIGN)
            .option("idTimestamp", CAMPAIGN_STARTED)  # the ids' time bits: fixed, so re-runs give the same ids
            .save()
        )
        write_seconds = time.monotonic() - write_started
        print(f"Spark {spark.version} on {spark.sparkContext.master}, entity prefix {prefix}", flush=True)
        print(f"customers: {args.rows:,}  selected: {expected:,}  written in {write_seconds:.1f}s", flush=True)

        # 3-4. Wait until every job ran and every failure reached the dead letter queue.
        deadline = time.monotonic() + args.timeout
        while True:
            with lock:
                ran = outcomes["sent"] + outcomes["failed"]
            if ran >= expected and len(client.dead_letters(QUEUE, limit=expected_failures + 1)) >= expected_failures:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out: {ran:,} of {expected:,} jobs ran, {outcomes}")
            time.sleep(0.2)
        worker.stop()
        print(f"worker: {outcomes['sent']:,} sent, {outcomes['failed']:,} failed", flush=True)

        # 5. Dead letters into a DataFrame, archived to Parquet, then exactly those ids purged.
        dead = spark.read.format("ojs").option("source", "dead_letters").option("prefix", prefix)
        dead = dead.option("queue", QUEUE).load()
        dead.write.mode("error").parquet(archive)
        archived = spark.read.parquet(archive)
        archived_ids = [row.id for row in archived.select("id").collect()]
        sample = archived.select("id", "args", "reason", "error_message").orderBy("args").first()
        purged = client.purge_dead_letters(QUEUE, ids=archived_ids)
        left = len(client.dead_letters(QUEUE, limit=expected_failures + 1))
        print(f"dead letters: {len(archived_ids):,} archived to {archive}, {purged:,} purged, {left} left", flush=True)
        if sample is not None:
            print(f"  e.g. {sample.id} args={sample.args} {sample.reason}: {sample.error_message!r}", flush=True)
        summary = {
            "rows": args.rows,
            "selected": expected,
            "expected_failures": expected_failures,
            "sent": outcomes["sent"],
            "failed": outcomes["failed"],
            "archived": len(archived_ids),
            "archived_distinct": len(set(archived_ids)),
            "purged": purged,
            "left": left,
            "parquet": archive,
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        worker.stop()
        removed = worker.teardown() + client.teardown()
        client.close()
        spark.stop()
    print(f"done in {summary['seconds']}s; removed {removed} entities under prefix {prefix}")
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
