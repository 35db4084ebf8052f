"""Unique jobs from Celery (issue 30): ``apply_async(..., ojs_unique={...})`` and ``@app.task(ojs_unique=...)``;
a duplicate raises ``ojs_kombu.DuplicateJobError`` in the caller and nothing more is published."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis
from frameworks import ojs_celery_app
from support import get_messages, message_count, wait_until

from ojs_kombu import DuplicateJobError

UNIQUE = {"keys": ["type", "args"], "period": "PT1H"}


def test_apply_async_ojs_unique_refuses_a_duplicate(celery_app, amqp_url, names):
    @celery_app.task
    def report(day):
        return day

    first = report.apply_async(("2026-11-27",), ojs_unique=UNIQUE)
    with pytest.raises(DuplicateJobError) as info:
        report.apply_async(("2026-11-27",), ojs_unique=UNIQUE)
    assert info.value.existing_id == first.id
    report.apply_async(("2026-11-28",), ojs_unique=UNIQUE)  # another key
    ignored = report.apply_async(("2026-11-27",), ojs_unique={**UNIQUE, "on_conflict": "ignore"})
    assert ignored.id != first.id  # Celery made its id; nothing was published for it
    assert message_count(amqp_url, names.job_queue("celery")) == 2
    envelopes = [json.loads(body) for _, _, body in get_messages(amqp_url, names.job_queue("celery"), 2)]
    assert [e["unique"] for e in envelopes] == [UNIQUE, UNIQUE]


def test_the_task_option_applies_to_every_call(celery_app):
    @celery_app.task(ojs_unique={"keys": ["type"], "period": "PT10M"})
    def singleton(n):
        return n

    first = singleton.delay(1)
    with pytest.raises(DuplicateJobError) as info:
        singleton.delay(2)
    assert info.value.existing_id == first.id


def applied_eventually(task, args, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return task.apply_async(args, ojs_unique=UNIQUE)
        except DuplicateJobError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_worker_frees_the_lock_when_the_task_ends(celery_app, worker_factory):
    gate = threading.Event()

    @celery_app.task
    def held(n):
        gate.wait(10)
        return n

    @celery_app.task(max_retries=0)
    def broken(n):
        raise RuntimeError("for good")

    first = held.apply_async((1,), ojs_unique=UNIQUE)
    failing = broken.apply_async((1,), ojs_unique=UNIQUE)
    with worker_factory(celery_app):
        with pytest.raises(DuplicateJobError):  # running: still held
            held.apply_async((1,), ojs_unique=UNIQUE)
        gate.set()
        assert first.get(timeout=20) == 1
        again = applied_eventually(held, (1,))  # completed: freed
        assert again.get(timeout=20) == 1
        with pytest.raises(RuntimeError):
            failing.get(timeout=20)
        applied_eventually(broken, (1,))  # dead-lettered: freed


def test_locks_on_redis_through_the_transport_option(amqp_url, prefix, redis_url, names, worker_factory, management):
    # broker_transport_options={"unique_backend": "redis://..."}: the transport takes and frees its locks in Redis.
    store = redis.Redis.from_url(redis_url)
    with ojs_celery_app(amqp_url, prefix) as app:
        app.conf.broker_transport_options = {"prefix": prefix, "unique_backend": redis_url}

        @app.task
        def once(n):
            return n

        first = once.apply_async((7,), ojs_unique=UNIQUE)
        with pytest.raises(DuplicateJobError) as info:
            once.apply_async((7,), ojs_unique=UNIQUE)
        assert info.value.existing_id == first.id
        lock = names.lock_queue(info.value.key)
        assert store.exists(lock) == 1 and management.queue(lock) is None
        with worker_factory(app):
            assert first.get(timeout=20) == 7
            wait_until(lambda: store.exists(lock) == 0, timeout=20, message="the Redis lock freed on completion")
    store.close()


def test_replace_of_a_running_task_waits_for_it_to_end_or_is_rejected(celery_app, amqp_url, prefix, worker_factory):
    # on_conflict="replace" never runs both (unique-jobs spec §8): the producer cancels the running
    # holder, asks its workers by INFO, and publishes only once it ended; or rejects after
    # unique_replace_timeout, as the Client does.
    started, gate = threading.Event(), threading.Event()

    @celery_app.task
    def slow(n):
        started.set()
        gate.wait(10)
        return n

    replace = {**UNIQUE, "on_conflict": "replace"}
    first = slow.apply_async((1,), ojs_unique=UNIQUE)
    with worker_factory(celery_app):
        assert started.wait(10), "the first task did not start"
        with ojs_celery_app(amqp_url, prefix) as impatient:
            impatient.conf.broker_transport_options = {"prefix": prefix, "unique_replace_timeout": 0.5}
            with pytest.raises(DuplicateJobError) as info:
                impatient.send_task(slow.name, (1,), ojs_unique=replace)
            assert info.value.existing_id == first.id
        assert not gate.is_set()
        threading.Timer(1.0, gate.set).start()
        begun = time.monotonic()
        second = slow.apply_async((1,), ojs_unique=replace)
        assert gate.is_set(), "the replace returned while the first task still ran"
        assert time.monotonic() - begun >= 0.9
        assert second.id != first.id
        assert second.get(timeout=20) == 1
