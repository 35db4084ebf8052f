"""Celery's own broker traffic on ``ojs://``: remote control (pidbox), task events and ``rpc://`` results.

None of it is a task message, so the transport must leave it as plain AMQP (issue 9, item 3): the
pidbox and event queues are auto-delete queues on fanout / topic exchanges, the ``rpc://`` replies
go to the client's own queue. Each test drives the real feature end to end against a real worker.
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.broker


def test_remote_control_reaches_the_worker(celery_app, worker_factory):
    """``control.ping`` and ``inspect().active_queues()`` go through the pidbox (fanout) and come back."""
    with worker_factory(celery_app) as worker:
        replies = celery_app.control.ping(destination=[worker.hostname], timeout=10)
        assert replies == [{worker.hostname: {"ok": "pong"}}]

        active = celery_app.control.inspect(destination=[worker.hostname], timeout=10).active_queues()
        assert active is not None and [q["name"] for q in active[worker.hostname]] == ["celery"]


def test_task_events_reach_an_event_receiver(celery_app, worker_factory):
    """With task events on, a ``Receiver`` bound to the ``celeryev`` topic exchange sees the task succeed."""
    celery_app.conf.worker_send_task_events = True

    @celery_app.task(name="control.add")
    def add(a, b):
        return a + b

    received: list[dict] = []
    with celery_app.connection_for_read() as connection:
        receiver = celery_app.events.Receiver(connection, handlers={"task-succeeded": received.append})
        with receiver.consumer_context(wakeup=False) as (consuming, _channel, _consumers):
            with worker_factory(celery_app):
                result = add.delay(2, 3)
                assert result.get(timeout=30) == 5  # the result itself came back through rpc://
                deadline = time.monotonic() + 20
                while not received and time.monotonic() < deadline:
                    try:
                        consuming.drain_events(timeout=1)
                    except TimeoutError:
                        pass
    assert [event["uuid"] for event in received] == [result.id]
    assert received[0]["result"] == "5"
