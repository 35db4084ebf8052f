"""Lifecycle events (``ojs_kombu.runtime.lifecycle``) from a Celery worker: ``ojs_celery.lifecycle``.

The in-thread worker runs in this process, so its :func:`worker_lifecycle` is this process's.
"""

from __future__ import annotations

import threading

import pytest

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
