"""Batch writes of the ``ojs`` data source and enqueue_partition, against the real broker and a real local Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, date, datetime
from decimal import Decimal

import pika
import pytest
from pyspark import TaskContext
from pyspark.sql.types import (
    ArrayType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from support import get_messages, message_count, pika_parameters, wait_until

from ojs_kombu.model.job import Job
from ojs_kombu.spark import enqueue_partition
from ojs_kombu.spark.ids import key_id
from tools.schema import validate_job


def drain(amqp_url: str, queue: str, count: int, timeout: float = 10.0) -> list[Job]:
    """Consume exactly ``count`` jobs from ``queue`` (validated against the schema); fail on fewer or more."""
    messages = get_messages(amqp_url, queue, count, timeout=timeout)
    assert len(messages) == count, f"{queue}: {len(messages)} of {count} jobs"
    assert get_messages(amqp_url, queue, 1, timeout=0.2) == [], f"{queue}: more than {count} jobs"
    jobs = []
    for _, properties, body in messages:
        envelope = json.loads(body)
        validate_job(envelope)
        assert properties.message_id == envelope["id"]
        jobs.append(Job.from_json(body))
    return jobs


def test_one_job_per_row_with_the_documented_mapping(spark, amqp_url, prefix, names):
    schema = StructType(
        [
            StructField("customer_id", LongType()),
            StructField("email", StringType()),
            StructField("amount", DecimalType(10, 2)),
            StructField("day", DateType()),
            StructField("seen", TimestampType()),
            StructField(
                "address", StructType([StructField("zip", StringType()), StructField("lines", ArrayType(StringType()))])
            ),
            StructField("queue", StringType()),
            StructField("type", StringType()),
            StructField("priority", IntegerType()),
            StructField("scheduled_at", TimestampType()),
            StructField("meta", MapType(StringType(), StringType())),
            StructField("tags", ArrayType(StringType())),
        ]
    )
    seen = datetime(2026, 2, 15, 10, 30, 0, 123000, tzinfo=UTC)
    past = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        (
            i,
            f"u{i}@example.com",
            Decimal(f"{i}.50"),
            date(2026, 2, i + 1),
            seen,
            (f"0{i}", ["a", "b"]),
            "sms" if i % 3 == 0 else None,
            "sms.send" if i % 3 == 0 else None,
            i % 5 if i % 2 else None,
            past if i == 4 else None,
            {"source": "crm"} if i % 2 else None,
            ["vip"] if i == 1 else None,
        )
        for i in range(10)
    ]
    df = spark.createDataFrame(rows, schema).repartition(3)
    (
        df.write.format("ojs")
        .mode("append")
        .option("prefix", prefix)
        .option("queue", "email")
        .option("type", "email.send")
        .option("argsColumns", "email,amount")
        .option("kwargsColumns", "customer_id,day,seen,address")
        .option("maxPriority", "10")
        .option("batchSize", "2")
        .save()
    )
    jobs = {job.kwargs["customer_id"]: job for job in drain(amqp_url, names.job_queue("email"), 6)}
    jobs.update({job.kwargs["customer_id"]: job for job in drain(amqp_url, names.job_queue("sms"), 4)})
    assert sorted(jobs) == list(range(10))
    for i, job in jobs.items():
        assert job.args == [f"u{i}@example.com", f"{i}.50"]  # decimal: a string
        assert job.kwargs == {
            "customer_id": i,
            "day": f"2026-02-{i + 1:02d}",
            "seen": "2026-02-15T10:30:00.123Z",
            "address": {"zip": f"0{i}", "lines": ["a", "b"]},
        }
        assert (job.queue, job.type) == (("sms", "sms.send") if i % 3 == 0 else ("email", "email.send"))
        assert job.priority == (i % 5 if i % 2 else None)
        assert job.scheduled_at == ("2026-01-01T00:00:00.000Z" if i == 4 else None)
        assert (job.meta or {}).get("source") == ("crm" if i % 2 else None)
        assert (job.meta or {}).get("tags") == (["vip"] if i == 1 else None)


def test_key_columns_give_the_same_ids_on_every_write(spark, amqp_url, prefix, names):
    df = spark.range(40).selectExpr("id AS customer_id", "concat('u', id) AS name").repartition(4)

    def write() -> None:
        (
            df.write.format("ojs")
            .mode("append")
            .option("prefix", prefix)
            .option("queue", "keyed")
            .option("type", "user.sync")
            .option("keyColumns", "customer_id")
            .option("idNamespace", "sync-1")
            .option("idTimestamp", "2026-02-15T00:00:00Z")
            .save()
        )

    write()
    write()
    jobs = drain(amqp_url, names.job_queue("keyed"), 80)
    by_id: dict[str, list[Job]] = {}
    for job in jobs:
        by_id.setdefault(job.id, []).append(job)
    assert len(by_id) == 40 and all(len(copies) == 2 for copies in by_id.values())
    ms = int(datetime(2026, 2, 15, tzinfo=UTC).timestamp() * 1000)
    assert all(job.id == key_id("sync-1", [job.kwargs["customer_id"]], ms) for job in jobs)
    assert all(
        job.kwargs == {"customer_id": int(job.kwargs["customer_id"]), "name": f"u{job.kwargs['customer_id']}"}
        for job in jobs
    )


def test_bad_options_missing_columns_and_overwrite_fail_before_publishing(spark, amqp_url, prefix, names, management):
    df = spark.range(5).selectExpr("id", "cast(cast(id AS string) AS binary) AS blob")

    def write(mode: str = "append", **options: str) -> None:
        writer = df.write.format("ojs").mode(mode).option("prefix", prefix).option("queue", "refused")
        for key, value in {"type": "x.y", **options}.items():
            writer = writer.option(key, value)
        writer.save()

    cases = [
        ({"mode": "overwrite", "argsColumns": "id"}, "only appends"),
        ({"queu": "typo", "argsColumns": "id"}, "unknown option(s) queu"),
        ({"argsColumns": "id,nope"}, "no column 'nope'"),
        ({}, "'blob' holds binary values"),
        ({"argsColumns": "id", "batchSize": "-3"}, "batchsize must be an integer >= 1"),
    ]
    for options, words in cases:
        with pytest.raises(Exception, match=words.replace("(", r"\(").replace(")", r"\)")):
            write(**options)
    for mode in ("error", "ignore"):
        with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
            write(mode, argsColumns="id")
    assert management.queues(prefix + ".") == []  # failed on the driver: not even the queue was declared


def test_a_full_reject_publish_queue_fails_the_task_with_publish_nacked(spark, amqp_url, prefix, names):
    df = spark.range(20).coalesce(1)
    with pytest.raises(Exception, match="PublishNackedError") as caught:
        (
            df.write.format("ojs")
            .mode("append")
            .option("prefix", prefix)
            .option("queue", "full")
            .option("type", "x.y")
            .option("argsColumns", "id")
            .option("maxLength", "5")
            .option("overflow", "reject-publish")
            .option("batchSize", "5")
            .save()
        )
    assert "ChunkNotConfirmedError" in str(caught.value)
    assert message_count(amqp_url, names.job_queue("full")) == 5  # the first chunk, confirmed, stays


def test_an_injected_failure_after_confirmed_chunks_is_retried_and_loses_nothing(spark, amqp_url, prefix, names):
    """A partition's first attempt dies after some of its chunks were confirmed: Spark retries the task
    (local[2,4]), the job succeeds, every row's job is there, and the re-sent ones carry the same ids."""
    queue, first = names.job_queue("retried"), names.job_queue("first")
    rows, fail_at = 400, 150
    parameters = pika_parameters(
        amqp_url
    )  # the generator runs in a worker, where the tests' modules are not importable

    def rows_of(partition: int, _: object) -> object:
        context = TaskContext.get()
        for i in range(partition * 200, partition * 200 + 200):
            if partition == 0 and context.attemptNumber() == 0 and i == fail_at:
                # Wait until the writer has confirmed chunks of this partition, then die.
                connection = pika.BlockingConnection(parameters)
                try:
                    deadline = time.monotonic() + 30
                    while connection.channel().queue_declare(first, passive=True).method.message_count < 50:
                        assert time.monotonic() < deadline, "the writer confirmed no chunk"
                        time.sleep(0.05)
                finally:
                    connection.close()
                raise RuntimeError("injected failure")
            # The padding (unpublished) fills the worker's 64 KiB output buffer, so rows flow on before the failure.
            yield (i, "first" if partition == 0 else "retried", "x" * 2000)

    source = spark.sparkContext.parallelize(range(2), 2).mapPartitionsWithIndex(rows_of)
    spark.createDataFrame(source, "n long, queue string, padding string").write.format("ojs").mode("append").option(
        "prefix", prefix
    ).option("type", "x.y").option("keyColumns", "n").option("argsColumns", "n").option("batchSize", "50").save()

    total = message_count(amqp_url, queue) + message_count(amqp_url, first)
    jobs = drain(amqp_url, queue, message_count(amqp_url, queue)) + drain(
        amqp_url, first, message_count(amqp_url, first)
    )
    ids = {job.id for job in jobs}
    assert sorted({job.args[0] for job in jobs}) == list(range(rows))  # every row's job is there
    assert len(ids) == rows  # distinct ids == rows: duplicates carry the same id
    assert total > rows, "the first attempt published nothing before it died"
    by_row = {}
    for job in jobs:
        assert by_row.setdefault(job.args[0], job.id) == job.id


def test_enqueue_partition_under_foreach_partition_and_one_connection_per_process(
    spark, amqp_url, prefix, names, management
):
    df = spark.range(300, numPartitions=6).selectExpr("id AS n", "id % 2 = 0 AS even")
    options = {"prefix": prefix, "queue": "plain", "type": "x.y", "key_columns": ["n"], "argsColumns": "n,even"}
    results = df.rdd.mapPartitions(lambda rows: [(enqueue_partition(rows, **options), os.getpid())]).collect()
    assert sum(r.rows for r, _ in results) == 300 and all(r.queues == {"plain": 50} for r, _ in results)
    jobs = drain(amqp_url, names.job_queue("plain"), 300)
    assert sorted(job.args[0] for job in jobs) == list(range(300))
    assert all(job.args[1] == (job.args[0] % 2 == 0) for job in jobs)
    df.write.format("ojs").mode("append").options(**{k: v for k, v in options.items() if k != "key_columns"}).save()
    drain(amqp_url, names.job_queue("plain"), 300)

    # Connections named for this prefix: one per Python worker process that ran a task, never more.
    processes = {pid for _, pid in results}

    def ours() -> list[str]:
        return [
            c["client_properties"].get("connection_name", "")
            for c in management.connections()
            if prefix in c.get("client_properties", {}).get("connection_name", "")
        ]

    names_seen = wait_until(ours, timeout=15, message="the workers' connections")
    pids = [int(name.rsplit(" ", 1)[1]) for name in names_seen]
    assert len(pids) == len(set(pids)), names_seen  # one connection per process
    assert set(pids) >= processes  # the processes of the mapPartitions tasks are among them
    assert len(pids) <= len(processes) + 2, names_seen  # bounded by the worker processes (2 cores)


def test_enqueue_partition_works_without_pyarrow(amqp_url, prefix, names):
    script = (
        "import sys; sys.modules['pyarrow'] = None\n"  # any import of pyarrow now fails
        "from pyspark.sql import Row\n"
        "from ojs_kombu.spark import enqueue_partition\n"
        "rows = [Row(n=i, email=f'u{i}@example.com') for i in range(5)]\n"
        f"result = enqueue_partition(rows, url={amqp_url!r}, prefix={prefix!r}, queue='plain', type='x.y', batchSize=2)\n"
        "print(result.rows, result.chunks)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["5", "3"]
    jobs = drain(amqp_url, names.job_queue("plain"), 5)
    assert sorted(job.kwargs["n"] for job in jobs) == list(range(5))  # no args options: the columns are kwargs
