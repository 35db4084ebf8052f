"""Resilience of ``ojs_kombu``: a broker restart, a worker killed mid-job, graceful
shutdown, and malformed input -- each against a real broker.

The worker-process tests run ``tests/helpers/worker_process.py`` with
``sys.executable``; the broker-restart test starts a private RabbitMQ node of its
own, so the session's broker is never restarted.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pika
import pytest
from support import get_messages, message_count, raw_channel, wait_until

from ojs_kombu import Client, Job, Names, OjsError, RetryPolicy, Worker, current_job
from ojs_kombu.testing.broker import PrivateNode
from ojs_kombu.wire.codec import CONTENT_TYPE, encode
from ojs_kombu.wire.headers import Header

WORKER_SCRIPT = Path(__file__).resolve().parent.parent / "helpers" / "worker_process.py"


# -- worker processes --------------------------------------------------------------------------

Spawn = Callable[..., subprocess.Popen]


@pytest.fixture
def spawn_worker(amqp_url: str, prefix: str, tmp_path: Path) -> Iterator[Spawn]:
    """Start ``worker_process.py`` under the test's prefix; kills what is still running afterwards."""
    processes: list[subprocess.Popen] = []
    stderr_path = tmp_path / "worker.stderr"

    def spawn(*args: str) -> subprocess.Popen:
        with open(stderr_path, "ab") as stderr:
            process = subprocess.Popen(
                [sys.executable, str(WORKER_SCRIPT), "--prefix", prefix, "--log", str(tmp_path / "events.log"), *args],
                env={**os.environ, "OJS_AMQP_URL": amqp_url},
                stdout=stderr,
                stderr=stderr,
            )
        processes.append(process)
        return process

    yield spawn
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def events(tmp_path: Path) -> list[tuple[str, str, int]]:
    """The ``(event, job id, attempt)`` lines the worker processes' handlers wrote."""
    path = tmp_path / "events.log"
    if not path.exists():
        return []
    return [(e, i, int(a)) for e, i, a in (line.split() for line in path.read_text().splitlines())]


def worker_stderr(tmp_path: Path) -> str:
    """The tail of the worker processes' logs, for assertion messages."""
    path = tmp_path / "worker.stderr"
    return "\n".join(path.read_text(errors="replace").splitlines()[-30:]) if path.exists() else ""


def wait_for_disconnect(management, connection_name: str) -> None:
    """Wait until the broker has closed ``connection_name``, so its unacked messages are settled."""
    wait_until(
        lambda: (
            not [
                c
                for c in management.connections()
                if c.get("client_properties", {}).get("connection_name") == connection_name
            ]
        ),
        timeout=15,
        interval=0.2,
        message=f"the broker to drop {connection_name!r}",
    )


# -- a. broker restart ---------------------------------------------------------------------------


@pytest.mark.broker
def test_broker_restart_every_confirmed_job_runs_and_the_worker_resumes():
    """Stop and start the broker while a stream of jobs is published and consumed, and
    scheduled jobs wait in the cascade (their delay's bits travel as routing keys, which
    must survive the restart)."""
    total = 300
    with PrivateNode() as node:
        ran: set[str] = set()
        ran_lock = threading.Lock()
        confirmed: set[str] = set()
        enqueue_errors: list[OjsError] = []
        early: list[str] = []

        worker = Worker(node.url, prefix="restart", concurrency=4, grace_period=5)

        @worker.handler("stream.job")
        def record(_: int) -> None:
            with ran_lock:
                ran.add(current_job().id)

        @worker.handler("stream.scheduled")
        def record_scheduled(_: int) -> None:
            job = current_job()
            if time.time() < job.scheduled_datetime.timestamp():
                early.append(job.id)
            with ran_lock:
                ran.add(job.id)

        worker.start()
        assert worker.wait_until_ready(30)
        # No publish_timeout budget: the back-off 1, 2, 4, 8, 16 … s (10 attempts) rides out a restart of ~20 s.
        with Client(node.url, prefix="restart", connect_retries=10, publish_timeout=None, confirm_timeout=15) as client:
            client.declare_queue("default")
            # Due from before the restart (waiting in the cascade while the node is down) until well after it.
            scheduled = [Job.create("stream.scheduled", [i], scheduled_at=timedelta(seconds=2 + i)) for i in range(40)]
            assert all(r.ok for r in client.enqueue_many(scheduled))

            def publish() -> None:
                for i in range(total):
                    job = Job.create("stream.job", [i])
                    while True:
                        try:
                            client.enqueue_job(job)
                        except OjsError as exc:  # not confirmed: publish it again
                            enqueue_errors.append(exc)
                            time.sleep(0.2)
                            continue
                        confirmed.add(job.id)
                        break
                    time.sleep(0.02)

            publisher = threading.Thread(target=publish, name="test-publisher", daemon=True)
            publisher.start()
            wait_until(lambda: len(confirmed) >= total // 3, timeout=30, message="a third of the stream")
            node.restart()
            publisher.join(timeout=120)
            assert not publisher.is_alive(), "the publisher did not finish after the restart"
            assert len(confirmed) == total
            confirmed |= {job.id for job in scheduled}

            scheduled_ids = {job.id for job in scheduled}
            wait_until(
                lambda: confirmed <= ran,
                timeout=120,
                interval=0.2,
                message=f"every confirmed job to run ({len(confirmed - ran - scheduled_ids)} of the stream "
                f"and {len(scheduled_ids - ran)} scheduled missing)",
            )
            assert early == []
            assert worker.consumer.reconnections >= 1
            assert worker.wait_until_ready(1)  # it is connected again, by itself
            # Jobs the restart interrupted were retried (worker_lost), none was dead-lettered.
            assert message_count(node.url, client.names.dead_letter_queue("default")) == 0
        worker.stop(timeout=5)


# -- b. a worker killed mid-job ----------------------------------------------------------------------


def test_job_that_kills_its_worker_is_dead_lettered_after_max_attempts(client, names, spawn_worker, tmp_path):
    job = client.enqueue("crash.job", [], retry=RetryPolicy(max_attempts=3, initial_interval="PT0.1S", jitter=False))
    dead_letter_queue = names.dead_letter_queue("default")
    exit_codes = []
    for _ in range(6):  # 3 runs, then a 4th worker sees the 3rd redelivery and dead-letters the job
        process = spawn_worker("--concurrency", "1")
        wait_until(
            lambda process=process: process.poll() is not None or message_count(client.url, dead_letter_queue) > 0,
            timeout=30,
            interval=0.1,
            message="the worker to die or the job to be dead-lettered",
        )
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=15) == 0, worker_stderr(tmp_path)
            break
        exit_codes.append(process.returncode)

    assert exit_codes == [1, 1, 1], worker_stderr(tmp_path)
    assert events(tmp_path) == [("run", job.id, 1), ("run", job.id, 2), ("run", job.id, 3)]
    [entry] = client.dead_letters("default")
    assert entry.job.id == job.id
    assert entry.reason == "rejected"  # Basic.Nack(requeue=False) from the job queue
    assert entry.headers["x-death"][0]["queue"] == names.job_queue("default")
    assert entry.headers[Header.ATTEMPT] == 3


# -- c. graceful shutdown ------------------------------------------------------------------------------


def test_sigterm_lets_the_running_job_finish_then_exits_zero(client, names, management, spawn_worker, tmp_path):
    client.declare_queue("default")
    name = f"graceful-{uuid.uuid4().hex[:8]}"
    process = spawn_worker("--concurrency", "1", "--sleep", "1.5", "--grace", "10", "--name", name)
    job = client.enqueue("slow.job", [])
    wait_until(lambda: events(tmp_path), timeout=20, message="the job to start")
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0, worker_stderr(tmp_path)
    assert time.monotonic() - signalled < 10  # within the grace period
    assert events(tmp_path) == [("start", job.id, 1), ("end", job.id, 1)]
    wait_for_disconnect(management, name)
    assert message_count(client.url, names.job_queue("default")) == 0  # acked, not requeued
    assert message_count(client.url, names.dead_letter_queue("default")) == 0


def test_sigterm_hands_prefetched_unstarted_jobs_back_unchanged(client, names, management, spawn_worker, tmp_path):
    """Prefetch is per consumer (``global=False``), so a worker of two queues with
    concurrency 2 holds four jobs: two run, two wait.  On SIGTERM the two running
    jobs finish; the two waiting ones go back to their queues without spending an
    attempt (republished unchanged, not rejected: ``redelivered`` stays False)."""
    queues = ("default", "other")
    for queue in queues:
        client.declare_queue(queue)
    jobs = [Job.create("slow.job", [i], queue=queue) for queue in queues for i in range(2)]
    assert all(result.ok for result in client.enqueue_many(jobs))
    published = {job.id: encode(job).body for job in jobs}
    name = f"handback-{uuid.uuid4().hex[:8]}"
    process = spawn_worker("--queues", ",".join(queues), "--concurrency", "2", "--sleep", "2.5", "--name", name)
    wait_until(
        lambda: all(message_count(client.url, names.job_queue(q)) == 0 for q in queues),
        timeout=20,
        message="all four jobs delivered",
    )
    wait_until(lambda: len(events(tmp_path)) == 2, timeout=20, message="two jobs started")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0, worker_stderr(tmp_path)
    wait_for_disconnect(management, name)

    started = {job_id for event, job_id, _ in events(tmp_path) if event == "start"}
    ended = {job_id for event, job_id, _ in events(tmp_path) if event == "end"}
    assert len(started) == 2 and ended == started
    assert sum(message_count(client.url, names.job_queue(q)) for q in queues) == 2
    handed_back = {}
    for queue in queues:
        for method, properties, body in get_messages(client.url, names.job_queue(queue), 2, timeout=1):
            handed_back[properties.message_id] = (queue, method, properties, body)
    assert set(handed_back) == set(published) - started
    for job_id, (queue, method, properties, body) in handed_back.items():
        assert method.redelivered is False
        assert properties.headers[Header.ATTEMPT] == 1
        assert body == published[job_id]  # unchanged
        assert Job.from_json(body).queue == queue
        assert not any(key.startswith("x-death") for key in properties.headers)
    assert all(message_count(client.url, names.dead_letter_queue(q)) == 0 for q in queues)


def test_graceful_stop_of_a_busy_worker_spends_no_attempt_and_loses_nothing(amqp_url, client, names):
    """stop() while jobs stream in: deliveries that arrive until the broker confirms the
    cancel are handed back too, so nothing comes back ``redelivered`` (a spent attempt)."""
    total = 2000
    client.declare_queue("default")
    assert all(r.ok for r in client.enqueue_many([Job.create("quick.job", [i]) for i in range(total)]))
    ran: list[int] = []
    worker = Worker(amqp_url, prefix=client.names.prefix, concurrency=4, grace_period=5)
    worker.handler("quick.job", lambda i: ran.append(i))
    worker.start()
    wait_until(lambda: len(ran) >= total // 5, timeout=30, message="a fifth of the jobs")
    worker.stop()
    left = get_messages(amqp_url, names.job_queue("default"), total - len(ran), timeout=5)
    assert len(ran) == len(set(ran)) and len(ran) + len(left) == total
    assert [method.redelivered for method, _, _ in left] == [False] * len(left)
    assert {properties.headers[Header.ATTEMPT] for _, properties, _ in left} == {1}
    assert message_count(amqp_url, names.job_queue("default")) == 0


def test_broker_cancel_then_connection_loss_leaves_one_consumer(amqp_url, client, names, management):
    """A re-consume scheduled by a Basic.Cancel must not add a second consumer once a
    reconnect has already consumed every queue again."""
    connection_name = f"cancel-{uuid.uuid4().hex[:8]}"
    worker = Worker(amqp_url, prefix=client.names.prefix, grace_period=5, connection_name=connection_name)
    worker.handler("a.b", lambda: None)
    # Due well after the reconnect below (its back-off starts at ~1 s): the re-consume this cancel
    # schedules is certainly still pending when the new channel consumes every queue.
    worker.consumer.cancel_retry_delay = 60.0
    with worker:
        management.delete_queue(names.job_queue("default"))  # the broker sends Basic.Cancel
        wait_until(lambda: worker.consumer.cancellations >= 1, message="Basic.Cancel seen")
        [connection] = wait_until(
            lambda: [
                c
                for c in management.connections()
                if c.get("client_properties", {}).get("connection_name") == connection_name
            ],
            message="the connection",
        )
        management.close_connection(connection["name"])
        wait_until(lambda: worker.consumer.reconnections >= 1, message="a reconnection")
        assert worker.wait_until_ready(15)
        # Exact state instead of waiting for it to fall due: the reconnect dropped the pending
        # re-consume, so nothing can add a second consumer later.
        assert not worker.consumer.subscriptions.retrying
        with raw_channel(amqp_url) as channel:
            assert channel.queue_declare(names.job_queue("default"), passive=True).method.consumer_count == 1


# -- d. bad input --------------------------------------------------------------------------------------


def _envelope(**changes: Any) -> dict[str, Any]:
    envelope = Job.create("good.job", ["bad"]).to_dict()
    envelope.update(changes)
    return {k: v for k, v in envelope.items() if v is not None}


def _publish_raw(
    channel, names: Names, body: bytes, *, headers: dict[str, Any] | None = None, **properties: Any
) -> None:
    properties.setdefault("content_type", CONTENT_TYPE)
    properties.setdefault("delivery_mode", 2)
    channel.basic_publish(
        names.direct_exchange, "default", body, pika.BasicProperties(headers=headers, **properties), mandatory=True
    )


#: (name, body, extra AMQP properties, headers, x-ojs-error-code of the dead letter)
BAD_MESSAGES: list[tuple[str, bytes, dict[str, Any], dict[str, Any] | None, str]] = [
    ("not-json", b"{this is not json", {}, None, "decode_error"),
    ("invalid-utf8", b'{"type": "good.job", "args": ["\xff\xfe"]}', {}, None, "decode_error"),
    ("args-not-an-array", json.dumps(_envelope(args={"to": "x"})).encode(), {}, None, "invalid_envelope"),
    ("missing-type", json.dumps(_envelope(type=None)).encode(), {}, None, "invalid_envelope"),
    ("bad-id", json.dumps(_envelope(id="12345")).encode(), {}, None, "invalid_envelope"),
    (
        "pickle",
        pickle.dumps({"task": "good.job", "args": [1]}),
        {"content_type": "application/x-python-serialize"},
        None,
        "unsupported_content_type",
    ),
    (
        "gzip-encoding",
        json.dumps(_envelope()).encode(),
        {"content_encoding": "gzip"},
        None,
        "unsupported_content_encoding",
    ),
    ("oversized", json.dumps(_envelope(args=["x" * (1024 * 1024 + 1)])).encode(), {}, None, "envelope_too_large"),
    ("unknown-type", json.dumps(_envelope(type="nobody.handles_this")).encode(), {}, None, "unknown_type"),
    ("attempt-header-is-a-string", json.dumps(_envelope()).encode(), {}, {Header.ATTEMPT: "2"}, "invalid_header"),
    ("json-array", b"[1, 2, 3]", {}, None, "invalid_envelope"),
    ("empty-body", b"", {}, None, "decode_error"),
    ("nan-in-args", json.dumps(_envelope(args=[float("nan")])).encode(), {}, None, "decode_error"),
    ("nested-too-deeply", b'{"args": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, None, "decode_error"),
]


def test_bad_input_is_dead_lettered_with_its_reason_and_good_jobs_all_run(amqp_url, client, names):
    client.declare_queue("default")
    ran: list[int] = []
    worker = Worker(amqp_url, prefix=client.names.prefix, concurrency=4, grace_period=5)
    worker.handler("good.job", lambda i: ran.append(i))
    good = [Job.create("good.job", [i]) for i in range(len(BAD_MESSAGES) + 1)]
    expired = Job.create("good.job", ["expired"], expires_at=timedelta(seconds=-60))
    with worker:
        with raw_channel(amqp_url) as channel:
            channel.confirm_delivery()
            for (name, body, properties, headers, _), job in zip(BAD_MESSAGES, good[:-1], strict=True):
                _publish_raw(channel, names, body, headers=headers, message_id=f"bad-{name}", **properties)
                message = encode(job)
                _publish_raw(channel, names, message.body, headers=message.headers, **message.properties)
            message = encode(expired)
            _publish_raw(channel, names, message.body, headers=message.headers, **message.properties)
            message = encode(good[-1])
            _publish_raw(channel, names, message.body, headers=message.headers, **message.properties)

        dead_letter_queue = names.dead_letter_queue("default")
        wait_until(lambda: len(ran) == len(good), timeout=30, message="every good job to run")
        wait_until(
            lambda: message_count(amqp_url, dead_letter_queue) >= len(BAD_MESSAGES),
            timeout=30,
            message="every bad message in the DLQ",
        )
        # The worker is still consuming, on the same connection: no bad message broke its channel.
        client.enqueue("good.job", [1000])
        wait_until(lambda: 1000 in ran, message="a job enqueued after the bad input")
        assert worker.consumer.reconnections == 0
    assert sorted(ran) == [*range(len(good)), 1000]  # every good job ran once; the expired one never
    assert message_count(amqp_url, names.job_queue("default")) == 0
    assert message_count(amqp_url, dead_letter_queue) == len(BAD_MESSAGES)  # the expired job was dropped
    dead = get_messages(amqp_url, dead_letter_queue, len(BAD_MESSAGES))
    codes = {properties.message_id: properties.headers[Header.ERROR_CODE] for _, properties, _ in dead}
    assert codes == {f"bad-{name}": code for name, _, _, _, code in BAD_MESSAGES}
