"""Scheduled jobs through a binary TTL cascade (DESIGN §6; binding §9.1.1).

A job whose ``scheduled_at`` lies ``d`` milliseconds ahead is published to the
top level of a cascade of ``LEVELS`` topic exchanges and queues shared by all
job queues of a deployment:

* level ``k`` has a queue ``ojs.schedule.{k:02d}`` whose messages live exactly
  ``2**k`` ms (``x-message-ttl``), then dead-letter into the exchange of level
  ``k-1`` (level 0 into the delivery exchange ``ojs.exchange.schedule``);
* the routing key is the delay in binary, one word per level, most significant
  first, followed by the OJS queue name: ``0.….1.0.1.email``;
* at each level the word for that level routes the message into the level's
  queue (bit 1: wait ``2**k`` ms) or straight on to the next exchange (bit 0);
* the delivery exchange binds each job queue ``ojs.queue.{q}`` with exactly one
  ``*`` per bit word followed by ``{q}``, so ``a.b`` never receives ``x.a.b``'s
  jobs (``#.{q}`` would).

Every queue of a level holds messages of one TTL, so head-of-queue expiry is
exact.  With a 1 ms quantum and 35 levels the range is ``2**35 - 1`` ms (397
days).  Delays are rounded *up* to whole milliseconds (never early; kombu's
``int(countdown)`` truncation delivers up to 1 s early) and the worker re-delays
any job that still arrives before its time (clock skew, foreign producers).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from .envelope import utcnow
from .errors import ValidationError
from .naming import Names
from .topology import BindingSpec, ExchangeSpec, QueueSpec, Spec

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


def routing_key(delay_ms: int, queue: str, levels: int = LEVELS) -> str:
    """The cascade routing key: ``levels`` bit words (most significant first), then ``queue``."""
    check_delay(delay_ms)
    bits = format(delay_ms, f"0{levels}b")
    return ".".join(bits) + "." + queue


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
        """Where a job delayed ``delay_ms`` (> 0) enters: the exchange of its highest set bit.

        The levels above it would only pass the job on (their bits are 0), and
        each hop costs the broker a topic match of the whole routing key, the
        dearest at the top levels: entering here is the same route, ~7x cheaper
        for delays of seconds than entering at :attr:`top_exchange`.
        """
        return self.exchange(max(1, delay_ms).bit_length() - 1)

    def exchange(self, level: int) -> str:
        """The topic exchange of ``level``."""
        return self.names.schedule_exchange(level)

    def queue(self, level: int) -> str:
        """The TTL queue of ``level``."""
        return self.names.schedule_queue(level)

    def specs(self) -> list[Spec]:
        """Every exchange, queue and binding of the cascade, in declaration order."""
        n = self.levels
        specs: list[Spec] = [ExchangeSpec(self.delivery_exchange, "topic")]
        specs += [ExchangeSpec(self.exchange(k), "topic") for k in range(n)]
        for k in range(n):
            dead_letter_to = self.exchange(k - 1) if k else self.delivery_exchange
            specs.append(QueueSpec(self.queue(k), (
                ("x-dead-letter-exchange", dead_letter_to),
                ("x-message-ttl", 2**k * QUANTUM_MS),
            )))
        for k in range(n):
            skip = "*." * (n - 1 - k)
            specs.append(BindingSpec(self.queue(k), self.exchange(k), skip + "1.#"))
            next_hop = self.exchange(k - 1) if k else self.delivery_exchange
            specs.append(BindingSpec(next_hop, self.exchange(k), skip + "0.#", to_exchange=True))
        return specs

    def queue_binding(self, queue: str) -> BindingSpec:
        """The binding that delivers ``queue``'s scheduled jobs into ``ojs.queue.{queue}``."""
        return BindingSpec(self.names.job_queue(queue), self.delivery_exchange, "*." * self.levels + queue)


__all__ = ["Cascade", "LEVELS", "MAX_DELAY_MS", "QUANTUM_MS", "check_delay", "delay_ms_until", "routing_key"]
