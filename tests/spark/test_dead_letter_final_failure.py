"""The Spark dead-letter reader's columns show the final failure, in both dead-letter modes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from support import message_count, wait_until

from ojs_kombu import Client, DeadLetter, RetryPolicy, Worker, current_job

FAST = RetryPolicy(max_attempts=3, initial_interval="PT0.05S", jitter=False)


def test_dead_letter_rows_show_the_final_failure(spark, amqp_url, prefix, names):
    since = datetime.now(UTC)
    queues = {"nack": "ffn", "republish": "ffr"}
    workers = []
    try:
        for mode, queue in queues.items():
            worker = Worker(amqp_url, queues=[queue], prefix=prefix, dead_letter_mode=mode, grace_period=5)

            @worker.handler("flaky.job")
            def flaky() -> None:
                raise RuntimeError(f"fail #{current_job().attempt}")

            @worker.handler("blocked.job")
            def blocked() -> None:
                raise DeadLetter("customer 100 is blocked")

            worker.start()
            assert worker.wait_until_ready(15)
            workers.append(worker)
        with Client(amqp_url, prefix=prefix) as client:
            for queue in queues.values():
                client.enqueue("flaky.job", [], queue=queue, retry=FAST)
                client.enqueue("blocked.job", [], queue=queue)
        for queue in queues.values():
            wait_until(lambda q=queue: message_count(amqp_url, names.dead_letter_queue(q)) == 2, 20, message=queue)
    finally:
        for worker in workers:
            worker.stop(timeout=5)

    for mode, queue in queues.items():
        rows = spark.read.format("ojs").option("source", "dead_letters").option("prefix", prefix)
        by_type = {row.type: row for row in rows.option("queue", queue).load().collect()}
        flaky_row, blocked_row = by_type["flaky.job"], by_type["blocked.job"]
        assert (flaky_row.attempt, flaky_row.error_code, flaky_row.error_type, flaky_row.error_message) == (
            3,
            "handler_error",
            "RuntimeError",
            "fail #3",
        ), mode
        assert (blocked_row.attempt, blocked_row.error_type, blocked_row.error_message) == (
            1,
            "DeadLetter",
            "customer 100 is blocked",
        ), mode
        for row in (flaky_row, blocked_row):
            assert row.reason == ("rejected" if mode == "nack" else "republished")
            failed_at = row.failed_at.replace(tzinfo=UTC)  # the session's time zone is UTC
            assert since - timedelta(seconds=2) <= failed_at <= datetime.now(UTC), mode
            assert row.dead_lettered_at is not None
