"""Scheduled jobs through a binary TTL cascade (DESIGN §6; binding §9.1.1).

A job whose ``scheduled_at`` lies ``d`` milliseconds ahead waits in a cascade of
``LEVELS`` queues shared by all job queues of a deployment:

* level ``k`` has a queue ``ojs.schedule.{k:02d}`` whose messages live exactly
  ``2**k`` ms (``x-message-ttl``), then dead-letter into the exchange of level
  ``k-1`` (level 0 into the delivery exchange ``ojs.exchange.schedule``);
* the delay's set bits travel with the message as routing keys: it is
  published with routing key ``{queue}`` and a ``BCC`` header listing one key
  ``bit:{k:02d}`` per set bit ``k`` (RabbitMQ routes on BCC keys, strips the
  header, and keeps the keys through every dead-lettering);
* the exchange of level ``k`` is a *direct* exchange binding only ``bit:{k:02d}``
  to its queue, with the exchange of level ``k-1`` as its ``alternate-exchange``:
  a message whose bit ``k`` is set waits ``2**k`` ms, any other message falls
  through to the next level at once;
* the delivery exchange binds each job queue ``ojs.queue.{q}`` with key ``{q}``
  (an exact match: ``a.b`` never receives ``x.a.b``'s jobs).  A bit key can
  never equal a queue name: ``:`` is not allowed in queue names.

A job enters at the exchange of its delay's highest set bit, so it passes only
the levels below.  DESIGN §6 put the bits *into* a topic routing key instead
(``0.….1.0.1.{q}``, matched by ``*`` patterns); that costs RabbitMQ 3.10 about
0.18 ms of CPU per exchange per job for a 36-word key, about 5 ms per job for
delays of seconds, and a burst of 2,000 scheduled jobs then ran ~0.5 s late.
Direct matching makes it about 1.9 ms per job for a 13-hop delay
(``benchmarks/schedule.py`` prints the figures).

Every queue of a level holds messages of one TTL, so head-of-queue expiry is
exact.  With a 1 ms quantum and 35 levels the range is ``2**35 - 1`` ms (397
days).  Delays are rounded *up* to whole milliseconds (never early; kombu's
``int(countdown)`` truncation delivers up to 1 s early) and the worker re-delays
any job that still arrives before its time (clock skew, foreign producers).
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.naming import Names
from ojs_kombu.model.timefmt import utcnow
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.entities import BindingSpec, ExchangeSpec, QueueSpec, QueueType, Spec, queue_type_arguments

QUANTUM_MS = 1
LEVELS = 35
#: The longest delay the cascade carries: 2**35 - 1 ms, about 397.7 days (DESIGN asks >= 365).
MAX_DELAY_MS = 2**LEVELS - 1


def delay_ms_until(when: datetime, now: datetime | None = None) -> int:
    """Milliseconds from ``now`` until ``when``, rounded up; 0 if ``when`` has passed."""
    seconds = (when - (now or utcnow())).total_seconds()
    return max(0, math.ceil(seconds * 1000 - 1e-6))


def check_delay(delay_ms: int) -> int:
    """Return ``delay_ms`` if the cascade can carry it; raise ValidationError otherwise."""
    if delay_ms > MAX_DELAY_MS:
        raise ValidationError(
            f"scheduled_at is {timedelta(milliseconds=delay_ms)} ahead; the scheduler's range is "
            f"{timedelta(milliseconds=MAX_DELAY_MS)}",
            field="scheduled_at",
        )
    return delay_ms


def bit_key(level: int) -> str:
    """The routing key that makes level ``level`` hold a message: ``bit:07``."""
    return f"bit:{level:02d}"


def bit_keys(delay_ms: int) -> list[str]:
    """The ``BCC`` routing keys of a ``delay_ms`` delay: one per set bit, highest first."""
    check_delay(delay_ms)
    return [bit_key(k) for k in range(delay_ms.bit_length() - 1, -1, -1) if delay_ms >> k & 1]


class Cascade:
    """The entities of the scheduling cascade of one deployment (one prefix)."""

    def __init__(self, names: Names, levels: int = LEVELS):
        self.names = names
        self.levels = levels

    @property
    def top_exchange(self) -> str:
        """The exchange scheduled jobs are published to: the highest level's."""
        return self.exchange(self.levels - 1)

    @property
    def delivery_exchange(self) -> str:
        """The exchange the last level dead-letters into; job queues are bound to it."""
        return self.names.schedule_delivery_exchange

    def entry_exchange(self, delay_ms: int) -> str:
        """Where a job delayed ``delay_ms`` (> 0) enters: the exchange of its highest set bit
        (the levels above it would only pass the job on)."""
        return self.exchange(max(1, delay_ms).bit_length() - 1)

    def route(self, message: OutgoingMessage, delay_ms: int, queue: str) -> tuple[OutgoingMessage, str, str]:
        """``(message, exchange, routing_key)`` that deliver ``message`` to job queue ``queue``
        ``delay_ms`` (> 0) milliseconds after its publish; the returned message carries the
        delay's bits in its ``BCC`` header.  Raises ValidationError beyond the range."""
        headers = {**message.headers, "BCC": bit_keys(delay_ms)}
        return replace(message, headers=headers), self.entry_exchange(delay_ms), queue

    def destination(
        self, message: OutgoingMessage, when: datetime, queue: str, now: datetime | None = None
    ) -> tuple[OutgoingMessage, str, str]:
        """``(message, exchange, routing_key)`` that deliver ``message`` to job queue ``queue`` at
        ``when`` if it is published ``now``: through the cascade for the delay left, or straight
        to the queue (the direct exchange) once ``when`` has come.

        The delay runs from the publish: ask for this as the last thing before it, after
        whatever can wait (declarations, a channel's set-up), or the job is late by that wait
        (:meth:`ConfirmedPublisher.publish_when_ready
        <ojs_kombu.amqp.publisher.ConfirmedPublisher.publish_when_ready>` does).

        Parameters:
            message: the job's message.
            when: its ``scheduled_at`` as an aware datetime.
            queue: its OJS queue.
            now: the current time (default: now, UTC).

        Returns:
            The message (with the delay's ``BCC`` keys when it enters the cascade), exchange, routing key.

        Raises:
            ValidationError: the delay is beyond the cascade's range.
        """
        delay_ms = delay_ms_until(when, now)
        if delay_ms > 0:
            return self.route(message, delay_ms, queue)
        return message, self.names.direct_exchange, queue

    def exchange(self, level: int) -> str:
        """The direct exchange of ``level``."""
        return self.names.schedule_exchange(level)

    def queue(self, level: int) -> str:
        """The TTL queue of ``level``."""
        return self.names.schedule_queue(level)

    def specs(self, queue_type: QueueType | None = None) -> list[Spec]:
        """Every exchange, queue and binding of the cascade, in declaration order.

        Parameters:
            queue_type: the type of the level queues; ``"quorum"`` adds
                :data:`~ojs_kombu.wire.entities.QUORUM_ARGUMENTS` (at-least-once hops).
        """
        n = self.levels
        specs: list[Spec] = [ExchangeSpec(self.delivery_exchange)]
        specs += [
            ExchangeSpec(self.exchange(k), arguments=(("alternate-exchange", self._next_hop(k)),)) for k in range(n)
        ]
        specs += [QueueSpec(self.queue(k), self.level_arguments(k, queue_type)) for k in range(n)]
        specs += [BindingSpec(self.queue(k), self.exchange(k), bit_key(k)) for k in range(n)]
        return specs

    def level_arguments(self, level: int, queue_type: QueueType | None = None) -> tuple[tuple[str, Any], ...]:
        """The arguments of the queue of ``level`` (sorted pairs, as a :class:`QueueSpec` holds them)."""
        args = {"x-dead-letter-exchange": self._next_hop(level), "x-message-ttl": 2**level * QUANTUM_MS}
        args.update(queue_type_arguments(queue_type))
        return tuple(sorted(args.items()))

    def is_level_queue(self, name: str) -> bool:
        """Whether ``name`` is the queue of one of the cascade's levels."""
        return any(name == self.queue(k) for k in range(self.levels))

    def _next_hop(self, level: int) -> str:
        return self.exchange(level - 1) if level else self.delivery_exchange

    def queue_binding(self, queue: str) -> BindingSpec:
        """The binding that delivers ``queue``'s scheduled jobs into ``ojs.queue.{queue}``."""
        return BindingSpec(self.names.job_queue(queue), self.delivery_exchange, queue)


__all__ = ["Cascade", "LEVELS", "MAX_DELAY_MS", "QUANTUM_MS", "bit_key", "bit_keys", "check_delay", "delay_ms_until"]
