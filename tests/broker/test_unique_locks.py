"""Unique-job locks on a real broker (DESIGN §19): set-if-absent, holder ids, expiry, race-free release."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import kombu
import pytest
from amqp.exceptions import PreconditionFailed
from support import message_count, raw_channel, wait_until

from ojs_kombu import Names
from ojs_kombu.amqp.locks import Acquired, Held, LockRequest, UniqueLocks
from ojs_kombu.errors import ValidationError


@pytest.fixture
def locks(amqp_url: str, names: Names) -> Iterator[UniqueLocks]:
    with kombu.Connection(amqp_url) as connection:
        connection.connect()
        locks = UniqueLocks(connection.connection, names=names)
        yield locks
        locks.close()


def new_key() -> str:
    return uuid.uuid4().hex * 2  # 64 hex digits, like a real key


def test_acquire_duplicate_release(locks: UniqueLocks, names: Names, amqp_url: str):
    key = new_key()
    assert locks.holder(key) is None
    assert locks.acquire(key, "job-a", timedelta(minutes=5)) == Acquired(key, "job-a", 300_000)
    assert locks.acquire(key, "job-b", timedelta(minutes=5)) == Held(key, "job-a")
    assert locks.holder(key) == "job-a"
    assert message_count(amqp_url, names.lock_queue(key)) == 1  # reading the holder left the token
    assert locks.release(key, "job-b") is False  # not the holder: nothing happens
    assert locks.holder(key) == "job-a"
    assert locks.release(key, "job-a") is True
    assert locks.holder(key) is None
    assert locks.release(key, "job-a") is False
    assert isinstance(locks.acquire(key, "job-b", timedelta(minutes=5)), Acquired)
    assert locks.acquire(key, "job-c", None) == Held(key, "job-b")


def test_keys_are_independent(locks: UniqueLocks):
    first, second = new_key(), new_key()
    assert isinstance(locks.acquire(first, "job-a", timedelta(minutes=1)), Acquired)
    assert isinstance(locks.acquire(second, "job-b", timedelta(minutes=1)), Acquired)


def test_bad_arguments_are_refused(locks: UniqueLocks):
    with pytest.raises(ValidationError) as info:
        locks.acquire(new_key(), "job-a", timedelta(0))
    assert info.value.field == "period"
    with pytest.raises(ValidationError) as info:
        locks.acquire(new_key(), "", timedelta(seconds=1))
    assert info.value.field == "holder_id"


def test_sixteen_concurrent_acquirers_one_wins(amqp_url: str, names: Names):
    key, n = new_key(), 16
    barrier = threading.Barrier(n)
    results: dict[str, Acquired | Held | BaseException] = {}

    def contend(holder_id: str) -> None:
        try:
            with kombu.Connection(amqp_url) as connection:
                connection.connect()
                locks = UniqueLocks(connection.connection, names=names)
                barrier.wait(timeout=30)
                results[holder_id] = locks.acquire(key, holder_id, timedelta(minutes=5))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
            results[holder_id] = exc

    threads = [threading.Thread(target=contend, args=(f"job-{i:02d}",)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    winners = [r for r in results.values() if isinstance(r, Acquired)]
    assert len(results) == n, results
    assert len(winners) == 1, results
    winner = winners[0].holder_id
    assert [r for r in results.values() if not isinstance(r, Acquired)] == [Held(key, winner)] * (n - 1), results
    assert message_count(amqp_url, names.lock_queue(key)) == 1


def test_a_refused_declaration_takes_no_lock_unknowingly(locks: UniqueLocks, names: Names, amqp_url: str):
    # A refused declaration closes its channel.  Every declaration of a batch goes out before every
    # token, on one channel: the broker discards the tokens with the rest, so none is taken unread.
    # (The strength test once failed on RabbitMQ 4.3's 404 "home node ... is down or inaccessible"
    # to a lock met while a concurrent acquirer created it; a 406 closes the channel the same way.)
    free, conflicting = new_key(), new_key()
    with raw_channel(amqp_url) as channel:
        channel.queue_declare(names.lock_holder_queue(conflicting), durable=True)  # other arguments
    requests = [LockRequest(free, "job-a", timedelta(minutes=5)), LockRequest(conflicting, "job-b", None)]
    with pytest.raises(PreconditionFailed):
        locks.acquire_many(requests)
    assert message_count(amqp_url, names.lock_queue(free)) == 0
    assert locks.acquire(free, "job-c", timedelta(minutes=5)) == Acquired(free, "job-c", 300_000)


def test_expiry_frees_the_lock(locks: UniqueLocks):
    key = new_key()
    assert isinstance(locks.acquire(key, "job-a", timedelta(seconds=1)), Acquired)
    assert locks.acquire(key, "job-b", timedelta(seconds=1)) == Held(key, "job-a")
    # No release: the holder "crashed".  The token's TTL frees the lock by itself.
    wait_until(
        lambda: isinstance(locks.acquire(key, "job-b", timedelta(minutes=5)), Acquired),
        timeout=10,
        message="the lock to expire",
    )
    assert locks.holder(key) == "job-b"


def test_late_release_does_not_free_a_new_holder(locks: UniqueLocks):
    key = new_key()
    assert isinstance(locks.acquire(key, "job-a", timedelta(milliseconds=500)), Acquired)
    wait_until(
        lambda: isinstance(locks.acquire(key, "job-b", timedelta(minutes=5)), Acquired),
        timeout=10,
        message="job-a's lock to expire and job-b to take it",
    )
    assert locks.release(key, "job-a") is False  # job-a finishes late
    assert locks.holder(key) == "job-b"
    assert locks.acquire(key, "job-c", timedelta(minutes=5)) == Held(key, "job-b")
    assert locks.release(key, "job-b") is True


def test_release_deletes_the_queues(locks: UniqueLocks, names: Names, management):
    key = new_key()
    locks.acquire(key, "job-a", timedelta(minutes=1))
    assert locks.release(key, "job-a") is True
    assert management.queue(names.lock_queue(key)) is None
    assert management.queue(names.lock_holder_queue(key)) is None


def test_a_lock_without_period_lives_queue_expires_at_most(amqp_url: str, names: Names):
    key = new_key()
    with kombu.Connection(amqp_url) as connection:
        connection.connect()
        locks = UniqueLocks(connection.connection, names=names, queue_expires=timedelta(seconds=1))
        assert locks.acquire(key, "job-a", None) == Acquired(key, "job-a", 1000)
        assert locks.acquire(key, "job-b", timedelta(days=30)) == Held(key, "job-a")
        wait_until(lambda: locks.holder(key) is None, timeout=10, message="the capped lock to expire")
        locks.close()


def test_a_reader_holding_the_record_does_not_open_the_lock(locks: UniqueLocks, names: Names, amqp_url: str):
    # x-max-length counts ready messages only: had readers taken the token itself, a token held
    # unacknowledged would let a second acquirer in.  Readers take the holder's record instead.
    key = new_key()
    assert isinstance(locks.acquire(key, "job-a", timedelta(minutes=5)), Acquired)
    with raw_channel(amqp_url) as channel:
        method, _, body = channel.basic_get(names.lock_holder_queue(key), auto_ack=False)
        assert body == b"job-a"
        result = locks.acquire(key, "job-b", timedelta(minutes=5))
        assert isinstance(result, Held)  # its id may read as None: the record is out
        channel.basic_reject(method.delivery_tag, requeue=True)
    assert message_count(amqp_url, names.lock_queue(key)) == 1
    assert locks.holder(key) == "job-a"


def test_release_without_the_holder_record_reads_the_token(locks: UniqueLocks, names: Names, management):
    # The record is a transient message: a broker restart loses it, the persistent token stays.
    key = new_key()
    assert isinstance(locks.acquire(key, "job-a", timedelta(minutes=5)), Acquired)
    assert management.delete_queue(names.lock_holder_queue(key))
    assert locks.release(key, "job-b") is False  # the token is another job's: it is put back
    assert locks.acquire(key, "job-c", timedelta(minutes=5)) == Held(key, None)
    assert locks.release(key, "job-a") is True
    assert isinstance(locks.acquire(key, "job-c", timedelta(minutes=5)), Acquired)
