"""Hard time limits and lost pool processes: counted attempts, never a requeue loop.

These need a process pool, so the worker is ``celery worker --pool=prefork`` in
a subprocess running ``tests/celery/worker_app.py``.
"""

from __future__ import annotations

import json

import pytest
from celery.exceptions import TimeLimitExceeded
from support import get_messages

from ojs_celery import Celery

pytestmark = pytest.mark.broker


@pytest.fixture
def producer(amqp_url, prefix):
    app = Celery(
        "worker_app",
        broker=amqp_url,
        broker_backend="ojs",
        backend="rpc://",
        broker_transport_options={"prefix": prefix},
    )
    yield app
    app.close()


def test_time_limit_is_a_counted_attempt(producer, celery_subprocess_worker, amqp_url, names):
    with celery_subprocess_worker(concurrency=1):
        # Over the 1 s hard limit on the first attempt, then retried (retries=1) and quick.
        assert producer.send_task("worker_app.sleepy", (3,)).get(timeout=60) == 1
        # Always over the limit: two attempts (max_retries=1), then the dead letter queue.
        doomed = producer.send_task("worker_app.always_slow")
        with pytest.raises(TimeLimitExceeded):
            doomed.get(timeout=60)
        [(_, properties, body)] = get_messages(amqp_url, names.dead_letter_queue("celery"), 1, timeout=20)
    assert json.loads(body)["id"] == doomed.id
    assert properties.headers["x-ojs-attempt"] == 2
    assert properties.headers["x-death"][0]["reason"] == "rejected"


def test_a_lost_pool_process_is_a_counted_attempt(producer, celery_subprocess_worker):
    with celery_subprocess_worker(concurrency=1):
        assert producer.send_task("worker_app.dies_once").get(timeout=60) == 1


def test_a_forking_pool_is_handed_the_payload(producer, celery_subprocess_worker, tmp_path):
    """A prefork pool gets each task's decoded ``[args, kwargs, embed]`` with no content type, as an
    in-process pool does (tests/celery/test_celery_tasks.py), and the task runs with its arguments."""
    received = tmp_path / "received.jsonl"
    with celery_subprocess_worker(concurrency=1, extra_env={"OJS_RECEIVED_LOG": str(received)}):
        assert producer.send_task("worker_app.echo", ({"é": [1, 2]},)).get(timeout=60) == {"é": [1, 2]}
    [line] = received.read_text().splitlines()
    assert json.loads(line) == {"content_type": None, "payload": [[{"é": [1, 2]}], {}]}
