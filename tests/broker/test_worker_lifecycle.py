"""How a Worker ends: exit outcomes, handlers that raise SystemExit / KeyboardInterrupt,
and jobs that outlive the grace period (against the real broker)."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

import pytest
from support import get_messages, message_count, raw_channel, wait_until

from ojs_kombu import RetryPolicy, TopologyConflictError, Worker
from ojs_kombu.errors import WorkerError


def run_in_thread(worker: Worker) -> tuple[threading.Thread, list[BaseException | None]]:
    """``worker.run()`` in a thread of its own; the list receives what it raised (None: returned)."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=target, name="test-worker-run", daemon=True)
    thread.start()
    return thread, outcome


def test_run_raises_worker_error_when_the_consumer_dies(amqp_url, prefix, names):
    # A job queue that exists with other arguments, and a worker that refuses to use it: the
    # consumer thread dies on its first declaration.  run() must not return as after a shutdown.
    with raw_channel(amqp_url) as channel:
        channel.queue_declare(names.job_queue("default"), durable=True, arguments={"x-max-priority": 5})
    worker = Worker(amqp_url, prefix=prefix, on_conflict="raise", grace_period=1)

    with pytest.raises(WorkerError) as raised:
        worker.run()

    assert isinstance(raised.value.__cause__, TopologyConflictError)
    assert "TopologyConflictError" in str(raised.value)
    assert worker.error is raised.value
    assert not worker.wait_until_ready(timeout=5)  # False at once: the consumer has ended


def test_run_raises_worker_error_when_connect_retries_run_out():
    with socket.socket() as probe:  # a port nothing listens on: every connect is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worker = Worker(f"amqp://guest:guest@127.0.0.1:{port}//", connect_retries=0, grace_period=1)

    with pytest.raises(WorkerError) as raised:
        worker.run()

    assert isinstance(raised.value.__cause__, OSError)  # refused (BrokerConnectionError is one too)
    assert f"127.0.0.1:{port}" in str(raised.value)


def test_stop_is_not_an_error(amqp_url, prefix):
    worker = Worker(amqp_url, prefix=prefix, grace_period=1)
    thread, outcome = run_in_thread(worker)
    assert worker.wait_until_ready()
    worker.stop()
    thread.join(10)
    assert outcome == [None] and worker.error is None


@pytest.mark.parametrize(
    "exit_exception", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"]
)
def test_handler_raising_system_exit_fails_its_attempt_then_the_worker_stops(
    client, amqp_url, prefix, names, exit_exception
):
    worker = Worker(amqp_url, prefix=prefix, concurrency=2, grace_period=5)

    @worker.handler("exit.job")
    def leave() -> None:
        raise exit_exception

    thread, outcome = run_in_thread(worker)
    try:
        job = client.enqueue("exit.job", [], retry=RetryPolicy(max_attempts=1))
        thread.join(20)
        assert not thread.is_alive(), "the worker did not shut down after the handler's exit"
        assert outcome == [exit_exception]  # re-raised by run(), after the graceful shutdown
        # The attempt was failed (max_attempts=1: Nack into the DLQ), not left unacknowledged:
        # an unsettled delivery would be back in the job queue now that the connection is closed.
        [(_, properties, _)] = get_messages(amqp_url, names.dead_letter_queue("default"), 1)
        assert properties.message_id == job.id
        assert message_count(amqp_url, names.job_queue("default")) == 0
    finally:
        worker.stop(timeout=1)


def test_embedded_worker_stops_itself_after_a_handler_exit(client, amqp_url, prefix, names):
    worker = Worker(amqp_url, prefix=prefix, concurrency=1, grace_period=5)
    worker.handler("exit.job", lambda: sys.exit(0))
    worker.start()
    try:
        assert worker.wait_until_ready()
        client.enqueue("exit.job", [], retry=RetryPolicy(max_attempts=1))
        wait_until(lambda: not worker.consumer.connected.is_set(), timeout=20, message="the worker to stop")
        [_] = get_messages(amqp_url, names.dead_letter_queue("default"), 1)
    finally:
        worker.stop(timeout=1)


def test_a_job_outliving_the_grace_period_never_writes_to_a_reused_descriptor(client, amqp_url, prefix, tmp_path):
    release = threading.Event()
    started = threading.Event()
    worker = Worker(amqp_url, prefix=prefix, concurrency=1, grace_period=0.2, inline=False)  # a handler thread's job

    @worker.handler("slow.job")
    def slow() -> None:
        started.set()
        release.wait(30)

    worker.start()
    held: list[int] = []
    try:
        assert worker.wait_until_ready()
        client.enqueue("slow.job", [])
        assert started.wait(15)
        wake_fd = worker.consumer.wakeup.write_fd  # the write end of the consumer's wake-up pipe
        worker.stop()  # the job still runs after the 0.2 s grace period; the pipe is closed
        # Give the freed descriptor number to a file of our own, as any later open() in the
        # process would get it.
        while not held or held[-1] != wake_fd:
            assert len(held) < 1000, "the wake-up descriptor number was not reused"
            held.append(os.open(tmp_path / f"file{len(held)}", os.O_WRONLY | os.O_CREAT))
        release.set()  # the late handler returns and acks
        wait_until(lambda: not any(t.is_alive() for t in worker.dispatch.threads), message="the handler thread to end")
        assert os.fstat(wake_fd).st_size == 0  # no wake-up byte went into our file
    finally:
        release.set()
        for fd in held:
            os.close(fd)


def test_an_inline_job_outliving_the_grace_period_is_left_to_the_broker(client, amqp_url, prefix, names):
    """A job running on the consumer thread past the grace period: stop() returns all the same, the
    stand-in closes the connection (the broker requeues the job), the thread ends when the job returns."""
    release = threading.Event()
    started = threading.Event()
    ran_on: list[str] = []
    worker = Worker(amqp_url, prefix=prefix, concurrency=1, grace_period=0.2)

    @worker.handler("slow.job")
    def slow() -> None:
        ran_on.append(threading.current_thread().name)
        started.set()
        release.wait(30)

    worker.start()
    try:
        assert worker.wait_until_ready()
        client.enqueue("slow.job", [])
        assert started.wait(15)
        assert ran_on == ["ojs-consumer"]  # the first job runs inline
        wait_until(lambda: worker.dispatch.handover.serving, message="the stand-in to serve the connection")
        begun = time.monotonic()
        worker.stop()
        assert time.monotonic() - begun < 3.0  # not held up by the job
        wait_until(lambda: message_count(amqp_url, names.job_queue("default")) == 1, message="the job requeued")
        consumer_thread = worker._consumer_thread
        assert consumer_thread is not None and consumer_thread.is_alive()  # still in the job
        release.set()
        wait_until(lambda: not consumer_thread.is_alive(), message="the consumer thread to end")
        assert worker.error is None
    finally:
        release.set()


def test_wait_until_ready_waits_for_a_run_that_has_not_started_the_worker_yet(amqp_url, prefix):
    """run() in another thread may reach start() after wait_until_ready() began (a loaded machine)."""
    worker = Worker(amqp_url, prefix=prefix, grace_period=1)
    start = worker.start
    worker.start = lambda: (time.sleep(0.3), start())[1]  # type: ignore[method-assign]
    thread, outcome = run_in_thread(worker)
    assert worker.wait_until_ready()
    worker.stop()
    thread.join(10)
    assert outcome == [None]
