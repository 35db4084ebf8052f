"""Dead letters into a DataFrame (non-destructive, then purged by id) and the streaming sink's replay ids."""

from __future__ import annotations

import json
import os
import time

import pika
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from support import get_messages, message_count, pika_parameters, raw_channel, wait_until

from ojs_kombu import Client
from ojs_kombu.model.job import Job
from tools.schema import validate_job


def test_dead_letters_read_leaves_the_queue_unchanged_then_purge_by_ids(spark, amqp_url, prefix, names, tmp_path):
    with Client(amqp_url, prefix=prefix) as client:
        jobs = [client.enqueue("email.send", [f"u{i}@example.com"], queue="email", kwargs={"n": i}) for i in range(6)]
        with raw_channel(amqp_url) as channel:  # a worker's terminal failure: Basic.Nack(requeue=False) -> DLQ
            for _ in jobs:
                method, _, _ = channel.basic_get(names.job_queue("email"))
                channel.basic_nack(method.delivery_tag, requeue=False)
        dead_letter_queue = names.dead_letter_queue("email")
        wait_until(lambda: message_count(amqp_url, dead_letter_queue) == 6, message="6 dead letters")
        before = [e.message_id for e in client.dead_letters("email")]

        df = (
            spark.read.format("ojs")
            .option("source", "dead_letters")
            .option("prefix", prefix)
            .option("queue", "email")
            .load()
        )
        rows = df.collect()
        assert [r.id for r in rows] == before == [job.id for job in jobs]
        for row, job in zip(rows, jobs, strict=True):
            assert (row.type, row.queue, row.attempt) == ("email.send", "email", 1)  # the attempt nacked
            assert json.loads(row.args) == job.args and json.loads(row.kwargs) == job.kwargs
            assert row.reason == "rejected" and row.death_count == 1 and row.dead_lettered_at is not None
            assert row.error_message is None  # nacked without a record: the final error is unknown
            validate_job(json.loads(row.envelope))
        # Non-destructive: same letters, same order.
        assert [e.message_id for e in client.dead_letters("email")] == before
        assert message_count(amqp_url, dead_letter_queue) == 6

        # The pipeline archives some, then removes exactly those.
        archived = df.where(F.col("id").isin(before[1], before[4])).select("id", "envelope")
        archived.write.parquet(str(tmp_path / "archive"))
        ids = [r.id for r in spark.read.parquet(str(tmp_path / "archive")).collect()]
        assert client.purge_dead_letters("email", ids=ids) == 2
        assert [e.message_id for e in client.dead_letters("email")] == [i for i in before if i not in ids]

    with pytest.raises(Exception, match="needs the 'queue' option"):
        spark.read.format("ojs").option("source", "dead_letters").load().collect()
    with pytest.raises(Exception, match="reads only dead letters"):
        spark.read.format("ojs").load().collect()


def test_a_restarted_stream_replays_its_batch_with_the_same_ids(spark, amqp_url, prefix, names, tmp_path):
    source, checkpoint, marker = tmp_path / "in", tmp_path / "checkpoint", tmp_path / "fail"
    spark.range(300, numPartitions=2).selectExpr("id AS n").write.json(str(source))
    marker.touch()
    queue = names.job_queue("stream")
    parameters, marker_path = pika_parameters(amqp_url), str(marker)

    @F.udf("string")
    def padding_or_death(n: int) -> str:
        # While the marker exists, the row n=120 dies, once the sink has confirmed some chunks: every task
        # attempt fails, the query stops mid-batch.  The padding fills the UDF worker's output buffer so that
        # rows reach the sink before the failure.
        if n == 120 and os.path.exists(marker_path):
            connection = pika.BlockingConnection(parameters)
            try:
                channel, deadline = connection.channel(), time.monotonic() + 30
                while channel.queue_declare(queue, passive=True).method.message_count < 50:
                    assert time.monotonic() < deadline, "the sink confirmed no chunk"
                    time.sleep(0.05)
            finally:
                connection.close()
            raise RuntimeError("injected failure")
        return "x" * 2000

    def run() -> None:
        stream = spark.readStream.schema("n long").json(str(source)).select("n", padding_or_death("n").alias("padding"))
        query = (
            stream.writeStream.format("ojs")
            .option("prefix", prefix)
            .option("queue", "stream")
            .option("type", "x.y")
            .option("argsColumns", "n")
            .option("batchSize", "50")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)

    with pytest.raises(StreamingQueryException, match="injected failure"):
        run()
    first = drain_all(amqp_url, queue)
    assert 0 < len(first) < 300  # stopped mid-batch, with confirmed chunks
    marker.unlink()
    run()
    second = drain_all(amqp_url, queue)
    assert sorted(job.args[0] for job in second) == list(range(300))
    assert len({job.id for job in second}) == 300
    replayed = {job.args[0]: job.id for job in second}
    assert all(replayed[job.args[0]] == job.id for job in first)  # the replayed batch re-sent the same ids


def drain_all(amqp_url: str, queue: str) -> list[Job]:
    """Consume every job in ``queue`` now (validated against the schema)."""
    messages = get_messages(amqp_url, queue, message_count(amqp_url, queue), timeout=10)
    jobs = []
    for _, _, body in messages:
        validate_job(json.loads(body))
        jobs.append(Job.from_json(body))
    return jobs
