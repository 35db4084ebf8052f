"""What a Worker tells its operators: the ``ojs_amqp_*`` gauges of binding §12.1 and
structured logs that carry the job's fields and never a password (DESIGN §10)."""

from __future__ import annotations

import logging
import threading
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest
from prometheus_client import REGISTRY
from support import wait_until

from ojs_kombu import RetryPolicy, Worker
from ojs_kombu.errors import WorkerError


def sample(name: str, **labels: str) -> float:
    """The current value of a metric in prometheus_client's default registry (0 when never set)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_channels_unacked_and_utilization_gauges(client, amqp_url, prefix):
    queue = f"metrics-{prefix}"
    name = f"{prefix} metrics worker"
    release = threading.Event()
    worker = Worker(amqp_url, prefix=prefix, queues=[queue], concurrency=2, connection_name=name, grace_period=5)

    @worker.handler("block.job")
    def block() -> None:
        release.wait(30)

    channels_before = sample("ojs_amqp_channels_active")
    worker.start()
    try:
        assert worker.wait_until_ready()
        assert sample("ojs_amqp_channels_active") == channels_before + 3  # consuming, publishing, control

        def window() -> tuple[float, float]:
            return sample("ojs_amqp_messages_unacked", consumer=name), sample(
                "ojs_amqp_consumer_utilization", queue=queue
            )

        client.enqueue("block.job", [], queue=queue)
        wait_until(lambda: window() == (1, 0.5), message="one unacked, half the prefetch of 2 in use")
        client.enqueue("block.job", [], queue=queue)
        wait_until(lambda: window() == (2, 1.0), message="two unacked, the whole prefetch in use")
        release.set()
        wait_until(lambda: window() == (0, 0.0), message="all acked")
        assert sample("ojs_amqp_messages_acked_total", queue=queue) == 2
    finally:
        release.set()
        worker.stop()
    assert sample("ojs_amqp_channels_active") == channels_before


def test_log_records_about_a_job_carry_its_fields(client, amqp_url, prefix, caplog):
    caplog.set_level(logging.INFO, logger="ojs_kombu")
    worker = Worker(amqp_url, prefix=prefix, grace_period=5)

    @worker.handler("failing.job")
    def fail() -> None:
        raise RuntimeError("fail on purpose")

    job = client.enqueue("failing.job", [], retry=RetryPolicy(max_attempts=2, initial_interval="PT0.1S"))

    def about_the_job(word: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "job_id", None) == job.id and word in r.getMessage()]

    with worker:  # the worker logs each failed attempt, the settler the dead letter
        wait_until(lambda: about_the_job("dead-lettered"), timeout=20, message="the dead letter logged")
    records = about_the_job("failed") + about_the_job("dead-lettered")
    fields = [(r.job_id, r.job_type, r.queue, r.attempt) for r in records]  # type: ignore[attr-defined]
    assert fields == [
        (job.id, "failing.job", "default", 1),
        (job.id, "failing.job", "default", 2),
        (job.id, "failing.job", "default", 2),
    ]


def test_a_password_in_the_url_is_never_logged(amqp_url, prefix, caplog):
    secret = f"pw-{uuid.uuid4().hex}"
    parts = urlsplit(amqp_url)
    bad_url = urlunsplit(parts._replace(netloc=f"guest:{secret}@{parts.hostname}:{parts.port}"))
    caplog.set_level(logging.DEBUG)  # every logger: ours, kombu's, py-amqp's
    worker = Worker(bad_url, prefix=prefix, connect_retries=1, grace_period=1)

    with pytest.raises(WorkerError) as raised:  # the broker refuses the password: the worker gives up
        worker.run()

    formatter = logging.Formatter("%(message)s")
    logged = "\n".join(formatter.format(record) for record in caplog.records)  # tracebacks included
    assert f"{parts.hostname}:{parts.port}" in logged  # the URL was logged, masked
    assert secret not in logged
    assert secret not in str(raised.value) and secret not in repr(raised.value.__cause__)
