"""A failover list on one broker: a first node that refuses connections costs no back-off.

The list's first URL is a closed port, the second the session's broker.  Within a rotation the
next node is tried at once (DESIGN §9's back-off applies once every node has failed in a row),
and the switch is logged without the password.  Node loss under load: ``tests/cluster/test_failover.py``.
"""

from __future__ import annotations

import logging
import socket
import threading

import pytest
from kombu.connection import Connection

from ojs_kombu import Client, Worker


@pytest.fixture
def dead_url(amqp_url: str) -> str:
    """``amqp_url`` with its port replaced by a closed one (connections are refused at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    live = Connection(amqp_url)
    return f"amqp://{live.userid}:{live.password}@127.0.0.1:{port}//"


def _retries(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def test_a_client_moves_to_the_next_node_without_waiting(amqp_url, dead_url, prefix, caplog):
    with caplog.at_level(logging.WARNING), Client([dead_url, amqp_url], prefix=prefix) as client:
        assert client.enqueue("failover.job", [1]).id
    retries = _retries(caplog, "retrying on")
    assert len(retries) == 1 and retries[0].endswith(" in 0.0s"), retries
    live_port = str(Connection(amqp_url).port)
    assert f":{live_port}//" in retries[0].split("retrying on", 1)[1]
    password = Connection(amqp_url).password
    assert not [r for r in caplog.records if f":{password}@" in r.getMessage()]


def test_a_worker_moves_to_the_next_node_without_waiting_and_consumes_there(amqp_url, dead_url, prefix, caplog):
    ran = threading.Event()
    worker = Worker(f"{dead_url};{amqp_url}", prefix=prefix, queues=["default"], grace_period=1)
    worker.handler("failover.job", lambda: ran.set())
    with caplog.at_level(logging.WARNING):
        worker.start()
        try:
            assert worker.wait_until_ready(15)
            with Client(amqp_url, prefix=prefix) as client:
                client.enqueue("failover.job")
            assert ran.wait(15), "the job did not run on the second node"
        finally:
            worker.stop(timeout=5)
    reconnects = _retries(caplog, "consumer connection to")
    assert len(reconnects) == 1 and reconnects[0].endswith(" in 0.0s"), reconnects
    assert worker.consumer.reconnections == 1
