"""INFO (binding §5.8, AMQP-021; DESIGN §14): Client.info asks the workers of a queue about a job."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import timedelta

import pika
import pytest
from support import get_messages, raw_channel, wait_until

from ojs_kombu import Client, JobInfo, RetryPolicy, ValidationError, current_job
from ojs_kombu.model.job import Job

TIMEOUT = 2.0


def state_of(worker, job_id: str) -> str | None:
    info = worker.activity.lookup(job_id)
    return info.state if info is not None else None


def capture_queue(amqp_url: str, prefix: str, names, queue: str = "default") -> str:
    """A durable queue (deleted with the prefix) bound like the control stream: it sees every control message."""
    name = f"{prefix}.capture"
    with raw_channel(amqp_url) as channel:
        channel.queue_declare(name, durable=True)
        channel.queue_bind(name, names.direct_exchange, names.control_routing_key(queue))
    return name


def publish_info_request(amqp_url: str, names, job_id: str, reply_to: str, correlation_id: str, **properties) -> None:
    """An INFO request as another producer would publish it (pika)."""
    properties.setdefault("timestamp", int(time.time()))
    with raw_channel(amqp_url) as channel:
        channel.basic_publish(
            names.direct_exchange,
            names.control_routing_key("default"),
            json.dumps({"job_id": job_id}).encode(),
            pika.BasicProperties(
                type="ojs.control.info",
                content_type="application/json",
                reply_to=reply_to,
                correlation_id=correlation_id,
                message_id=str(uuid.uuid4()),
                **properties,
            ),
        )


def reply_queue(amqp_url: str, prefix: str, name: str = "replies") -> str:
    queue = f"{prefix}.{name}"
    with raw_channel(amqp_url) as channel:
        channel.queue_declare(queue, durable=True)
    return queue


def started_worker(worker_factory, **handlers):
    worker = worker_factory()
    for job_type, handler in handlers.items():
        worker.handler(job_type, handler)
    worker.start()
    assert worker.wait_until_ready()
    return worker


# -- AMQP-021: the wire --------------------------------------------------------------------------


def test_amqp_021_info_request_wire(client, worker_factory, amqp_url, prefix, names):
    worker = started_worker(worker_factory, work=lambda: None)
    job = client.enqueue("work", [])
    wait_until(lambda: state_of(worker, job.id) == "completed", message="the job to complete")
    capture = capture_queue(amqp_url, prefix, names)

    # The client's request, for a job nobody knows (so the call waits its whole timeout).
    unknown = str(uuid.uuid4())
    result: list[JobInfo | None] = []
    asking = threading.Thread(target=lambda: result.append(client.info(unknown, queue="default", timeout=3.0)))
    asking.start()
    [(method, properties, body)] = get_messages(amqp_url, capture, 1)
    assert method.exchange == names.direct_exchange
    assert method.routing_key == "control.default"
    assert properties.type == "ojs.control.info"
    assert properties.content_type == "application/json"
    assert json.loads(body) == {"job_id": unknown}
    assert properties.correlation_id and properties.message_id
    assert abs(properties.timestamp - time.time()) < 60
    reply_to = properties.reply_to
    assert reply_to.startswith("amq.gen-")  # server-named
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as locked, raw_channel(amqp_url) as channel:
        channel.queue_declare(reply_to, passive=True)
    assert locked.value.reply_code == 405  # exclusive to the client's connection
    asking.join()
    assert result == [None]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone, raw_channel(amqp_url) as channel:
        channel.queue_declare(reply_to, passive=True)
    assert gone.value.reply_code == 404  # auto-deleted with its consumer, the client's connection still open

    # The worker's reply: to the default exchange, key = reply_to, correlation_id echoed.
    replies = reply_queue(amqp_url, prefix)
    publish_info_request(amqp_url, names, job.id.upper(), replies, "corr-021")
    [(method, properties, body)] = get_messages(amqp_url, replies, 1)
    assert method.exchange == ""
    assert method.routing_key == replies
    assert properties.type == "ojs.control.info.reply"
    assert properties.correlation_id == "corr-021"
    assert properties.content_type == "application/json"
    info = JobInfo.from_json(body)
    assert (info.job_id, info.state, info.worker_id, info.attempt) == (job.id, "completed", worker.worker_id, 1)


def test_info_validates_before_publishing(client):
    for job_id, queue, timeout in (("", "default", 1.0), ("x", "control.default", 1.0), ("x", "default", 0)):
        with pytest.raises(ValidationError):
            client.info(job_id, queue=queue, timeout=timeout)


# -- answers -------------------------------------------------------------------------------------


def test_a_running_job_is_active_with_the_worker_id_within_the_timeout(client, worker_factory):
    started, release = threading.Event(), threading.Event()

    def block():
        started.set()
        release.wait(30)

    worker = started_worker(worker_factory, block=block)
    job = client.enqueue("block", [])
    assert started.wait(10)
    try:
        began = time.monotonic()
        info = client.info(job.id, queue="default", timeout=5.0)
        elapsed = time.monotonic() - began
    finally:
        release.set()
    assert info is not None
    assert (info.state, info.worker_id, info.attempt, info.job_id) == ("active", worker.worker_id, 1, job.id)
    assert info.started_at is not None and info.finished_at is None
    assert elapsed < 2.0  # an active answer returns at once, not after the 5 s timeout


def test_a_finished_job_answers_its_outcome(client, worker_factory):
    def flaky():
        raise RuntimeError("fails once, then waits in its retry queue")

    def doomed():
        raise ValueError("fails for good")

    def cooperative():
        current_job().cancelled.wait(30)

    worker = started_worker(worker_factory, ok=lambda: None, flaky=flaky, doomed=doomed, cancel=cooperative)
    done = client.enqueue("ok", [])
    retrying = client.enqueue("flaky", [], retry=RetryPolicy(max_attempts=3, initial_interval="PT60S", jitter=False))
    dead = client.enqueue("doomed", [], retry=RetryPolicy(max_attempts=1))
    cancelled = client.enqueue("cancel", [])
    wait_until(lambda: state_of(worker, cancelled.id) == "active", message="the cancellable job to start")
    client.cancel(cancelled.id, queue="default")
    expected = {done.id: "completed", retrying.id: "retryable", dead.id: "discarded", cancelled.id: "cancelled"}
    for job_id, state in expected.items():
        wait_until(lambda j=job_id, s=state: state_of(worker, j) == s, message=f"{job_id} {state}")

    for job_id, state in expected.items():
        info = client.info(job_id, queue="default", timeout=TIMEOUT)
        assert info is not None, job_id
        assert (info.state, info.worker_id, info.attempt) == (state, worker.worker_id, 1)
        assert info.started_at is not None and info.finished_at is not None
        assert info.finished_at >= info.started_at
    began = time.monotonic()
    assert client.info(done.id, queue="default", timeout=10.0).state == "completed"
    assert time.monotonic() - began < 2.0  # a settle window after the first answer, not the whole timeout
    assert client.info(retrying.id, queue="default", timeout=TIMEOUT).error["type"] == "RuntimeError"
    assert client.info(dead.id, queue="default", timeout=TIMEOUT).error["message"] == "fails for good"


def test_an_unknown_job_is_none_after_the_timeout(client, worker_factory):
    started_worker(worker_factory, work=lambda: None)
    began = time.monotonic()
    assert client.info(str(uuid.uuid4()), queue="default", timeout=1.0) is None
    assert 1.0 <= time.monotonic() - began < 3.0


def test_two_workers_the_one_running_the_job_answers(client, worker_factory, amqp_url, prefix):
    started, release = threading.Event(), threading.Event()

    def block():
        started.set()
        release.wait(30)

    workers = [started_worker(worker_factory, block=block) for _ in range(2)]
    job = client.enqueue("block", [])
    assert started.wait(10)
    try:
        info = client.info(job.id, queue="default", timeout=5.0)
    finally:
        release.set()
    runner = next(w for w in workers if state_of(w, job.id) is not None)
    assert info is not None and (info.state, info.worker_id) == ("active", runner.worker_id)


# -- requests that are not answered --------------------------------------------------------------


def known_job() -> Job:
    return Job.create("work", [], queue="default")


def test_a_request_published_before_the_worker_started_is_not_answered(client, worker_factory, amqp_url, prefix, names):
    """Replayed at start-up (with a fresh timestamp): ignored, even for a job the worker knows."""
    client.declare_queue("default")
    job = known_job()
    replies = reply_queue(amqp_url, prefix)
    publish_info_request(amqp_url, names, job.id, replies, "replayed")
    worker = worker_factory()
    worker.handler("work", lambda: None)
    worker.lifecycle.emit("succeeded", job, 1)  # the worker knows the job before it reads the stream
    worker.start()
    assert worker.wait_until_ready()
    publish_info_request(amqp_url, names, job.id, replies, "live")
    [(_, properties, _)] = get_messages(amqp_url, replies, 1)
    # The stream is ordered: the live request's answer came after the replayed one was read.
    assert properties.correlation_id == "live"
    assert get_messages(amqp_url, replies, 1, timeout=0.2) == []


def test_a_stale_request_is_not_answered(client, worker_factory, amqp_url, prefix, names):
    worker = started_worker(worker_factory, work=lambda: None)
    job = client.enqueue("work", [])
    wait_until(lambda: state_of(worker, job.id) == "completed", message="the job to complete")
    replies = reply_queue(amqp_url, prefix)
    publish_info_request(amqp_url, names, job.id, replies, "stale", timestamp=int(time.time()) - 60)
    publish_info_request(amqp_url, names, job.id, replies, "fresh")
    [(_, properties, _)] = get_messages(amqp_url, replies, 1)
    assert properties.correlation_id == "fresh"
    assert get_messages(amqp_url, replies, 1, timeout=0.2) == []


def test_a_malformed_request_is_ignored_and_the_worker_goes_on(client, worker_factory, amqp_url, prefix, names, caplog):
    worker = started_worker(worker_factory, work=lambda: None)
    job = client.enqueue("work", [])
    wait_until(lambda: state_of(worker, job.id) == "completed", message="the job to complete")
    with raw_channel(amqp_url) as channel:
        channel.basic_publish(  # no reply_to
            names.direct_exchange,
            names.control_routing_key("default"),
            json.dumps({"job_id": job.id}).encode(),
            pika.BasicProperties(type="ojs.control.info", content_type="application/json"),
        )
    info = client.info(job.id, queue="default", timeout=TIMEOUT)
    assert info is not None and info.state == "completed"
    assert worker.error is None
    assert any("without reply_to" in r.getMessage() for r in caplog.records)


def test_concurrent_info_calls_each_get_their_own_answer(amqp_url, prefix, worker_factory):
    """Several threads asking at once each get their own answer (one reply queue per call)."""
    worker = started_worker(worker_factory, work=lambda: None)
    with Client(amqp_url, prefix=prefix) as client:
        jobs = [client.enqueue("work", []) for _ in range(4)]
        wait_until(lambda: all(state_of(worker, j.id) == "completed" for j in jobs), message="the jobs")
        answers: dict[str, JobInfo | None] = {}

        def ask(job: Job) -> None:
            answers[job.id] = client.info(job.id, queue="default", timeout=TIMEOUT)

        threads = [threading.Thread(target=ask, args=(j,)) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert {job_id: a.job_id if a else None for job_id, a in answers.items()} == {j.id: j.id for j in jobs}


# -- lifecycle emission (the source of INFO and of the events stream) ------------------------------


def test_the_worker_and_its_settler_emit_the_lifecycle_of_every_job(client, worker_factory):
    events: list[tuple[str, str, int, str]] = []
    lock = threading.Lock()

    def fails():
        raise RuntimeError("on purpose")

    client.declare_queue("default")
    cancelled = client.enqueue("ok", [])
    client.cancel(cancelled.id, queue="default")  # before the worker starts: dropped on delivery
    expired = client.enqueue("ok", [], expires_at=timedelta(seconds=-1))
    worker = worker_factory()
    worker.handler("ok", lambda: None)
    worker.handler("fails", fails)

    def record(event) -> None:
        with lock:
            events.append((event.job_id, event.event, event.attempt, event.worker_id))

    worker.lifecycle.subscribe(record)
    worker.start()
    assert worker.wait_until_ready()
    done = client.enqueue("ok", [])
    retried = client.enqueue("fails", [], retry=RetryPolicy(max_attempts=2, initial_interval="PT60S", jitter=False))
    dead = client.enqueue("fails", [], retry=RetryPolicy(max_attempts=1))
    expected = {
        cancelled.id: ["cancelled"],
        expired.id: ["expired"],
        done.id: ["started", "succeeded"],
        retried.id: ["started", "failed", "retried"],
        dead.id: ["started", "failed", "dead-lettered"],
    }

    def seen() -> dict[str, list[str]]:
        with lock:
            return {job_id: [e for j, e, _, _ in events if j == job_id] for job_id in expected}

    wait_until(lambda: seen() == expected, message=f"the lifecycle events {expected}")
    assert {(attempt, worker_id) for _, _, attempt, worker_id in events} == {(1, worker.worker_id)}
