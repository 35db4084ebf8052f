"""Lifecycle events (``ojs_kombu.runtime.lifecycle``) from a Celery worker: ``ojs_celery.lifecycle``.

The in-thread worker runs in this process, so its :func:`worker_lifecycle` is this process's.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import pytest
from support import wait_until

from ojs_celery.lifecycle import worker_lifecycle
from ojs_kombu.model.ids import new_job_id

pytestmark = pytest.mark.broker


@pytest.fixture
def events():
    """The events emitted from now on, per job id: ``{job_id: [(event, attempt, error type), ...]}``."""
    seen: dict[str, list[tuple[str, int, str | None]]] = {}
    lock = threading.Lock()

    def record(event):
        with lock:
            seen.setdefault(event.job_id, []).append((event.event, event.attempt, (event.error or {}).get("type")))

    worker_lifecycle().subscribe(record)
    return seen


def test_lifecycle_events_of_celery_tasks(celery_app, worker_factory, client, events):
    @celery_app.task(name="lifecycle.ok")
    def ok():
        return 1

    @celery_app.task(name="lifecycle.boom")
    def boom():
        raise ValueError("boom")

    @celery_app.task(name="lifecycle.flaky", bind=True, max_retries=2, default_retry_delay=0.1)
    def flaky(self):
        if self.request.retries == 0:
            raise self.retry(exc=KeyError("once"))
        return 2

    cancelled = ok.delay()
    cancelled.revoke()  # before the worker starts: dropped by the transport, never started
    with worker_factory(celery_app):
        done = ok.delay()
        assert done.get(timeout=30) == 1
        failed = boom.delay()
        with pytest.raises(ValueError):
            failed.get(timeout=30)
        retried = flaky.delay()
        assert retried.get(timeout=30) == 2
    assert events[done.id] == [("started", 1, None), ("succeeded", 1, None)]
    assert events[failed.id] == [("started", 1, None), ("failed", 1, "ValueError"), ("dead-lettered", 1, None)]
    assert events[retried.id] == [
        ("started", 1, None),
        ("failed", 1, "KeyError"),
        ("retried", 1, None),
        ("started", 2, None),
        ("succeeded", 2, None),
    ]
    assert events[cancelled.id] == [("cancelled", 1, None)]  # by the transport, on delivery


def test_info_of_celery_tasks(celery_app, worker_factory, client):
    """INFO (``Client.info``) is answered by the Celery worker from its recent activity."""

    @celery_app.task(name="lifecycle.info_ok")
    def ok():
        return 1

    with worker_factory(celery_app):
        done = ok.delay()
        assert done.get(timeout=30) == 1
        info = client.info(done.id, queue="celery", timeout=5)
        assert info is not None
        assert (info.job_id, info.state, info.attempt, info.type) == (done.id, "completed", 1, "lifecycle.info_ok")
        assert info.worker_id == worker_lifecycle().worker_id
        assert client.info(new_job_id(), queue="celery", timeout=1) is None  # never seen


def test_a_celery_worker_is_listed_by_client_workers_with_its_running_task(celery_app, worker_factory, client):
    """The worker bootstep ``PresenceStep`` publishes the Celery worker's presence (``Client.workers``)."""
    release, started = threading.Event(), threading.Event()

    @celery_app.task(name="lifecycle.hold")
    def hold():
        started.set()
        release.wait(30)
        return 1

    worker_id = worker_lifecycle().worker_id
    with worker_factory(celery_app):
        try:
            result = hold.delay()
            assert started.wait(30)

            def listed():
                mine = [w for w in client.workers() if w.worker_id == worker_id]
                return mine[0] if mine and mine[0].active else None

            presence = wait_until(listed, 15, message="the Celery worker's presence with its running task")
            assert presence.queues == ("celery",)
            assert [job.job_id for job in presence.active] == [result.id]
        finally:
            release.set()
        assert result.get(timeout=30) == 1
    assert all(w.worker_id != worker_id for w in client.workers())  # its last presence said offline


def test_celery_events_carry_the_jobs_enqueued_and_scheduled_times(celery_app, worker_factory):
    """The job metrics' queue wait and lateness need them (``ojs_job_queue_wait_seconds`` for Celery tasks)."""
    seen = []
    worker_lifecycle().subscribe(lambda event: seen.append(event) if event.event == "started" else None)

    @celery_app.task(name="lifecycle.times")
    def ok():
        return 1

    with worker_factory(celery_app):
        now = ok.delay()
        later = ok.apply_async(countdown=1)
        assert now.get(timeout=30) == 1 and later.get(timeout=30) == 1
    started = {event.job_id: event for event in seen if event.job_id in (now.id, later.id)}
    assert started[now.id].enqueued_at is not None and started[now.id].enqueued_at <= started[now.id].at
    assert started[now.id].scheduled_at is None
    assert started[later.id].scheduled_at is not None and started[later.id].scheduled_at <= started[later.id].at


def test_a_retried_tasks_queue_wait_starts_at_its_new_enqueue(celery_app, worker_factory):
    """The events carry the delivered job's own ``enqueued_at`` (the transport's decoded job):
    a retry's queue wait is measured from when the retry was enqueued, not from the first one."""
    seen = []
    worker_lifecycle().subscribe(lambda event: seen.append(event) if event.event == "started" else None)

    @celery_app.task(name="lifecycle.retry_times", bind=True, max_retries=1, default_retry_delay=0)
    def flaky(self):
        if self.request.retries == 0:
            time.sleep(0.2)  # the retry is enqueued at least this much later than the first attempt
            raise self.retry(exc=KeyError("once"))
        return 2

    with worker_factory(celery_app):
        result = flaky.delay()
        assert result.get(timeout=30) == 2
    first, second = [event for event in seen if event.job_id == result.id]
    assert (first.attempt, second.attempt) == (1, 2)
    assert first.enqueued_at is not None and second.enqueued_at is not None
    assert second.enqueued_at - first.enqueued_at >= timedelta(seconds=0.2)


def test_a_forked_process_gets_its_own_lifecycle_and_keeps_it():
    """Prefork's pool processes are forks of the worker: each gets its own hub (its own worker id)
    on first use, and the same one on every later use; the parent's stays the parent's."""
    parent = worker_lifecycle()
    assert worker_lifecycle() is parent
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its two worker ids, whatever happens
        try:
            first, again = worker_lifecycle(), worker_lifecycle()
            os.write(write_end, f"{first.worker_id} {again is first}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child_id, same = pipe.read().split()
    os.waitpid(pid, 0)
    assert child_id != parent.worker_id
    assert child_id.split(".")[-2] == str(pid)  # {host}.{pid}.{hex}: named after the child
    assert same == "True"
    assert worker_lifecycle() is parent
