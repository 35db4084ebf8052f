"""Execution de-duplication for Celery over ``ojs://`` (transport option ``deduplicate``, issue 30 item 2):
a task id delivered twice runs once in a prefork worker, and ``Task.retry()`` (which re-sends the same id
before the ack) still retries."""

from __future__ import annotations

import pytest
from support import read_stream

from ojs_celery import Celery

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]


def test_a_task_id_delivered_twice_runs_once_and_a_retry_still_runs(
    amqp_url, prefix, names, celery_subprocess_worker, tmp_path
):
    producer = Celery(
        "worker_app",
        broker=amqp_url,
        broker_backend="ojs",
        backend="rpc://",
        broker_transport_options={"prefix": prefix},
    )
    runs, retried = tmp_path / "runs", tmp_path / "retried"
    try:
        with celery_subprocess_worker(concurrency=2, extra_env={"OJS_DEDUPLICATE": "1"}):
            first = producer.send_task("worker_app.record_run", (str(runs),))
            first.get(timeout=60)  # the result is stored before the worker records the id and acks: wait for it
            read_stream(amqp_url, names.completed_stream("celery"), predicate=lambda m, p, body: first.id in str(body))
            # The same job id published again (what a broker crash or a producer's retry leaves): acked unrun.
            producer.send_task("worker_app.record_run", (str(runs),), task_id=first.id)
            # Task.retry() re-sends its own id before the original is acked: the retry is no duplicate.
            retrying = producer.send_task("worker_app.retry_once", (str(retried),))
            assert retrying.get(timeout=60) == 1
            # One consumer, FIFO: a task sent after the duplicate has run once the duplicate was delivered.
            last = producer.send_task("worker_app.record_run", (str(runs),))
            last.get(timeout=60)
            # And a retried id, completed, is skipped too when it comes again.
            read_stream(
                amqp_url, names.completed_stream("celery"), predicate=lambda m, p, body: retrying.id in str(body)
            )
            producer.send_task("worker_app.retry_once", (str(retried),), task_id=retrying.id)
            producer.send_task("worker_app.record_run", (str(runs),)).get(timeout=60)
    finally:
        producer.close()
    lines = runs.read_text().splitlines()
    assert lines[:2] == [first.id, last.id] and len(lines) == 3 and first.id not in lines[2:]
    assert retried.read_text().splitlines() == [f"{retrying.id} 0", f"{retrying.id} 1"]
