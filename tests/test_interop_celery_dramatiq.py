"""Celery and Dramatiq share jobs over the OJS wire: one task/actor name, one queue, both directions.

* a Celery ``send_task`` / ``delay`` (``ojs_celery`` app on an ``ojs://`` URL) runs on a
  Dramatiq actor consumed by a real ``dramatiq.Worker`` on an ``OjsBroker``;
* a Dramatiq ``actor.send`` runs as a Celery task in a real (in-thread) Celery worker.

Both sides name the job ``interop.add`` and the queue ``interop``.  Celery tasks are
declared ``shared=False``: a shared task would be added to every later app, and a
later test's worker could run an earlier test's function.  A tap queue
(bound to the direct exchange with the queue's routing key) keeps a copy of what
each producer put on the wire, so the two envelopes can be compared.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import CurrentMessage
from frameworks import dramatiq_worker, global_ojs_broker, ojs_celery_app, ojs_url, running_worker
from support import get_messages, message_count, raw_channel

from ojs_celery import Celery
from ojs_dramatiq import OjsBroker
from ojs_kombu import Names
from ojs_kombu.model.naming import job_type_for, ojs_queue_for
from ojs_kombu.wire.codec import CONTENT_TYPE
from ojs_kombu.wire.headers import Header
from tools.schema import validate_job

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

TASK_NAME = "interop.add"
QUEUE = "interop"
#: The envelope fields both producers must write identically for the same call.
SHARED_FIELDS = ("specversion", "type", "queue", "args")


@pytest.fixture
def celery_app(amqp_url: str, prefix: str) -> Iterator[Celery]:
    """An ``ojs_celery.Celery`` app on the ``ojs://`` URL of the session broker, under the test's prefix."""
    with ojs_celery_app(ojs_url(amqp_url), prefix, broker_backend=None) as app:
        yield app


@pytest.fixture
def ojs_broker(amqp_url: str, prefix: str) -> Iterator[OjsBroker]:
    """An ``OjsBroker`` under the test's prefix (the global Dramatiq broker for the test)."""
    with global_ojs_broker(amqp_url, prefix) as broker:
        yield broker


def tap(amqp_url: str, names: Names, queue: str) -> str:
    """Bind a copy queue ``{prefix}.tap.{queue}`` to the direct exchange with ``queue``'s routing key."""
    tap_queue = f"{names.prefix}.tap.{queue}"
    with raw_channel(amqp_url) as channel:
        channel.queue_declare(tap_queue, durable=False, auto_delete=False)
        channel.queue_bind(tap_queue, names.direct_exchange, routing_key=queue)
    return tap_queue


def tapped_envelope(amqp_url: str, tap_queue: str) -> tuple[Any, dict[str, Any]]:
    """The one message on the tap queue: ``(properties, envelope)``."""
    [(_, properties, body)] = get_messages(amqp_url, tap_queue, 1, timeout=10)
    assert message_count(amqp_url, tap_queue) == 0  # exactly one job was published
    return properties, json.loads(body)


def assert_settled(amqp_url: str, names: Names) -> None:
    """Nothing is left in the job queue or its dead letter queue (the job was acked, not failed)."""
    assert message_count(amqp_url, names.job_queue(QUEUE)) == 0
    assert message_count(amqp_url, names.dead_letter_queue(QUEUE)) == 0


def assert_ojs_job(properties: Any, envelope: dict[str, Any], *, args: list, kwargs: dict) -> None:
    """What every producer must put on the wire for ``interop.add(*args, **kwargs)`` on ``interop``."""
    validate_job(envelope)
    assert properties.content_type == CONTENT_TYPE and properties.delivery_mode == 2
    assert properties.message_id == envelope["id"] and envelope["id"][14] == "7"  # a UUIDv7
    assert properties.headers[Header.ATTEMPT] == 1
    assert envelope["type"] == job_type_for(TASK_NAME) == TASK_NAME
    assert envelope["queue"] == ojs_queue_for(QUEUE) == QUEUE
    assert envelope["args"] == args
    assert envelope["meta"]["kwargs"] == kwargs


def test_a_celery_task_message_runs_on_a_dramatiq_actor(celery_app, ojs_broker, amqp_url, names):
    ojs_broker.add_middleware(CurrentMessage())
    seen = []

    @dramatiq.actor(actor_name=TASK_NAME, queue_name=QUEUE, broker=ojs_broker, max_retries=0)
    def add(x, y, *, scale=1):
        message = CurrentMessage.get_current_message()
        seen.append(
            ((x + y) * scale, x, y, scale, message.message_id, message.queue_name, message.options.get("retries", 0))
        )

    @celery_app.task(name=TASK_NAME, shared=False)
    def celery_add(x, y, *, scale=1):
        raise AssertionError("runs on the Dramatiq worker, not in Celery")

    ojs_broker.declare_queue(QUEUE, ensure=True)
    tap_queue = tap(amqp_url, names, QUEUE)

    sent = celery_app.send_task(TASK_NAME, args=(2, 3), kwargs={"scale": 10}, queue=QUEUE)
    delayed = celery_add.apply_async((4, 5), {"scale": 2}, queue=QUEUE)  # delay() with a queue
    with dramatiq_worker(ojs_broker, worker_threads=2) as worker:
        ojs_broker.join(QUEUE, timeout=20_000)
        worker.join()
    # The worker has stopped and its connection is closed: an unacked job would be ready again.
    assert_settled(amqp_url, names)

    assert sorted(seen) == sorted(
        [
            (50, 2, 3, 10, sent.id, QUEUE, 0),
            (18, 4, 5, 2, delayed.id, QUEUE, 0),
        ]
    )  # each ran exactly once, under its Celery task id

    [(_, p1, b1), (_, p2, b2)] = get_messages(amqp_url, tap_queue, 2, timeout=10)
    envelopes = {e["id"]: (p, e) for p, e in ((p1, json.loads(b1)), (p2, json.loads(b2)))}
    assert_ojs_job(*envelopes[sent.id], args=[2, 3], kwargs={"scale": 10})
    assert_ojs_job(*envelopes[delayed.id], args=[4, 5], kwargs={"scale": 2})
    assert envelopes[sent.id][1]["meta"]["celery"]["task"] == TASK_NAME


def test_a_dramatiq_actor_message_runs_as_a_celery_task(celery_app, ojs_broker, amqp_url, names):
    seen = []
    done = threading.Event()

    @celery_app.task(name=TASK_NAME, bind=True, shared=False)
    def add(self, x, y, *, scale=1):
        seen.append(
            (
                (x + y) * scale,
                x,
                y,
                scale,
                self.request.id,
                self.request.retries,
                self.request.delivery_info.get("routing_key"),
            )
        )
        done.set()
        return (x + y) * scale

    @dramatiq.actor(actor_name=TASK_NAME, queue_name=QUEUE, broker=ojs_broker)
    def dramatiq_add(x, y, *, scale=1):
        raise AssertionError("runs on the Celery worker, not in Dramatiq")

    ojs_broker.declare_queue(QUEUE, ensure=True)
    tap_queue = tap(amqp_url, names, QUEUE)

    message = dramatiq_add.send(2, 3, scale=10)
    properties, envelope = tapped_envelope(amqp_url, tap_queue)
    assert_ojs_job(properties, envelope, args=[2, 3], kwargs={"scale": 10})
    assert envelope["meta"]["dramatiq"]["message_id"] == message.message_id

    with running_worker(celery_app, concurrency=1, queues=[QUEUE]):
        assert done.wait(20), "the Celery worker did not run the Dramatiq message"
    # The worker has stopped and its connection is closed: an unacked job would be ready again.
    assert_settled(amqp_url, names)
    assert seen == [(50, 2, 3, 10, envelope["id"], 0, QUEUE)]  # exactly once, under the OJS job id


def test_both_producers_put_the_same_envelope_on_the_wire(celery_app, ojs_broker, amqp_url, names):
    @celery_app.task(name=TASK_NAME, shared=False)
    def celery_add(x, y, *, scale=1):
        pass

    @dramatiq.actor(actor_name=TASK_NAME, queue_name=QUEUE, broker=ojs_broker)
    def dramatiq_add(x, y, *, scale=1):
        pass

    ojs_broker.declare_queue(QUEUE, ensure=True)
    tap_queue = tap(amqp_url, names, QUEUE)

    celery_add.apply_async((2, 3), {"scale": 10}, queue=QUEUE)
    celery_properties, from_celery = tapped_envelope(amqp_url, tap_queue)
    dramatiq_add.send(2, 3, scale=10)
    dramatiq_properties, from_dramatiq = tapped_envelope(amqp_url, tap_queue)

    for properties, envelope in ((celery_properties, from_celery), (dramatiq_properties, from_dramatiq)):
        assert_ojs_job(properties, envelope, args=[2, 3], kwargs={"scale": 10})
    assert {k: from_celery[k] for k in SHARED_FIELDS} == {k: from_dramatiq[k] for k in SHARED_FIELDS}
    assert from_celery["meta"]["kwargs"] == from_dramatiq["meta"]["kwargs"]
    # Only the framework's own section of meta differs.
    assert set(from_celery["meta"]) - {"celery"} == set(from_dramatiq["meta"]) - {"dramatiq"} == {"kwargs"}
    assert celery_properties.content_type == dramatiq_properties.content_type
    assert celery_properties.headers[Header.QUEUE] == dramatiq_properties.headers[Header.QUEUE] == QUEUE
