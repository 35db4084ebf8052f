"""The unique locks' backend choice and lock lifetimes: pure logic, no broker, no Redis."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ojs_kombu import ValidationError
from ojs_kombu.amqp.locks import lock_ttl_ms
from ojs_kombu.runtime.redis_locks import RedisLocks, _held
from ojs_kombu.runtime.unique import check_backend
from ojs_kombu.transport.settings import Settings


@pytest.mark.parametrize("url", [None, "redis://h:6379/0", "rediss://:pw@h:6380/1", "unix:///run/redis.sock"])
def test_none_and_redis_urls_are_backends(url):
    assert check_backend(url) == url


@pytest.mark.parametrize("url", ["amqp://guest:s3cret@h//", "http://h", "", "rabbitmq"])
def test_anything_else_is_refused_without_its_password(url):
    with pytest.raises(ValidationError) as info:
        check_backend(url)
    assert info.value.field == "unique_backend"
    assert "s3cret" not in str(info.value)
    with pytest.raises(ValidationError):
        Settings.from_options({"unique_backend": url})
    with pytest.raises(ValidationError):
        RedisLocks(url)


def test_a_lock_lives_its_period_at_least_1_ms_and_at_most_queue_expires():
    assert lock_ttl_ms(None, 5000) == 5000
    assert lock_ttl_ms(timedelta(seconds=2), 5000) == 2000
    assert lock_ttl_ms(timedelta(days=9), 5000) == 5000
    assert lock_ttl_ms(timedelta(microseconds=10), 5000) == 1
    with pytest.raises(ValidationError) as info:
        lock_ttl_ms(timedelta(seconds=-1), 5000)
    assert info.value.field == "period"


def test_a_redis_value_not_written_by_a_lock_reads_as_held_by_nobody():
    assert _held("k", b'["job-a", "2030-01-01T00:00:00Z"]').existing_id == "job-a"
    assert _held("k", b'["job-a", null]').existing_scheduled_at is None
    assert _held("k", b"job-a").existing_id is None
    assert _held("k", b"[1, 2, 3]").existing_id is None


def test_the_transport_option_unique_replace_timeout_is_seconds():
    from ojs_kombu.runtime.replace import DEFAULT_REPLACE_TIMEOUT

    assert Settings.from_options({}).unique_replace_timeout == DEFAULT_REPLACE_TIMEOUT
    assert Settings.from_options({"unique_replace_timeout": 0}).unique_replace_timeout == 0.0
    for bad in (-1, "5", True):
        with pytest.raises(ValidationError) as info:
            Settings.from_options({"unique_replace_timeout": bad})
        assert info.value.field == "unique_replace_timeout"
