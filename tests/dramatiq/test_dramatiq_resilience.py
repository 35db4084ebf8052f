"""OjsBroker when the broker misbehaves: deleted queues, closed connections (Dramatiq #832, #217)."""

from __future__ import annotations

import os
import socket
import threading

import dramatiq
import pytest
from support import message_count, wait_until

pytestmark = pytest.mark.timeout(120)


def test_enqueue_declares_a_deleted_queue_again(ojs_broker, management, names, amqp_url):
    @dramatiq.actor(queue_name="flaky-queue")
    def work():
        pass

    work.send()
    assert message_count(amqp_url, names.job_queue("flaky-queue")) == 1
    assert management.delete_queue(names.job_queue("flaky-queue"))
    work.send()  # Basic.Return (mandatory): declared again and sent again, not lost
    assert message_count(amqp_url, names.job_queue("flaky-queue")) == 1


def test_a_consumer_declares_its_deleted_queue_again_and_keeps_consuming(ojs_broker, start_worker, management, names):
    done = threading.Event()

    @dramatiq.actor(queue_name="vanishing")
    def work():
        done.set()

    start_worker()
    queue = names.job_queue("vanishing")
    management.wait_for_queue(queue, lambda q: q is not None and q.get("consumers") == 1)
    assert management.delete_queue(queue)  # the broker cancels the consumer (Basic.Cancel)
    management.wait_for_queue(queue, lambda q: q is not None and q.get("consumers") == 1, timeout=30)
    # With the binding that delivers its scheduled jobs from the cascade (gone with the queue).
    assert management.bindings(source=ojs_broker.cascade.delivery_exchange, destination=queue)
    work.send()
    assert done.wait(20)


def test_sending_survives_a_closed_publisher_connection(ojs_broker, start_worker, management):
    seen = []

    @dramatiq.actor(queue_name="survivor")
    def work(n):
        seen.append(n)

    start_worker()
    work.send(1)
    wait_until(lambda: seen == [1], 20)
    ours = f"ojs_kombu client {socket.gethostname()} pid {os.getpid()}"  # the broker's publishing connections
    closed = wait_until(
        lambda: [
            c["name"]
            for c in management.connections()
            if (c.get("client_properties") or {}).get("connection_name") == ours
        ],
        20,
    )
    for name in closed:
        management.close_connection(name)
    work.send(2)
    wait_until(lambda: seen == [1, 2], 20)
