"""The Celery adapter with quorum queues, switched on the Celery way: ``task_queues`` with
``queue_arguments={"x-queue-type": "quorum"}`` (docs/cluster.md).

Celery ≥ 5.5 reads that argument too (``celery.utils.quorum_queues.detect_quorum_queues``)
and would switch on its own native delayed delivery (the ``DelayedDelivery`` consumer
bootstep declaring ``celery_delayed_*`` and binding every task queue to it).  Countdowns
must go through the OJS scheduling cascade instead.  The retry, countdown and dead-letter
tests of ``test_celery_tasks`` run again here on such an app (the module overrides
``celery_app``); on the 3-node cluster: ``tests/cluster/test_quorum.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import test_celery_tasks as tasks
from celery.utils.quorum_queues import detect_quorum_queues
from frameworks import ojs_celery_app, running_worker
from kombu import Queue

from ojs_celery import Celery
from ojs_kombu.wire.entities import QUORUM_ARGUMENTS

pytestmark = pytest.mark.broker

QUORUM_TASK_QUEUES = [Queue("celery", queue_arguments={"x-queue-type": "quorum"})]


@pytest.fixture
def celery_app(amqp_url: str, prefix: str) -> Iterator[Celery]:
    """The tasks tests' app, its task queue declared quorum in ``task_queues``."""
    with ojs_celery_app(amqp_url, prefix, task_queues=QUORUM_TASK_QUEUES) as app:
        yield app


test_self_retry_countdown_goes_through_the_retry_queue = tasks.test_self_retry_countdown_goes_through_the_retry_queue
test_exhausted_retries_go_to_the_dead_letter_queue = tasks.test_exhausted_retries_go_to_the_dead_letter_queue
test_reject = tasks.test_reject
test_countdown_is_never_early_and_nothing_waits_unacked = tasks.test_countdown_is_never_early_and_nothing_waits_unacked


def test_quorum_task_queue_without_celery_native_delayed_delivery(celery_app, worker_factory, management, names):
    """Celery sees the quorum queue, yet its native delayed delivery stays off; our entities are quorum."""
    assert detect_quorum_queues(celery_app, "amqp")[0]  # what would switch Celery's own on
    exchanges_before = {e["name"] for e in management.exchanges("celery_delayed")}

    @celery_app.task
    def later():
        return "ran"

    with worker_factory(celery_app) as worker:
        assert "DelayedDelivery" not in {type(step).__name__ for step in worker.consumer.steps}
        assert later.apply_async(countdown=1).get(timeout=20) == "ran"
    # Nothing of Celery's native delayed delivery was declared or bound to our queue ...
    assert {e["name"] for e in management.exchanges("celery_delayed")} == exchanges_before
    sources = {b["source"] for b in management.bindings(destination=names.job_queue("celery"))}
    assert not any(source.startswith("celery_delayed") for source in sources), sources
    assert names.schedule_delivery_exchange in sources  # ... the OJS cascade delivers into it
    for name in (names.job_queue("celery"), names.dead_letter_queue("celery"), names.schedule_queue(0)):
        queue = management.queue(name)
        assert queue["type"] == "quorum", name
        assert {k: queue["arguments"].get(k) for k in QUORUM_ARGUMENTS} == QUORUM_ARGUMENTS


def test_the_transport_option_makes_every_queue_quorum_without_celery_noticing(amqp_url, prefix, management, names):
    with ojs_celery_app(amqp_url, prefix) as app:
        app.conf.broker_transport_options = {**app.conf.broker_transport_options, "queue_type": "quorum"}
        assert not detect_quorum_queues(app, "amqp")[0]

        @app.task
        def later():
            return "ran"

        with running_worker(app):
            assert later.apply_async(countdown=1).get(timeout=20) == "ran"
    for name in (names.job_queue("celery"), names.dead_letter_queue("celery"), names.schedule_queue(0)):
        assert management.queue(name)["type"] == "quorum", name
