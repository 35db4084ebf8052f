"""The Celery adapter with quorum queues, switched on the Celery way: ``task_queues`` with
``queue_arguments={"x-queue-type": "quorum"}`` (docs/cluster.md).

Celery ≥ 5.5 reads that argument too (``celery.utils.quorum_queues.detect_quorum_queues``)
and would switch on its own native delayed delivery (the ``DelayedDelivery`` consumer
bootstep declaring ``celery_delayed_*`` and binding every task queue to it, and the countdown
rerouting of ``send_task``).  Countdowns
must go through the OJS scheduling cascade instead.  The retry, countdown and dead-letter
tests of ``test_celery_tasks`` run again here on such an app (the module overrides
``celery_app``); on the 3-node cluster: ``tests/cluster/test_quorum.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import test_celery_tasks as tasks
from celery.utils.quorum_queues import detect_quorum_queues
from frameworks import ojs_celery_app, running_worker
from kombu import Exchange, Queue
from support import total_messages, wait_until

from ojs_celery import Celery
from ojs_kombu.policy.schedule import LEVELS
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


def test_countdown_on_quorum_task_queues_skips_celery_native_delayed_delivery(
    amqp_url, prefix, names, worker_factory, caplog
):
    """``send_task(countdown=...)`` with quorum ``task_queues`` never takes Celery's native delayed delivery.

    Celery 5.5+ ``send_task`` would log "Direct exchanges are not supported with native delayed
    delivery" for each countdown to a direct exchange, and reroute one to a topic exchange to
    ``celery_delayed_27`` (never delivered here).  The direct one must become an OJS scheduled
    job in the cascade, the topic one (a plain queue over ``ojs://``) a message with its ETA.
    """
    topic = Queue(
        "topical",
        Exchange(f"{prefix}-topic", type="topic"),
        routing_key="topical.#",
        queue_arguments={"x-queue-type": "quorum"},
    )
    with ojs_celery_app(amqp_url, prefix, task_queues=[*QUORUM_TASK_QUEUES, topic]) as app:
        ran: dict[str, float] = {}

        @app.task
        def later(tag):
            ran[tag] = time.time()
            return tag

        cascade = [names.schedule_queue(level) for level in range(LEVELS)]
        with worker_factory(app, queues=["celery", "topical"]), caplog.at_level(logging.WARNING, "celery.app.base"):
            start = time.time()
            direct = later.apply_async(("direct",), countdown=3)
            wait_until(lambda: total_messages(amqp_url, cascade) == 1, timeout=5, message="the job in the cascade")
            topical = later.apply_async(("topic",), countdown=3, queue=topic, routing_key="topical.x")
            assert direct.get(timeout=20) == "direct" and topical.get(timeout=20) == "topic"
    assert min(ran.values()) - start >= 3.0  # never early
    assert not [r for r in caplog.records if "native delayed delivery" in r.getMessage()]
