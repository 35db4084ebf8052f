"""Unique-job locks on Redis (DESIGN §19, issue 30): for more live keys than RabbitMQ entities hold.

A lock is one Redis string ``{prefix}ojs.lock.{key}`` (the name of its RabbitMQ queue), set
with ``SET key value NX PX ttl``: Redis runs commands one at a time, so among any number of
concurrent acquirers exactly one sets it (strong, spec §8.1), and the key expires with the
period even if every holder crashed.  Its value is the JSON ``[holder_id, scheduled_at]``,
read by anyone without touching the lock (no holder record beside it, unlike the queues).

* **acquire** is one Lua script (one round trip, atomic): the ``SET NX PX``, and when the key
  is taken, the holder's value (what ``SET ... NX GET`` answers on Redis 7 only);
* **release** is a compare-and-delete script: the key is deleted only if its value names
  ``holder_id``, so a job ending after its period never frees a newer holder's lock (no
  window left, unlike the two reads of the queue lock).

It needs the optional ``redis`` client library (``pip install ojs-kombu[redis]``).  A lock
lives in that Redis only: its persistence and failover are the server's (``appendonly``,
Sentinel); an acquire while it is unreachable raises :class:`~ojs_kombu.errors.BrokerConnectionError`,
it never passes.  A live lock costs Redis ~260 bytes (measured), a RabbitMQ node ~86 KB and an open file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Final

from ojs_kombu.amqp.locks import DEFAULT_QUEUE_EXPIRES, Acquired, Held, LockRequest, lock_ttl_ms
from ojs_kombu.amqp.urls import redact
from ojs_kombu.errors import BrokerConnectionError, ValidationError
from ojs_kombu.model.naming import Names

REDIS_SCHEMES: Final = ("redis://", "rediss://", "unix://")
"""The URL schemes of a Redis lock backend (``Client(unique_backend=...)``)."""

# SET NX PX, and the holder's value when the key is taken: one atomic step.
_ACQUIRE: Final = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
return redis.call('GET', KEYS[1])
"""
# Delete the key only if it names ARGV[1] as holder.
_RELEASE: Final = """
local value = redis.call('GET', KEYS[1])
if value and cjson.decode(value)[1] == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def is_redis_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis server (``redis://``, ``rediss://``, ``unix://``)."""
    return isinstance(url, str) and url.startswith(REDIS_SCHEMES)


class RedisLocks:
    """Acquire, read and release unique-job locks on a Redis server; thread-safe (a pool of connections).

    The same operations and outcomes as :class:`~ojs_kombu.amqp.locks.UniqueLocks`.

    Parameters:
        url: the server, ``redis://[:password@]host:port/db`` (``rediss://`` for TLS).
        names: the deployment's entity names: its prefix is the keys' prefix.
        queue_expires: the longest a lock lives (a lock without a period, or a longer one),
            as for the queue locks: the same value in every process of a deployment.
        socket_timeout: seconds a command may take before it fails.

    Raises:
        ValidationError: ``url`` is no Redis URL, or ``queue_expires`` is not positive.
        ImportError: the ``redis`` library is not installed (the ``redis`` extra).
    """

    def __init__(
        self,
        url: str,
        *,
        names: Names | None = None,
        queue_expires: timedelta = DEFAULT_QUEUE_EXPIRES,
        socket_timeout: float = 10.0,
    ):
        if not is_redis_url(url):
            raise ValidationError(f"not a Redis URL: {redact(url)!r}", field="unique_backend")
        if queue_expires <= timedelta(0):
            raise ValidationError("queue_expires must be greater than zero", field="queue_expires")
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise ImportError(
                "unique_backend='redis://...' needs the redis library: pip install ojs-kombu[redis]"
            ) from exc
        self.url = url
        self.names = names if names is not None else Names()
        self.expires_ms = math.ceil(queue_expires.total_seconds() * 1000)
        self._errors: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)
        self._client: Any = redis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
        )
        self._acquire = self._client.register_script(_ACQUIRE)
        self._release = self._client.register_script(_RELEASE)

    def acquire(
        self, key: str, holder_id: str, period: timedelta | None, *, scheduled_at: str | None = None
    ) -> Acquired | Held:
        """Take the lock of ``key`` for ``holder_id`` unless another holds it (``SET NX PX``).

        Parameters:
            key: the uniqueness key (:func:`ojs_kombu.policy.unique_key`).
            holder_id: the id of the job that will hold it.
            period: how long the lock may live at most; None or longer than ``queue_expires``
                means ``queue_expires``.
            scheduled_at: the holder's ``scheduled_at``, kept with its id.

        Returns:
            :class:`~ojs_kombu.amqp.locks.Acquired`, or :class:`~ojs_kombu.amqp.locks.Held`
            with the holder's id.

        Raises:
            ValidationError: ``period`` is not positive, or ``holder_id`` is empty.
            BrokerConnectionError: Redis is unreachable or did not answer in time.
        """
        return self.acquire_many([LockRequest(key, holder_id, period, scheduled_at)])[0]

    def acquire_many(self, requests: Sequence[LockRequest]) -> list[Acquired | Held]:
        """Take the locks of a batch, each as :meth:`acquire` does, in one round trip (a pipeline).

        Parameters:
            requests: what to lock, in order (a later request for a key an earlier one took is
                :class:`~ojs_kombu.amqp.locks.Held` by it).

        Returns:
            One ``Acquired`` or ``Held`` per request, in order.

        Raises:
            ValidationError, BrokerConnectionError: as :meth:`acquire`.
        """
        for request in requests:
            if not request.holder_id:
                raise ValidationError("holder_id must not be empty", field="holder_id")
        ttls = [lock_ttl_ms(request.period, self.expires_ms) for request in requests]
        pipeline = self._client.pipeline(transaction=False)
        for request, ttl_ms in zip(requests, ttls, strict=True):
            value = json.dumps([request.holder_id, request.scheduled_at])
            self._acquire(keys=[self.names.lock_queue(request.key)], args=[value, ttl_ms], client=pipeline)
        values = self._call(pipeline.execute)
        return [
            Acquired(request.key, request.holder_id, ttl_ms) if existing is None else _held(request.key, existing)
            for request, ttl_ms, existing in zip(requests, ttls, values, strict=True)
        ]

    def holder(self, key: str) -> str | None:
        """The id of the job holding the lock of ``key``, or None when it is free.

        Parameters:
            key: the uniqueness key.

        Returns:
            The holder's job id, or None.

        Raises:
            BrokerConnectionError: Redis is unreachable.
        """
        value = self._call(lambda: self._client.get(self.names.lock_queue(key)))
        return None if value is None else _held(key, value).existing_id

    def release(self, key: str, holder_id: str) -> bool:
        """Free the lock of ``key`` if ``holder_id`` holds it (an atomic compare-and-delete).

        Parameters:
            key: the uniqueness key.
            holder_id: the job that took the lock.

        Returns:
            True when this deleted ``holder_id``'s lock; False when it no longer held it.

        Raises:
            BrokerConnectionError: Redis is unreachable.
        """
        return bool(self._run(self._release, key, holder_id))

    def close(self) -> None:
        """Close the connections to Redis (a later call opens new ones)."""
        self._client.close()

    def _run(self, script: Any, key: str, *args: object) -> Any:
        return self._call(lambda: script(keys=[self.names.lock_queue(key)], args=list(args)))

    def _call(self, operation: Any) -> Any:
        try:
            return operation()
        except self._errors as exc:
            raise BrokerConnectionError(f"unique locks: Redis {redact(self.url)} unreachable: {exc}") from exc


def _held(key: str, value: bytes | str) -> Held:
    """The :class:`Held` of a lock whose value is ``value`` (JSON ``[holder_id, scheduled_at]``)."""
    try:
        holder_id, scheduled_at = json.loads(value)
    except (ValueError, TypeError):
        return Held(key, None)  # not written by us: held, by nobody we can name
    return Held(
        key,
        holder_id if isinstance(holder_id, str) else None,
        scheduled_at if isinstance(scheduled_at, str) else None,
    )


__all__ = ["REDIS_SCHEMES", "RedisLocks", "is_redis_url"]
