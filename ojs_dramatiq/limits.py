"""Dramatiq's concurrent rate limiter on RabbitMQ alone: :class:`OjsConcurrentRateLimiter` (opt-in).

Dramatiq's ``ConcurrentRateLimiter`` needs Redis or Memcached (dramatiq#82).  This one holds a
*permit* of the OJS key (:class:`~ojs_kombu.Permits`, ``docs/limits.md``) instead: at most
``limit`` holders across every process and machine of the broker, and a process that dies gives
its permits back by itself::

    from ojs_dramatiq import OjsConcurrentRateLimiter

    STRIPE = OjsConcurrentRateLimiter("stripe-api", limit=3)  # or RateLimitPolicy(key=..., concurrency=3)

    @dramatiq.actor
    def charge(order_id):
        with STRIPE.acquire():  # RateLimitExceeded when 3 are held: Dramatiq retries the message
            ...

The same key is the same limit as a job's ``rate_limit`` of that key run by an ``ojs_kombu``
Worker: give both the same ``concurrency``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq
from dramatiq.rate_limits import RateLimiter

from ojs_kombu.amqp.permits import Permit, Permits
from ojs_kombu.errors import ValidationError
from ojs_kombu.model.ratelimit import RateLimitPolicy

POLL_INTERVAL = 0.02
"""Seconds between two attempts of an :meth:`~OjsConcurrentRateLimiter.acquire` that waits."""


class OjsConcurrentRateLimiter(RateLimiter):
    """At most ``limit`` concurrent holders of ``key``, across processes, on the OJS broker's permits.

    Parameters:
        key: the rate limit key (``^[a-zA-Z0-9][a-zA-Z0-9._:-]*$``), or a
            :class:`~ojs_kombu.RateLimitPolicy` whose ``concurrency`` is the limit.
        limit: the number of holders at once (with a key), 0 to 10,000.
        broker: the :class:`~ojs_dramatiq.OjsBroker` whose permits it takes (default: Dramatiq's
            global broker when the limiter is first used).
        wait: seconds :meth:`acquire` waits for a permit (default 0: it does not wait), asking every
            :data:`POLL_INTERVAL` seconds.

    Raises:
        ValidationError: a bad key or limit.
    """

    def __init__(self, key: str | RateLimitPolicy, *, limit: int = 1, broker: Any = None, wait: float = 0.0) -> None:
        policy = key if isinstance(key, RateLimitPolicy) else RateLimitPolicy(key=key, concurrency=limit)
        if policy.concurrency is None:
            raise ValidationError("the policy has no concurrency to limit to", field="concurrency")
        super().__init__(None, policy.key)  # type: ignore[no-untyped-call]
        self.limit: int = policy.concurrency
        self.wait = wait
        self._broker = broker
        self._ensured: Permits | None = None
        self._held = threading.local()  # the permits this thread holds, innermost last

    def _permits(self) -> Permits:
        broker = self._broker or dramatiq.get_broker()
        permits: Permits | None = getattr(broker, "permits", None)
        if permits is None:
            raise ValidationError(
                f"OjsConcurrentRateLimiter needs an OjsBroker, got {type(broker).__name__}", field="broker"
            )
        if self._ensured is not permits:
            permits.ensure(self.key, self.limit)
            self._ensured = permits
        return permits

    def _acquire(self) -> bool:
        permits = self._permits()
        deadline = time.monotonic() + self.wait
        # Polled rather than Permits.acquire(timeout=wait): a waiting acquire holds the connection in
        # turns of 0.2 s, which every release and every other thread's acquire would wait for.
        while (permit := permits.acquire(self.key, timeout=0.0)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(POLL_INTERVAL, left))
        stack: list[Permit] = self._held.__dict__.setdefault("stack", [])
        stack.append(permit)
        return True

    def _release(self) -> None:
        self._held.stack.pop().release()


__all__ = ["OjsConcurrentRateLimiter"]
