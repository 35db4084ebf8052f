"""CANCEL through the control stream (binding §5.6, AMQP-019; DESIGN §14), on a real broker."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pika
import pytest
from support import message_count, raw_channel, read_stream, wait_until

from ojs_kombu import Cancelled, Client, ControlOptions, RetryPolicy, Worker, current_job
from ojs_kombu.amqp.management import ManagementError
from ojs_kombu.model.timefmt import utcnow
from ojs_kombu.observability.metrics import METRICS


class Runs:
    """Records which job ids a handler ran, thread-safely."""

    def __init__(self):
        self.ids: list[str] = []
        self.lock = threading.Lock()

    def handler(self, *args):
        with self.lock:
            self.ids.append(current_job().id)

    def ran(self, job_id: str) -> bool:
        with self.lock:
            return job_id in self.ids


def cancelled_count(queue: str, state: str) -> float:
    return METRICS.jobs_cancelled.labels(queue, state)._value.get()


def blocked_worker(worker_factory, release: threading.Event, runs: Runs, **options) -> Worker:
    """A started worker of concurrency 1 whose ``block`` jobs wait for ``release``."""
    worker = worker_factory(concurrency=1, **options)
    worker.handler("block", lambda: release.wait(30))
    worker.handler("work", runs.handler)
    worker.start()
    assert worker.wait_until_ready()
    return worker


# -- AMQP-019: the wire --------------------------------------------------------------------------


def test_amqp_019_cancel_publishes_to_the_control_stream(client, amqp_url, management, names):
    client.declare_queue("default")
    stream = names.control_queue("default")
    queue = management.queue(stream)
    assert queue["type"] == "stream"
    assert queue["durable"] is True
    assert queue["arguments"] == {
        "x-queue-type": "stream",
        "x-max-age": "400D",
        "x-max-length-bytes": 50_000_000,
        "x-stream-max-segment-size-bytes": 1_000_000,
    }
    bindings = management.bindings(source=names.direct_exchange, destination=stream)
    assert [b["routing_key"] for b in bindings] == ["control.default"]

    job_id = "0190a7e2-0000-7000-8000-000000000019"
    client.cancel(job_id, queue="default")
    client.cancel(job_id, queue="default")  # a second cancel is its own message

    (m1, p1, b1), (_, p2, _) = read_stream(amqp_url, stream, 2)
    assert m1.exchange == names.direct_exchange
    assert m1.routing_key == "control.default"
    assert p1.type == "ojs.control.cancel"
    assert p1.content_type == "application/json"
    assert p1.message_id and p1.message_id != p2.message_id
    assert abs(p1.timestamp - time.time()) < 60
    assert p1.delivery_mode == 2
    assert json.loads(b1) == {"job_id": job_id}


def test_cancel_validates_before_publishing(client):
    from ojs_kombu import ValidationError

    with pytest.raises(ValidationError):
        client.cancel("", queue="default")
    with pytest.raises(ValidationError):
        client.cancel("x", queue="control.default")


# -- jobs that are not running -------------------------------------------------------------------


def test_a_queued_job_cancelled_with_two_workers_consuming_never_runs(client, worker_factory, amqp_url, names):
    release, runs = threading.Event(), Runs()
    workers = [blocked_worker(worker_factory, release, runs) for _ in range(2)]
    for _ in workers:
        client.enqueue("block", [])
    # Both workers hold a blocker (prefetch 1), so the next job waits in the queue.
    wait_until(lambda: message_count(amqp_url, names.job_queue("default")) == 0, message="blockers taken")
    target = client.enqueue("work", [])
    before = cancelled_count("default", "pending")
    client.cancel(target.id, queue="default")
    wait_until(lambda: all(w.cancellations.is_cancelled(target.id) for w in workers), message="cancel seen")
    sentinel = client.enqueue("work", [])
    release.set()

    wait_until(lambda: runs.ran(sentinel.id), message="the sentinel job")
    wait_until(lambda: cancelled_count("default", "pending") == before + 1, message="the cancelled job dropped")
    assert not runs.ran(target.id)
    assert message_count(amqp_url, names.job_queue("default")) == 0
    assert message_count(amqp_url, names.dead_letter_queue("default")) == 0


def test_a_job_cancelled_before_any_worker_starts_never_runs(client, worker_factory, amqp_url, names):
    """Start-up replays the control stream before consuming the job queue (the marker).

    20,000 earlier cancels make the replay take long enough that a worker which
    consumed its job queue before catching up would run the job.
    """
    target = client.enqueue("work", [])
    with raw_channel(amqp_url) as channel:
        for n in range(20_000):
            channel.basic_publish(
                names.direct_exchange,
                "control.default",
                json.dumps({"job_id": f"0190a7e2-0000-7000-8000-{n:012d}"}).encode(),
                pika.BasicProperties(type="ojs.control.cancel", content_type="application/json"),
            )
    client.cancel(target.id, queue="default")
    sentinel = client.enqueue("work", [])
    runs = Runs()
    worker = worker_factory()
    worker.handler("work", runs.handler)
    worker.start()
    wait_until(lambda: runs.ran(sentinel.id), message="the sentinel job")
    assert not runs.ran(target.id)
    assert message_count(amqp_url, names.dead_letter_queue("default")) == 0


def test_a_scheduled_job_cancelled_never_runs_on_a_worker_started_after(client, worker_factory, amqp_url, names):
    at = utcnow() + timedelta(seconds=3)
    target = client.enqueue("work", [], scheduled_at=at)
    sentinel = client.enqueue("work", [], scheduled_at=at + timedelta(milliseconds=500))
    client.cancel(target.id, queue="default")
    runs = Runs()
    worker = worker_factory()
    worker.handler("work", runs.handler)
    worker.start()
    assert worker.wait_until_ready()
    wait_until(lambda: runs.ran(sentinel.id), timeout=20, message="the sentinel job")
    assert not runs.ran(target.id)
    assert message_count(amqp_url, names.job_queue("default")) == 0
    assert message_count(amqp_url, names.dead_letter_queue("default")) == 0


def test_a_job_waiting_in_a_retry_queue_and_cancelled_does_not_run_again(client, worker_factory, amqp_url, names):
    attempts: list[int] = []
    worker = worker_factory()

    def fails():
        attempts.append(current_job().attempt)
        raise RuntimeError("fail on purpose")

    worker.handler("work", fails)
    worker.start()
    assert worker.wait_until_ready()
    before = cancelled_count("default", "pending")
    job = client.enqueue("work", [], retry=RetryPolicy(max_attempts=3, initial_interval="PT2S", jitter=False))
    wait_until(lambda: attempts == [1], message="the first attempt")
    client.cancel(job.id, queue="default")
    wait_until(lambda: cancelled_count("default", "pending") == before + 1, timeout=15, message="the retry dropped")
    assert attempts == [1]
    assert message_count(amqp_url, names.job_queue("default")) == 0
    assert message_count(amqp_url, names.dead_letter_queue("default")) == 0


# -- running jobs --------------------------------------------------------------------------------


def test_a_cooperative_handler_sees_cancelled_within_a_second(client, worker_factory, amqp_url, names):
    started, seen = threading.Event(), []
    worker = worker_factory(cancel_running="cooperative")

    def cooperative():
        job = current_job()
        started.set()
        while not job.cancelled.wait(0.01):
            pass
        seen.append(time.monotonic())

    worker.handler("work", cooperative)
    worker.start()
    before = cancelled_count("default", "running")
    job = client.enqueue("work", [])
    assert started.wait(10)
    cancelled_at = time.monotonic()
    client.cancel(job.id, queue="default")
    wait_until(lambda: seen, timeout=5, message="the handler to see cancelled")
    assert seen[0] - cancelled_at < 1.0
    wait_until(lambda: cancelled_count("default", "running") == before + 1, message="counted as cancelled")
    assert message_count(amqp_url, names.job_queue("default")) == 0
    assert message_count(amqp_url, names.dead_letter_queue("default")) == 0


def test_a_busy_handler_is_interrupted_within_a_second_and_the_worker_goes_on(client, worker_factory, amqp_url, names):
    started, interrupted, runs = threading.Event(), [], Runs()
    worker = worker_factory(concurrency=1)

    def busy():
        started.set()
        n = 0
        try:
            while True:
                n += 1
        except Cancelled:
            interrupted.append(time.monotonic())
            raise

    worker.handler("busy", busy)
    worker.handler("work", runs.handler)
    worker.start()
    job = client.enqueue("busy", [], retry=RetryPolicy(max_attempts=3, initial_interval="PT0.1S"))
    assert started.wait(10)
    cancelled_at = time.monotonic()
    client.cancel(job.id, queue="default")
    wait_until(lambda: interrupted, timeout=5, message="the handler to be interrupted")
    assert interrupted[0] - cancelled_at < 1.0
    started.clear()
    after = client.enqueue("work", [])
    wait_until(lambda: runs.ran(after.id), message="the next job on the same handler thread")
    # Never retried: a second attempt (retry delay 0.1 s on the ladder) would set `started` again.
    assert not started.wait(1.5)
    assert message_count(amqp_url, names.dead_letter_queue("default")) == 0


# -- degraded: the control queue exists as a classic queue ---------------------------------------


def test_a_classic_control_queue_falls_back_to_live_exclusive_queues(
    client, worker_factory, amqp_url, management, names
):
    classic = names.control_queue("default")
    with raw_channel(amqp_url) as channel:
        channel.queue_declare(classic, durable=True)
    release, runs = threading.Event(), Runs()
    worker = blocked_worker(worker_factory, release, runs)
    assert not worker.topology.control_is_stream("default")
    assert [c.entity for c in worker.topology.conflicts] == [classic]
    assert management.queue(classic)["type"] == "classic"
    # Never bound to someone else's queue; the worker's exclusive queue gets control.default.
    assert management.bindings(source=names.direct_exchange, destination=classic) == []
    assert [b["routing_key"] for b in management.bindings(source=names.direct_exchange)].count("control.default") == 1

    client.enqueue("block", [])
    wait_until(lambda: message_count(amqp_url, names.job_queue("default")) == 0, message="blocker taken")
    target = client.enqueue("work", [])
    client.cancel(target.id, queue="default")  # does not raise: the client degrades too
    wait_until(lambda: worker.cancellations.is_cancelled(target.id), message="cancel seen live")
    sentinel = client.enqueue("work", [])
    release.set()
    wait_until(lambda: runs.ran(sentinel.id), message="the sentinel job")
    assert not runs.ran(target.id)
    assert message_count(amqp_url, classic) == 0


# -- the stream's retention and reconnects -------------------------------------------------------


def test_the_control_stream_retention_really_trims(amqp_url, prefix, management, names):
    options = ControlOptions(max_length_bytes=20_000, max_segment_size_bytes=2_000)
    with Client(amqp_url, prefix=prefix, control=options) as client:
        client.declare_queue("default")
        stream = names.control_queue("default")
        assert management.queue(stream)["arguments"]["x-max-length-bytes"] == 20_000
        for n in range(500):
            client.cancel(f"0190a7e2-0000-7000-8000-{n:012d}", queue="default")
        last = "0190a7e2-0000-7000-8000-0000000fffff"
        client.cancel(last, queue="default")
        # Retention drops whole segments: far fewer than the 501 records stay.
        kept = read_stream(amqp_url, stream, 0, until=json.dumps({"job_id": last}, separators=(",", ":")).encode())
        assert kept[-1][2] == json.dumps({"job_id": last}, separators=(",", ":")).encode()
        assert len(kept) < 250


def test_the_control_stream_is_read_again_after_a_reconnect(client, worker_factory, management, prefix):
    name = f"{prefix} control reconnect"
    worker = worker_factory(connection_name=name)
    worker.handler("work", lambda: None)
    worker.start()
    assert worker.wait_until_ready()
    ours = wait_until(
        lambda: [c for c in management.connections() if c.get("client_properties", {}).get("connection_name") == name],
        timeout=20,
        message="the worker's connection in the management API",
    )
    for connection in ours:
        management.close_connection(connection["name"])
    wait_until(lambda: worker.consumer.reconnections >= 1 and worker.consumer.connected.is_set(), timeout=20)
    job_id = "0190a7e2-0000-7000-8000-00000000c0de"
    client.cancel(job_id, queue="default")
    wait_until(lambda: worker.cancellations.is_cancelled(job_id), message="the cancel read live after the reconnect")


def test_a_deleted_control_stream_is_declared_and_read_again(client, worker_factory, management, names):
    worker = worker_factory()
    worker.handler("work", lambda: None)
    worker.start()
    assert worker.wait_until_ready()
    stream = names.control_queue("default")
    assert management.delete_queue(stream)

    def stream_back() -> bool:
        try:
            return (management.queue(stream) or {}).get("type") == "stream" and bool(
                management.bindings(source=names.direct_exchange, destination=stream)
            )
        except ManagementError:  # HTTP 500 while the new stream's leader is starting (seen on 3.10)
            return False

    wait_until(stream_back, message="the stream declared again")
    job_id = "0190a7e2-0000-7000-8000-0000000de1e7"
    client.cancel(job_id, queue="default")
    wait_until(lambda: worker.cancellations.is_cancelled(job_id), message="the cancel read from the new stream")
