"""OjsBroker when the broker misbehaves: deleted queues, closed connections (Dramatiq #832, #217),
an outage shorter or longer than ``publish_timeout``, a password refused for good."""

from __future__ import annotations

import os
import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import dramatiq
import pytest
from dramatiq.errors import BrokerError, ConnectionClosed
from support import message_count, wait_until

from ojs_dramatiq import OjsBroker
from ojs_kombu import AccessRefusedError, BrokerConnectionError

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


# -- reconnecting: send() and the inspection calls are budgeted by publish_timeout, as the Client --

SECRET = "not-the-password-4711"


def test_send_rides_out_an_outage_shorter_than_publish_timeout(node, prefix):
    broker = OjsBroker(node.url, prefix=prefix, publish_timeout=30)
    try:

        @dramatiq.actor(broker=broker, queue_name="outage")
        def outage(n):
            pass

        outage.send(1)  # a pooled connection, then the node's listeners go away under it
        node.ctl("stop_app")
        restart = threading.Timer(1.0, node.ctl, ("start_app",))
        started = time.monotonic()
        restart.start()
        try:
            outage.send(2)
            took = time.monotonic() - started
        finally:
            restart.join()
        assert 1.0 <= took < 30, took  # retried through the outage, within the budget
        assert broker.get_queue_message_counts("outage")[0] == 2  # the inspection connection is back too
    finally:
        broker.close()


def test_send_and_inspection_give_up_when_the_budget_is_spent(node, prefix):
    broker = OjsBroker(node.url, prefix=prefix, publish_timeout=1.5)
    try:

        @dramatiq.actor(broker=broker, queue_name="down")
        def down():
            pass

        down.send()
        broker.get_queue_message_counts("down")  # the inspection connection is open
        node.ctl("stop_app")
        try:
            started = time.monotonic()
            with pytest.raises(ConnectionClosed) as raised:
                down.send()
            sent = time.monotonic() - started
            started = time.monotonic()
            with pytest.raises(BrokerConnectionError):
                broker.get_queue_message_counts("down")
            counted = time.monotonic() - started
        finally:
            node.ctl("start_app")
        assert isinstance(raised.value.__cause__, BrokerConnectionError)
        assert 1.0 <= sent < 5.0, sent  # the budget (1.5 s, measured from the first failure), not forever
        assert 1.0 <= counted < 5.0, counted
    finally:
        broker.close()


def test_send_and_inspection_refused_for_good_fail_fast(amqp_url, prefix):
    parts = urlsplit(amqp_url)
    bad = urlunsplit(parts._replace(netloc=f"guest:{SECRET}@{parts.hostname}:{parts.port}"))
    broker = OjsBroker(bad, prefix=prefix, publish_timeout=30)
    try:

        @dramatiq.actor(broker=broker, queue_name="refused")
        def refused():
            pass

        started = time.monotonic()
        with pytest.raises(BrokerError) as raised:
            refused.send()
        assert time.monotonic() - started < 3.0  # not the 30 s budget: a 403 is never retried
        assert isinstance(raised.value.__cause__, AccessRefusedError)
        started = time.monotonic()
        with pytest.raises(AccessRefusedError) as refusal:
            broker.get_queue_message_counts("refused")
        assert time.monotonic() - started < 3.0
        assert refusal.value.reply_code == 403
        assert SECRET not in str(raised.value) and SECRET not in str(refusal.value)
    finally:
        broker.close()
