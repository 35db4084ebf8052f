"""Window rates across processes on RabbitMQ alone: start tokens refilled every slot (DESIGN §21).

A ``rate`` or ``throttle`` window of a key (:class:`~ojs_kombu.policy.ratelimit.WindowSchedule`:
``capacity`` starts per slot of ``interval`` seconds, slots aligned to the epoch) is a quorum queue
of *start tokens*, ``Names.limit_window_queue(key, kind)``.  A job may start once its process has
taken a token (``Basic.Get`` with ``no_ack``: a token taken is spent, even if its taker dies).

At the start of each slot the refiller (one process: the leader, DESIGN §20) **purges** the queue
and publishes ``capacity`` tokens, each with a per-message TTL that ends with the slot.  So every
token taken in slot ``k`` was published for slot ``k``: at most ``capacity`` starts per slot, and
a slot's unused tokens never carry over (the fixed window of ``ojs-rate-limiting.md`` §5.2).  A
refill that runs late shortens the slot (fewer starts, never more); a refill lost with its leader
skips the slot.  Two refillers that overlap (a leader paused past its lease) purge before they
publish, so a slot gets at most twice its tokens.  The queue has no ``x-max-length``: a changed
rate is a new capacity, not a queue to declare again (and on quorum queues the bound is not exact,
see :mod:`ojs_kombu.amqp.lease`).
Tokens are published without confirms: a token lost is a start less in its slot, never one more.

Tokens expire by the broker's clock; slots are computed from the refiller's and the takers'
clocks: keep them in sync (NTP).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from amqp import Channel
from amqp import Message as WireMessage
from amqp.exceptions import PreconditionFailed

from ojs_kombu.amqp.topology import parse_precondition_failed
from ojs_kombu.model.naming import Names
from ojs_kombu.policy.ratelimit import WindowSchedule


def window_queue_arguments() -> dict[str, Any]:
    """The arguments of a window's token queue (the same for every capacity: see the module).

    Returns:
        A new dict.
    """
    return {"x-queue-type": "quorum"}


class WindowTokens:
    """The token operations of window rates on one py-amqp channel (used by one thread).

    Parameters:
        channel: an open channel, used by this object alone.
        names: the deployment's entity names.
    """

    def __init__(self, channel: Channel, names: Names | None = None) -> None:
        self.channel = channel
        self.names = names or Names()
        self._declared: set[str] = set()

    def declare(self, key: str, schedule: WindowSchedule) -> str:
        """Declare the token queue of ``key``'s window (idempotent).

        Parameters:
            key: the rate limit key.
            schedule: the window.

        Returns:
            The queue's name.

        Raises:
            TopologyConflictError: the queue exists with other arguments (declared by something else).
        """
        queue = self.names.limit_window_queue(key, schedule.kind)
        if queue not in self._declared:
            try:
                self.channel.queue_declare(
                    queue, durable=True, auto_delete=False, exclusive=False, arguments=window_queue_arguments()
                )
            except PreconditionFailed as exc:
                raise parse_precondition_failed(queue, str(exc.reply_text or exc)) from exc
            self._declared.add(queue)
        return queue

    def refill(self, key: str, schedule: WindowSchedule, slot: int, *, now: float | None = None) -> int:
        """Empty the queue and publish slot ``slot``'s tokens, each expiring when the slot ends.

        Parameters:
            key: the rate limit key.
            schedule: the window.
            slot: the slot the tokens are for (the current one).
            now: the Unix time (default: now).

        Returns:
            Tokens published (0 when the slot is over already).
        """
        queue = self.declare(key, schedule)
        now = time.time() if now is None else now
        ttl_ms = int((schedule.end(slot) - now) * 1000)  # rounded down: a token never outlives its slot
        if ttl_ms <= 0:
            return 0
        self.channel.queue_purge(queue)
        body = orjson.dumps({"window": key, "kind": schedule.kind, "slot": slot})
        published = 0
        for _ in range(schedule.capacity):
            self.channel.basic_publish(
                WireMessage(body, content_type="application/json", expiration=str(ttl_ms)),
                exchange="",
                routing_key=queue,
            )
            published += 1
        return published

    def take(self, key: str, schedule: WindowSchedule) -> int | None:
        """Take (spend) one start token of ``key``'s window, without waiting.

        Parameters:
            key: the rate limit key.
            schedule: the window.

        Returns:
            The slot the token was published for, or None when this slot's tokens are spent.
        """
        queue = self.declare(key, schedule)
        message = self.channel.basic_get(queue, no_ack=True)
        if message is None:
            return None
        try:
            slot = orjson.loads(message.body).get("slot")
        except (orjson.JSONDecodeError, AttributeError):
            return -1
        return slot if type(slot) is int else -1

    def acquire(self, key: str, schedule: WindowSchedule, timeout: float | None = None) -> int | None:
        """Take a start token of ``key``'s window, waiting for the next slots up to ``timeout`` seconds.

        When the slot's tokens are spent it sleeps until the next slot starts, then polls every
        :data:`REFILL_POLL` seconds for :data:`REFILL_WAIT` seconds (the refill is on its way).

        Parameters:
            key: the rate limit key.
            schedule: the window.
            timeout: seconds to wait at most (``None``: forever; ``0``: one try).

        Returns:
            The slot of the token taken, or None when none came in time.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            slot = self.take(key, schedule)
            if slot is not None:
                return slot
            now = time.time()
            into_slot = now - schedule.start(schedule.slot(now))
            pause = REFILL_POLL if into_slot < REFILL_WAIT else schedule.until_next(now) + REFILL_POLL / 2
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                pause = min(pause, left)
            time.sleep(pause)


REFILL_POLL = 0.01
"""Seconds between two takes while a slot's refill is expected (see :meth:`WindowTokens.acquire`)."""
REFILL_WAIT = 0.25
"""Seconds into a slot during which an empty queue is polled, not slept through: the refill may be late."""

__all__ = ["REFILL_POLL", "REFILL_WAIT", "WindowTokens", "window_queue_arguments"]
