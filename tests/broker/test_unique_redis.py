"""Unique jobs with their locks on Redis (issue 30 item 1): ``SET NX PX`` and a compare-and-delete release,
against a real ``redis-server`` (``$OJS_REDIS_URL``, else a private one: ``tools.redis``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from support import enqueue_at_once, wait_until

from ojs_kombu import Client, Names, UniquePolicy, ValidationError, current_job
from ojs_kombu.amqp.locks import Acquired, Held, LockRequest
from ojs_kombu.policy import job_unique_key
from ojs_kombu.runtime.redis_locks import RedisLocks
from tools.redis import RedisServerError, provision_redis

ROOT = Path(__file__).resolve().parents[2]
UNIQUE = UniquePolicy(keys=["type", "args"], period="PT1H")


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    try:
        with provision_redis(ROOT / ".cache" / "redis") as url:
            yield url
    except RedisServerError as exc:
        pytest.fail(f"no Redis server for the unique locks: {exc}")


@pytest.fixture
def store(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_redis_lock_set_if_absent_holder_expiry_and_compare_and_delete(redis_url: str, store: redis.Redis):
    names = Names(f"t{uuid.uuid4().hex[:8]}")
    locks = RedisLocks(redis_url, names=names)
    key = uuid.uuid4().hex * 2
    try:
        assert locks.holder(key) is None
        assert locks.acquire(key, "job-a", timedelta(minutes=5), scheduled_at="2030-01-01T00:00:00Z") == Acquired(
            key, "job-a", 300_000
        )
        assert 299_000 < store.pttl(names.lock_queue(key)) <= 300_000  # one key, under the deployment's prefix
        assert locks.acquire(key, "job-b", None) == Held(key, "job-a", "2030-01-01T00:00:00Z")
        assert locks.holder(key) == "job-a"
        assert locks.release(key, "job-b") is False  # not the holder: nothing happens
        assert locks.release(key, "job-a") is True
        assert store.exists(names.lock_queue(key)) == 0
        assert locks.release(key, "job-a") is False

        # The period frees a crashed holder's lock; its late release does not free the next holder.
        assert isinstance(locks.acquire(key, "job-c", timedelta(milliseconds=200)), Acquired)
        wait_until(
            lambda: isinstance(locks.acquire(key, "job-d", timedelta(minutes=5)), Acquired),
            timeout=5,
            message="job-c's lock to expire",
        )
        assert locks.release(key, "job-c") is False
        assert locks.holder(key) == "job-d"
        assert locks.release(key, "job-d") is True

        # A batch (enqueue_many) in one pipeline: a later request for a key taken earlier is Held by it.
        other = uuid.uuid4().hex * 2
        batch = [LockRequest(key, "job-e", None), LockRequest(other, "job-f", None), LockRequest(key, "job-g", None)]
        assert locks.acquire_many(batch) == [
            Acquired(key, "job-e", locks.expires_ms),
            Acquired(other, "job-f", locks.expires_ms),
            Held(key, "job-e"),
        ]
        assert locks.release(key, "job-e") and locks.release(other, "job-f")

        with pytest.raises(ValidationError) as info:
            locks.acquire(key, "job-e", timedelta(0))
        assert info.value.field == "period"
        with pytest.raises(ValidationError) as info:
            Client("amqp://guest:guest@127.0.0.1:1//", unique_backend="http://redis.example")
        assert info.value.field == "unique_backend"
    finally:
        locks.close()


def test_16_clients_at_once_one_accepted_on_redis_and_released_when_it_completes(
    amqp_url: str, prefix: str, redis_url: str, store: redis.Redis, worker_factory, management
):
    job_type = f"u.redis.k{uuid.uuid4().hex[:8]}"

    def warm_up(own: Client) -> None:
        own.enqueue("u.noop", [0], queue="default")  # connected: only the race remains
        own.enqueue("u.noop", [0], unique=UniquePolicy(keys=["type"], period="PT1S", on_conflict="ignore"))

    accepted, refused = enqueue_at_once(
        lambda: Client(amqp_url, prefix=prefix, unique_backend=redis_url), job_type, UNIQUE, warm_up=warm_up
    )
    assert len(accepted) == 1 and len(refused) == 15
    assert {exc.existing_id for exc in refused} == {accepted[0].id}
    key = job_unique_key(accepted[0])
    names = Names(prefix)
    assert store.exists(names.lock_queue(key)) == 1
    assert management.queue(names.lock_queue(key)) is None  # the lock is Redis's: no queue on the broker

    runs: list[str] = []
    worker = worker_factory(unique_backend=redis_url)
    worker.handler("u.noop", lambda _: None)
    worker.handler(job_type, lambda _: runs.append(current_job().id))
    worker.start()
    wait_until(lambda: store.exists(names.lock_queue(key)) == 0, timeout=20, message="the lock freed on completion")
    assert runs == [accepted[0].id]
    with Client(amqp_url, prefix=prefix, unique_backend=redis_url) as client:
        again = client.enqueue(job_type, [42], unique=UNIQUE)
        wait_until(lambda: len(runs) == 2, timeout=20, message="the second job to run")
        assert runs[1] == again.id != accepted[0].id
        wait_until(lambda: store.exists(names.lock_queue(key)) == 0, timeout=20, message="the second lock freed")
