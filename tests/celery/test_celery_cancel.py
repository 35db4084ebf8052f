"""The control plane for Celery workers on ``ojs://`` (issue 11): cancels, revokes, pause and resume.

A Celery revoke (``AsyncResult.revoke()``) also publishes an OJS cancel to the control
stream, and the ``ojs://`` transport of every worker replays that stream before it
consumes: so a revoke reaches jobs still in the broker, and workers started after it.
An OJS cancel (``ojs_kombu.Client.cancel``) revokes the task in Celery workers, and
with ``ojs_cancel_terminate`` terminates it while it runs.

In-thread workers share ``celery.worker.state.revoked`` (a process global, lost when a
worker process restarts): tests that stand for a restart clear it in between.
"""

from __future__ import annotations

import time

import pytest
from celery import chord
from celery.exceptions import ChordError, TaskRevokedError
from celery.worker import state as worker_state
from prometheus_client import REGISTRY
from support import message_count, raw_channel, wait_until

from ojs_celery import Celery
from ojs_kombu.amqp.management import ManagementError
from ojs_kombu.model.ids import new_job_id

pytestmark = pytest.mark.broker


def _dropped_pending(queue: str = "celery") -> float:
    """Jobs the transport acked without handing them to Celery because they were cancelled."""
    return REGISTRY.get_sample_value("ojs_amqp_jobs_cancelled_total", {"queue": queue, "state": "pending"}) or 0.0


def _consumers(amqp_url: str, queue: str) -> int:
    with raw_channel(amqp_url) as channel:
        return int(channel.queue_declare(queue, passive=True).method.consumer_count)


@pytest.fixture
def recorder(celery_app):
    """A task that records the tags it ran with (in-thread workers: same process)."""
    ran: list[str] = []

    @celery_app.task(name="cancel.record")
    def record(tag):
        ran.append(tag)
        return tag

    record.ran = ran
    return record


def _assert_settled(amqp_url, names, queue="celery"):
    """Nothing left in the queue, nothing dead-lettered."""
    assert message_count(amqp_url, names.job_queue(queue)) == 0
    assert message_count(amqp_url, names.dead_letter_queue(queue)) == 0


def test_revoke_before_any_worker_runs_is_never_run(celery_app, recorder, worker_factory, amqp_url, names):
    """No worker yet: Celery's broadcast reaches nobody, the OJS cancel waits in the control stream."""
    doomed = recorder.delay("doomed")
    doomed.revoke()
    dropped = _dropped_pending()
    with worker_factory(celery_app):
        assert recorder.delay("after").get(timeout=30) == "after"  # queued behind the doomed one
    assert recorder.ran == ["after"]
    assert _dropped_pending() == dropped + 1  # acked by the transport, never handed to Celery
    _assert_settled(amqp_url, names)


def test_a_revoke_before_anything_of_the_deployment_exists(celery_app, recorder, worker_factory, amqp_url, names):
    """A client's first call under a new prefix is a revoke: the control stream is declared with the
    exchange its binding needs (it once failed with 404 ``no exchange 'ojs.exchange.direct'``), and
    the task published with that id afterwards is never run."""
    task_id = new_job_id()  # the ids ojs_celery gives tasks: the job's id too
    celery_app.control.revoke(task_id)
    dropped = _dropped_pending()
    recorder.apply_async(("doomed",), task_id=task_id)
    with worker_factory(celery_app):
        assert recorder.delay("after").get(timeout=30) == "after"
    assert recorder.ran == ["after"]
    assert _dropped_pending() == dropped + 1
    _assert_settled(amqp_url, names)


def test_revoke_of_a_countdown_task_holds_across_a_restart(celery_app, recorder, worker_factory, amqp_url, names):
    """A countdown task revoked while it waits in the scheduling cascade; the worker restarts meanwhile."""
    with worker_factory(celery_app):
        doomed = recorder.apply_async(("doomed",), countdown=5)
        doomed.revoke()
    worker_state.revoked.clear()  # what a worker process restart loses
    with worker_factory(celery_app):
        # Due two seconds after the doomed one: once it has run, the doomed one was delivered.
        assert recorder.apply_async(("marker",), countdown=7).get(timeout=60) == "marker"
    assert recorder.ran == ["marker"]
    _assert_settled(amqp_url, names)


def test_ojs_cancel_of_a_queued_celery_task(celery_app, recorder, worker_factory, client, amqp_url, names):
    """``Client.cancel`` from any OJS producer: the Celery task never runs."""
    doomed = recorder.delay("doomed")
    client.cancel(doomed.id, queue="celery")
    with worker_factory(celery_app):
        assert recorder.delay("after").get(timeout=30) == "after"
    assert recorder.ran == ["after"]
    _assert_settled(amqp_url, names)


def test_a_live_ojs_cancel_revokes_the_id_in_the_worker(celery_app, recorder, worker_factory, client):
    """Read live by a running worker, a cancel lands in ``worker_state.revoked``: the requests Celery
    already holds (prefetched, waiting for their ETA) are discarded by Celery's own revoke check."""
    job_id = new_job_id()  # any id: the worker need not know the task
    with worker_factory(celery_app):
        recorder.delay("warm").get(timeout=30)  # the worker reads the control stream live now
        worker_state.revoked.clear()  # only the live cancel below may put it there
        client.cancel(job_id, queue="celery")
        wait_until(lambda: job_id in worker_state.revoked, 10, message="the revoke")


def test_ojs_cancel_of_a_task_waiting_for_its_retry(celery_app, worker_factory, client, amqp_url, names):
    """A task that failed once waits in a retry queue; cancelled, it is dropped on delivery: never run again."""
    attempts: list[int] = []

    @celery_app.task(name="cancel.flaky", bind=True, max_retries=3)
    def flaky(self):
        attempts.append(self.request.retries)
        raise self.retry(exc=KeyError("again"), countdown=2)

    dropped = _dropped_pending()
    with worker_factory(celery_app):
        doomed = flaky.delay()
        wait_until(lambda: attempts == [0], 30, message="the first attempt")
        client.cancel(doomed.id, queue="celery")
        wait_until(lambda: _dropped_pending() == dropped + 1, 30, message="the retry to be dropped")
    assert attempts == [0]
    _assert_settled(amqp_url, names)


def test_the_worker_reads_a_deleted_control_stream_again(
    celery_app, recorder, worker_factory, client, management, names
):
    """The broker cancels the control consumer (stream deleted): the transport declares and reads it again."""
    stream = names.control_queue("celery")
    job_id = new_job_id()

    def consumers() -> int:
        try:
            return int((management.queue(stream) or {}).get("consumers") or 0)
        except ManagementError:  # HTTP 500 while the new stream's leader is starting
            return 0

    with worker_factory(celery_app):
        recorder.delay("warm").get(timeout=30)
        wait_until(lambda: consumers() >= 1, 30, message="the control consumer")
        assert management.delete_queue(stream)
        wait_until(lambda: consumers() >= 1, 30, message="the control stream read again")
        worker_state.revoked.clear()
        client.cancel(job_id, queue="celery")
        wait_until(lambda: job_id in worker_state.revoked, 10, message="the revoke")


def test_the_control_plane_after_a_reconnect(celery_app, recorder, worker_factory, client, management, amqp_url, names):
    """The broker drops the worker's connection: the new connection replays and reads the control stream."""
    stream = names.control_queue("celery")

    def control_connections() -> set[str]:
        try:
            details = (management.queue(stream) or {}).get("consumer_details") or []
        except ManagementError:  # HTTP 500 while the stream's leader moves
            return set()
        # channel_details is [] until the management stats have caught up with a new consumer
        return {c["channel_details"]["connection_name"] for c in details if c.get("channel_details")}

    with worker_factory(celery_app):
        recorder.delay("warm").get(timeout=30)
        [before] = wait_until(control_connections, 30, message="the control consumer")
        assert management.close_connection(before)
        wait_until(lambda: control_connections() - {before}, 60, message="the control stream read on a new connection")
        doomed_id = new_job_id()
        client.cancel(doomed_id, queue="celery")
        # A stream delivers a little later than a job queue: the task goes once the cancel is known.
        wait_until(lambda: doomed_id in worker_state.revoked, 10, message="the cancel read on the new connection")
        dropped = _dropped_pending()
        recorder.apply_async(("doomed",), task_id=doomed_id)
        assert recorder.delay("after").get(timeout=30) == "after"
        assert _dropped_pending() == dropped + 1  # dropped by the new connection's Settler
    assert recorder.ran == ["warm", "after"]
    _assert_settled(amqp_url, names)


# -- a running task --------------------------------------------------------------------------


@pytest.fixture
def producer(amqp_url, prefix):
    app = Celery(
        "worker_app",
        broker=amqp_url,
        broker_backend="ojs",
        backend="rpc://",
        broker_transport_options={"prefix": prefix},
    )
    yield app
    app.close()


def test_cancel_terminates_a_running_task(producer, celery_subprocess_worker, client, tmp_path, amqp_url, names):
    """``ojs_cancel_terminate``: the prefork pool process running it is killed; not retried, not dead-lettered."""
    started = tmp_path / "started"
    with celery_subprocess_worker(concurrency=1, extra_env={"OJS_CANCEL_TERMINATE": "1"}):
        running = producer.send_task("worker_app.wait_for_cancel", (str(started),))
        wait_until(started.exists, timeout=60, message="the task to start")
        cancelled_at = time.monotonic()
        client.cancel(running.id, queue="celery")
        with pytest.raises(TaskRevokedError):
            running.get(timeout=30)
        elapsed = time.monotonic() - cancelled_at
        # The worker keeps processing others (a new pool process).
        assert producer.send_task("worker_app.echo", (7,)).get(timeout=60) == 7
        _assert_settled(amqp_url, names)
    assert elapsed < 2.0, f"terminated after {elapsed:.2f}s"
    assert started.read_text().splitlines() == ["0"]  # one attempt: never retried


# -- pause and resume ----------------------------------------------------------------------------


def test_pause_and_resume_a_celery_worker(celery_app, recorder, worker_factory, client, amqp_url, names):
    """``Client.pause``: the worker cancels its consumer of the queue; ``resume`` consumes it again."""
    queue = names.job_queue("celery")
    with worker_factory(celery_app):
        assert recorder.delay("before").get(timeout=30) == "before"
        client.pause("celery")
        wait_until(lambda: _consumers(amqp_url, queue) == 0, 10, message="the consumer to be cancelled")
        waiting = recorder.delay("while paused")
        assert message_count(amqp_url, queue) == 1
        client.resume("celery")
        assert waiting.get(timeout=30) == "while paused"
    assert recorder.ran == ["before", "while paused"]


def test_a_worker_started_while_paused_does_not_consume(celery_app, recorder, worker_factory, client, amqp_url, names):
    queue = names.job_queue("celery")
    client.pause("celery")
    waiting = recorder.delay("waiting")
    with worker_factory(celery_app) as worker:
        replies = celery_app.control.ping(destination=[worker.hostname], timeout=10)
        assert replies  # the worker is up (its consumer started)
        assert _consumers(amqp_url, queue) == 0
        assert message_count(amqp_url, queue) == 1
        client.resume("celery")
        assert waiting.get(timeout=30) == "waiting"
    assert recorder.ran == ["waiting"]


def test_a_task_dropped_on_delivery_is_revoked_in_the_result_backend(
    celery_redis_app, worker_factory, client, amqp_url, names
):
    """Dropped by the transport, never seen by Celery: REVOKED in the result backend, as stock Celery records it."""
    ran: list[str] = []

    @celery_redis_app.task(name="cancel.dropped")
    def record(tag):
        ran.append(tag)
        return tag

    doomed = record.delay("doomed")
    client.cancel(doomed.id, queue="celery")
    dropped = _dropped_pending()
    assert doomed.state == "PENDING"
    with worker_factory(celery_redis_app):
        assert record.delay("after").get(timeout=30) == "after"  # queued behind the doomed one
        wait_until(lambda: _dropped_pending() == dropped + 1, 10, message="the drop")
    assert ran == ["after"]
    assert doomed.state == "REVOKED"
    with pytest.raises(TaskRevokedError):
        doomed.get(timeout=5)
    _assert_settled(amqp_url, names)


def test_a_chord_member_dropped_on_delivery_fails_its_chord(celery_redis_app, worker_factory, client):
    """As in stock Celery, a revoked header task fails the chord (its REVOKED counts as the member's part)."""
    app = celery_redis_app

    @app.task(name="cancel.add")
    def add(x, y):
        return x + y

    @app.task(name="cancel.total")
    def total(values):
        return sum(values)

    doomed_id = new_job_id()
    body = chord([add.s(1, 1), add.s(2, 2).set(task_id=doomed_id)])(total.s())
    client.cancel(doomed_id, queue="celery")
    with worker_factory(app):
        error = body.get(timeout=30, propagate=False)
    assert body.state == "FAILURE" and isinstance(error, ChordError), (body.state, error)
    assert app.AsyncResult(doomed_id).state == "REVOKED"
