"""Unique jobs from Dramatiq (issue 30): ``send_with_options(ojs_unique={...})`` and the actor option; a duplicate
raises ``ojs_kombu.DuplicateJobError`` in the sender, and the worker frees the lock when the message is done."""

from __future__ import annotations

import threading
import time

import dramatiq
import pytest
import redis
from frameworks import dramatiq_worker_starter, global_ojs_broker
from support import wait_until

from ojs_kombu import DuplicateJobError
from tools.redis import provision_redis

pytestmark = pytest.mark.timeout(120)

UNIQUE = {"keys": ["type", "args"], "period": "PT1H"}


def sent_eventually(send, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return send()
        except DuplicateJobError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_duplicate_send_raises_until_the_first_message_is_done(ojs_broker, start_worker):
    gate = threading.Event()
    runs: list[int] = []

    @dramatiq.actor(queue_name="uniq")
    def unique_task(n):
        runs.append(n)
        gate.wait(10)

    first = unique_task.send_with_options(args=(1,), ojs_unique=UNIQUE)
    with pytest.raises(DuplicateJobError) as info:
        unique_task.send_with_options(args=(1,), ojs_unique=UNIQUE)
    assert info.value.existing_id is not None
    assert info.value.existing_id == ojs_broker.job_for(first).id
    unique_task.send_with_options(args=(2,), ojs_unique=UNIQUE)  # another key
    start_worker()
    gate.set()
    sent_eventually(lambda: unique_task.send_with_options(args=(1,), ojs_unique=UNIQUE))  # freed after the ack


def test_the_actor_option_applies_to_every_send(ojs_broker):
    @dramatiq.actor(queue_name="uniq2", ojs_unique={**UNIQUE, "keys": ["type"]})
    def singleton(n):
        pass

    singleton.send(1)
    with pytest.raises(DuplicateJobError):
        singleton.send(2)


def test_locks_on_redis_with_unique_backend(amqp_url, prefix, names, tmp_path, management):
    # OjsBroker(unique_backend="redis://..."): the sender takes the lock in Redis, the worker frees it there.
    with (
        provision_redis(tmp_path) as redis_url,
        global_ojs_broker(amqp_url, prefix, unique_backend=redis_url) as broker,
        dramatiq_worker_starter(broker) as start_worker,
    ):

        @dramatiq.actor(queue_name="uniqr")
        def on_redis(n):
            pass

        first = on_redis.send_with_options(args=(1,), ojs_unique=UNIQUE)
        with pytest.raises(DuplicateJobError) as info:
            on_redis.send_with_options(args=(1,), ojs_unique=UNIQUE)
        assert info.value.existing_id == broker.job_for(first).id
        store = redis.Redis.from_url(redis_url)
        lock = names.lock_queue(info.value.key)
        assert store.exists(lock) == 1 and management.queue(lock) is None
        start_worker()
        wait_until(lambda: store.exists(lock) == 0, timeout=20, message="the Redis lock freed after the ack")
        store.close()
