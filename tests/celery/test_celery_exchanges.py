"""Celery's task exchange over ``ojs://``: not declared on the broker unless something uses it.

Celery declares each task queue's exchange (named after the queue, ``celery`` by default)
before the queue.  Over ``ojs://`` the job queue is routed through the prefix's
``ojs.exchange.direct``, so that exchange would be an unprefixed entity nobody routes
through, left on the broker.  A plain queue bound to such a direct exchange still gets it.
"""

from __future__ import annotations

import kombu
import pytest
from frameworks import ojs_celery_app, ojs_url
from support import wait_until

pytestmark = pytest.mark.broker


def test_the_task_exchange_of_a_job_queue_is_not_declared(amqp_url, prefix, management, names, worker_factory):
    queue = f"{prefix}-work"  # under the test's prefix but outside its cleanup (``{prefix}.``)
    with ojs_celery_app(amqp_url, prefix, task_default_queue=queue) as app:

        @app.task
        def add(x, y):
            return x + y

        with worker_factory(app, queues=[queue]):
            assert add.delay(2, 3).get(timeout=20) == 5
    assert management.queue(names.job_queue(queue)) is not None  # the job queue is there ...
    left = [e["name"] for e in management.exchanges(prefix) if not e["name"].startswith(f"{prefix}.")]
    for name in left:
        management.delete_exchange(name)
    assert left == []  # ... its unprefixed task exchange is not


def test_a_plain_queue_bound_to_a_direct_exchange_gets_it(amqp_url, prefix, management):
    """A non-durable queue is never a job queue: binding it declares the exchange first, and messages route."""
    exchange = kombu.Exchange(f"{prefix}.plain-x", type="direct", durable=True)
    queue = kombu.Queue(f"{prefix}.plain", exchange, routing_key="k", durable=False, auto_delete=True)
    with kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
        bound = queue(conn.channel())
        bound.declare()
        assert exchange.name in {e["name"] for e in management.exchanges(prefix)}
        kombu.Producer(conn.channel(), exchange=exchange).publish({"n": 1}, routing_key="k")
        received: list = []

        def take() -> bool:
            message = bound.get(no_ack=True)
            if message is not None:
                received.append(message.payload)
            return bool(received)

        wait_until(take, timeout=10, message="the message on the plain queue")
    assert received == [{"n": 1}]
