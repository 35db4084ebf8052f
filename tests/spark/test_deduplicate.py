"""Spark task retries re-send the same ids (DESIGN §15): with Worker(deduplicate=True) each job runs once (§19)."""

from __future__ import annotations

import threading
from collections import Counter

from support import message_count, wait_until

from ojs_kombu import Worker, current_job


def test_a_dataframe_written_twice_with_key_columns_runs_each_job_once(spark, amqp_url, prefix, names):
    df = spark.range(40).selectExpr("id AS customer_id").repartition(4)

    def write() -> None:
        (
            df.write.format("ojs")
            .mode("append")
            .option("prefix", prefix)
            .option("queue", "keyed")
            .option("type", "user.sync")
            .option("keyColumns", "customer_id")
            .option("idNamespace", "sync-dedupe")
            .save()
        )

    write()
    write()  # what a retried Spark task (or a re-run of the job) sends: the same ids again
    assert message_count(amqp_url, names.job_queue("keyed")) == 80
    runs: Counter[str] = Counter()
    lock = threading.Lock()
    # Concurrency 1: a copy is delivered after the other has completed (de-duplication skips
    # completed jobs; two copies running at the same instant both run).
    worker = Worker(amqp_url, queues=["keyed"], prefix=prefix, concurrency=1, deduplicate=True, grace_period=5)

    @worker.handler("user.sync")
    def sync(customer_id: int) -> None:
        with lock:
            runs[current_job().id] += 1

    with worker:
        wait_until(lambda: worker.deduplicated == 40, timeout=60, message="the second copies acked without running")
        wait_until(lambda: message_count(amqp_url, names.job_queue("keyed")) == 0, timeout=10, message="all acked")
    assert len(runs) == 40 and set(runs.values()) == {1}
