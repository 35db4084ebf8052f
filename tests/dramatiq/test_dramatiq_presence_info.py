"""Dramatiq workers on the control plane's read side (issue 11): their presence lists them in
``Client.workers()``, they answer INFO, and ``OjsBroker(events=True)`` publishes job events."""

from __future__ import annotations

import threading
from datetime import timedelta

import dramatiq
import pytest
from frameworks import global_ojs_broker
from support import wait_until

from ojs_dramatiq import job_id_for

pytestmark = pytest.mark.timeout(120)


def test_a_dramatiq_worker_is_listed_by_client_workers_and_leaves_on_shutdown(ojs_broker, start_worker, client):
    release, started = threading.Event(), threading.Event()

    @dramatiq.actor(queue_name="presence_q", max_retries=0)
    def hold():
        started.set()
        release.wait(30)

    message = hold.send()
    worker = start_worker(worker_threads=3)
    try:
        assert started.wait(20)
        job_id = job_id_for(message.message_id, message.message_timestamp)

        def listed():
            mine = [w for w in client.workers() if w.worker_id == ojs_broker.lifecycle.worker_id]
            return mine[0] if mine and mine[0].active else None

        presence = wait_until(listed, 15, message="the Dramatiq worker's presence with its running job")
        queue = ojs_broker.ojs_queue("presence_q")
        assert presence.queues == (queue,)
        assert presence.concurrency == 3
        assert [job.job_id for job in presence.active] == [job_id]

        info = client.info(job_id, queue=queue, timeout=5)
        assert info is not None and info.state == "active"
        assert info.worker_id == ojs_broker.lifecycle.worker_id
    finally:
        release.set()
    info = wait_until(
        lambda: (i := client.info(job_id, queue=queue, timeout=2)) is not None and i.state == "completed" and i,
        15,
        message="INFO answers completed once the actor returned",
    )
    assert info.attempt == 1
    worker.stop(timeout=10_000)
    assert all(w.worker_id != ojs_broker.lifecycle.worker_id for w in client.workers())


def test_events_true_publishes_the_job_events_of_dramatiq_actors(amqp_url, prefix, start_worker, client):
    with global_ojs_broker(amqp_url, prefix, events=True) as broker:
        done = threading.Event()

        @dramatiq.actor(queue_name="events_q", max_retries=0)
        def work():
            done.set()

        message = work.send()
        start_worker(broker)
        assert done.wait(20)
        job_id = job_id_for(message.message_id, message.message_timestamp)

        def seen():
            events = [e for e in client.events(timedelta(minutes=5), queue=broker.ojs_queue("events_q")) if e.job_id == job_id]
            return [e.event for e in events] if len(events) >= 2 else None

        assert wait_until(seen, 15, message="the started and succeeded events") == ["started", "succeeded"]
