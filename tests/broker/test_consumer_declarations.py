"""What a consumer declares before it consumes (``Topology.ensure_consumable``): its job queues,
their DLQs and the bindings that deliver their scheduled jobs, not the scheduling cascade.

The Dramatiq consumer's twins are in tests/dramatiq (test_dramatiq_worker, test_dramatiq_resilience)."""

from __future__ import annotations

import threading
from datetime import timedelta

import kombu

from ojs_kombu.policy.schedule import Cascade
from tests.support import wait_until


def test_a_worker_consumes_without_declaring_the_cascade_and_still_gets_scheduled_jobs(
    worker_factory, client, management, names, prefix
):
    ran = threading.Event()
    worker = worker_factory(queues=("soon",))
    worker.handler("later", lambda: ran.set())
    worker.start()
    assert worker.wait_until_ready()

    cascade = Cascade(names)
    queues = {q["name"] for q in management.queues(prefix + ".")}
    assert names.job_queue("soon") in queues and names.dead_letter_queue("soon") in queues
    assert not {cascade.queue(level) for level in range(cascade.levels)} & queues
    assert management.exchange(cascade.exchange(0)) is None
    bindings = management.bindings(source=cascade.delivery_exchange, destination=names.job_queue("soon"))
    assert [b["routing_key"] for b in bindings] == ["soon"]

    # Whoever schedules declares the cascade first; the job reaches the running worker.
    client.enqueue("later", queue="soon", scheduled_at=timedelta(milliseconds=300))
    assert ran.wait(15), "the scheduled job was not delivered"
    assert management.queue(cascade.queue(0)) is not None


def test_a_worker_declares_the_delivery_binding_again_with_its_deleted_queue(worker_factory, management, names):
    worker = worker_factory(queues=("vanishing",))
    worker.handler("x", lambda: None)
    worker.start()
    assert worker.wait_until_ready()
    queue = names.job_queue("vanishing")
    management.wait_for_queue(queue, lambda q: q is not None and q.get("consumers") == 1)
    assert management.delete_queue(queue)  # the broker cancels the consumer (Basic.Cancel)
    management.wait_for_queue(queue, lambda q: q is not None and q.get("consumers") == 1, timeout=30)
    delivery = Cascade(names).delivery_exchange
    wait_until(lambda: management.bindings(source=delivery, destination=queue), message="the delivery binding")


def test_an_ojs_transport_consumer_declares_the_delivery_binding_with_its_queue(amqp_url, prefix, names, management):
    """Celery's consumer declares its queue through the transport: with the binding that delivers its
    scheduled jobs (a producer on another connection declared it only once), not the cascade."""
    url = "ojs" + amqp_url[amqp_url.index("://") :]
    with kombu.Connection(url, transport_options={"prefix": prefix}) as conn:
        with kombu.Consumer(conn.channel(), [kombu.Queue("celery-ish", durable=True)], callbacks=[]):
            cascade = Cascade(names)
            bindings = management.bindings(source=cascade.delivery_exchange, destination=names.job_queue("celery-ish"))
            assert [b["routing_key"] for b in bindings] == ["celery-ish"]
            assert management.queue(cascade.queue(0)) is None
