"""PAUSE and RESUME through the control stream (issue 11 item 5; DESIGN §14), on a real broker."""

from __future__ import annotations

import json
import threading
import time

import pytest
from support import raw_channel, read_stream, wait_until

from ojs_kombu import Client, Worker, current_job
from ojs_kombu.observability.metrics import METRICS


class Runs:
    """Records the job ids a handler ran; ``block`` jobs wait for ``release``."""

    def __init__(self):
        self.ids: list[str] = []
        self.lock = threading.Lock()
        self.blocking = threading.Event()
        self.release = threading.Event()

    def work(self, *args):
        with self.lock:
            self.ids.append(current_job().id)

    def block(self):
        self.blocking.set()
        self.release.wait(30)

    def count(self) -> int:
        with self.lock:
            return len(self.ids)


def started(worker: Worker, runs: Runs) -> Worker:
    worker.handler("work", runs.work)
    worker.handler("block", runs.block)
    worker.start()
    assert worker.wait_until_ready()
    return worker


def queue_state(amqp_url: str, queue: str) -> tuple[int, int]:
    """(ready messages, consumers) of ``queue`` right now (passive declare, exact)."""
    with raw_channel(amqp_url) as channel:
        method = channel.queue_declare(queue, passive=True).method
        return method.message_count, method.consumer_count


def acked(queue: str) -> float:
    return METRICS.messages_acked.labels(queue)._value.get()


def assert_nothing_delivered(amqp_url: str, queue: str, runs: Runs, ready: int, window: float = 1.0) -> None:
    """Over ``window`` seconds, ``queue`` keeps exactly ``ready`` messages, no consumer, and no handler runs.

    (Proving an absence needs a window; every check in it is exact.)
    """
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        assert queue_state(amqp_url, queue) == (ready, 0)
        assert runs.count() == 0
        time.sleep(0.1)


def test_pause_and_resume_publish_to_the_control_stream(client, amqp_url, names):
    client.pause("default")
    client.resume("default")
    (m1, p1, b1), (m2, p2, b2) = read_stream(amqp_url, names.control_queue("default"), 2)
    assert (m1.exchange, m1.routing_key) == (names.direct_exchange, "control.default")
    assert m2.routing_key == "control.default"
    assert (p1.type, p2.type) == ("ojs.control.pause", "ojs.control.resume")
    assert p1.content_type == p2.content_type == "application/json"
    assert p1.message_id and p2.message_id and p1.message_id != p2.message_id
    assert abs(p1.timestamp - time.time()) < 60
    assert json.loads(b1) == json.loads(b2) == {"queue": "default"}


def test_paused_queues_of_a_deployment_that_declared_nothing_yet(client):
    """``paused_queues`` as a new deployment's first call declares the control stream with the exchange
    it is bound to (it once failed: 404 ``no exchange 'ojs.exchange.direct'``); a pause then reads back."""
    assert client.paused_queues(["default"]) == {"default": False}
    client.pause("default")
    assert client.paused_queues(["default"]) == {"default": True}


def test_pause_validates_the_queue_before_publishing(client):
    from ojs_kombu import ValidationError

    with pytest.raises(ValidationError):
        client.pause("")
    with pytest.raises(ValidationError):
        client.resume("control.default")


def test_pause_stops_deliveries_within_a_second_and_in_flight_jobs_finish(client, worker_factory, amqp_url, names):
    runs = Runs()
    worker = started(worker_factory(concurrency=4), runs)
    job_queue = names.job_queue("default")
    assert worker.paused_queues == frozenset()
    assert queue_state(amqp_url, job_queue) == (0, 1)

    client.enqueue("block", [])
    assert runs.blocking.wait(10), "the blocking job never started"
    acked_before = acked("default")

    client.pause("default")
    paused_at = time.monotonic()
    wait_until(lambda: queue_state(amqp_url, job_queue)[1] == 0, timeout=1.0, message="Basic.Cancel of the consumer")
    assert time.monotonic() - paused_at < 1.0
    assert worker.paused_queues == frozenset({"default"})

    # Published after the pause, with three of the worker's four slots free: none is delivered.
    jobs = [client.enqueue("work", []) for _ in range(3)]
    runs.release.set()
    wait_until(lambda: acked("default") == acked_before + 1, message="the in-flight job acked")
    assert_nothing_delivered(amqp_url, job_queue, runs, ready=3)

    client.resume("default")
    wait_until(lambda: runs.count() == 3, message="the jobs run after resume")
    assert sorted(runs.ids) == sorted(j.id for j in jobs)
    assert worker.paused_queues == frozenset()
    wait_until(lambda: queue_state(amqp_url, job_queue) == (0, 1), message="consuming again, queue drained")


def test_a_pause_survives_a_worker_restart(client, worker_factory, amqp_url, names):
    runs = Runs()
    first = started(worker_factory(concurrency=4), runs)
    client.pause("default")
    wait_until(lambda: first.paused_queues == {"default"}, message="first worker paused")
    first.stop(timeout=5)

    jobs = [client.enqueue("work", []) for _ in range(2)]
    job_queue = names.job_queue("default")
    second = started(worker_factory(concurrency=4), runs)
    assert second.paused_queues == frozenset({"default"})  # known once ready: replayed before consuming
    assert_nothing_delivered(amqp_url, job_queue, runs, ready=2)

    client.resume("default")
    wait_until(lambda: runs.count() == 2, message="the jobs run after resume")
    assert sorted(runs.ids) == sorted(j.id for j in jobs)


@pytest.mark.parametrize("last", ["pause", "resume"])
def test_the_last_pause_or_resume_of_the_stream_wins(client, worker_factory, amqp_url, names, last):
    for _ in range(2):
        client.pause("default")
        client.resume("default")
    if last == "pause":
        client.pause("default")
    job = client.enqueue("work", [])
    runs = Runs()
    worker = started(worker_factory(concurrency=4), runs)
    job_queue = names.job_queue("default")
    if last == "pause":
        assert worker.paused_queues == frozenset({"default"})
        assert_nothing_delivered(amqp_url, job_queue, runs, ready=1)
    else:
        assert worker.paused_queues == frozenset()
        wait_until(lambda: runs.count() == 1, message="the job runs")
        assert runs.ids == [job.id]
        assert queue_state(amqp_url, job_queue) == (0, 1)


def test_other_queues_keep_being_consumed(amqp_url, prefix, names):
    runs = Runs()
    worker = Worker(amqp_url, queues=("default", "other"), prefix=prefix, grace_period=5, concurrency=2)
    with Client(amqp_url, prefix=prefix) as client:
        try:
            started(worker, runs)
            client.pause("default")
            wait_until(lambda: worker.paused_queues == {"default"}, message="default paused")
            job = client.enqueue("work", [], queue="other")
            wait_until(lambda: runs.count() == 1, message="the other queue's job runs")
            assert runs.ids == [job.id]
            assert queue_state(amqp_url, names.job_queue("default"))[1] == 0
            assert queue_state(amqp_url, names.job_queue("other"))[1] == 1
        finally:
            worker.stop(timeout=5)


def test_a_pause_holds_across_a_reconnect(client, worker_factory, amqp_url, management, names, prefix):
    name = f"{prefix} pause reconnect"
    runs = Runs()
    worker = started(worker_factory(concurrency=4, connection_name=name), runs)
    client.pause("default")
    wait_until(lambda: worker.paused_queues == {"default"}, message="paused")
    ours = wait_until(
        lambda: [c for c in management.connections() if c.get("client_properties", {}).get("connection_name") == name],
        timeout=20,
        message="the worker's connection in the management API",
    )
    for connection in ours:
        management.close_connection(connection["name"])
    wait_until(lambda: worker.consumer.reconnections >= 1 and worker.consumer.connected.is_set(), timeout=20)

    job = client.enqueue("work", [])
    assert_nothing_delivered(amqp_url, names.job_queue("default"), runs, ready=1)
    client.resume("default")
    wait_until(lambda: runs.count() == 1, message="the job runs after resume")
    assert runs.ids == [job.id]
