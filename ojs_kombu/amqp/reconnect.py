"""One reconnect primitive: how long to keep trying a broker, and one rule for refusals that are final.

Every loop that (re)connects to the broker asks a :class:`Reconnector` what to do
after a failure, as kombu's ``Connection.ensure`` serves kombu (DESIGN §9, §22):

* the **node** to try next and the **back-off** come from the
  :class:`~ojs_kombu.amqp.failover.Failover` (every node back to back, then
  ``min(2^(n-1), 60)`` s ±25 % once a full rotation failed);
* **how long** to keep going is the policy's:

  - :class:`Budgeted` — a time budget counted from the first failure (and
    optionally a number of reconnections), each connection attempt capped by
    what is left of it: the :class:`~ojs_kombu.client.Client`'s ``publish_timeout``;
  - :class:`Forever` — long-running loops (a consumer, a worker's beacon, the cron
    scheduler and its leader lease, the window refiller, the completed-ids log)
    that ride out any outage;
  - :class:`OnePass` — each node of the failover list once, back to back, no back-off:
    a call that must fail fast, but not because one node is down (the connection of
    :class:`~ojs_kombu.amqp.permits.Permits`, which a job's ``acquire`` opens);

* **one rule for permanent errors**, whatever the policy: a refusal that the
  same request meets again (403 ACCESS_REFUSED, 530 NOT_ALLOWED, a failed TLS
  verification, a 404 where the entity must exist: :func:`~ojs_kombu.amqp.errors.is_permanent`)
  is raised at once as its typed :class:`~ojs_kombu.errors.BrokerRefusedError`; any other
  404 NOT_FOUND is retried once (re-declaring the topology cures a deleted
  exchange) and raised as :class:`~ojs_kombu.errors.NotFoundError` if it comes back
  on the next attempt.  Nothing permanent is retried forever;
* **a queue the broker cannot serve**: a ``Basic.Consume`` that keeps closing the connection
  with 541 INTERNAL_ERROR, or a publish with 506 "Stream not found"
  (:func:`~ojs_kombu.amqp.errors.unserved_queue`: a stream or quorum queue whose member the
  broker lost in a crash) is retried like any loss while its member may be recovering, and raised as :class:`~ojs_kombu.errors.QueueUnavailableError` once the same
  queue failed for :data:`UNSERVED_AFTER` seconds: the broker serves everything else, so only
  an operator (deleting and re-declaring it) can cure it.

Why not kombu's ``retry_over_time`` / ``Connection.ensure``: they catch by type only
(py-amqp's ``NotAllowed``, a 530, is one of kombu's ``connection_errors``, so a
missing vhost is retried for ever), their interval grows linearly without jitter
and knows no failover rotation, their ``timeout`` counts from the first call, is
only checked before sleeping and does not cap the connection attempt itself, and
they sleep in whole seconds that a stopping thread cannot interrupt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from amqp.exceptions import NotFound

from ojs_kombu.amqp.errors import connection_error, map_exception, raise_if_permanent, unserved_queue
from ojs_kombu.amqp.failover import Failover
from ojs_kombu.amqp.urls import safe_url
from ojs_kombu.errors import NotFoundError, QueueUnavailableError, ValidationError
from ojs_kombu.observability.metrics import METRICS

logger = logging.getLogger(__name__)

#: The shortest connection attempt a budget allows, when it is nearly spent.
MIN_ATTEMPT_TIMEOUT = 0.05

#: Seconds a queue may fail every consumer or publish (:func:`~ojs_kombu.amqp.errors.unserved_queue`)
#: before :meth:`Reconnector.failed` raises :class:`~ojs_kombu.errors.QueueUnavailableError`:
#: well beyond a member's recovery after a restart (seconds), short of sitting stuck for ever.
UNSERVED_AFTER = 120.0

#: The warning :meth:`Reconnector.failed` logs; its fields: ``name``, ``failed`` (the node that
#: failed), ``error``, ``next`` (the node tried next), ``delay`` (seconds) and ``note``.
RETRY_MESSAGE = "%(name)s to %(failed)s failed (%(error)s); retrying on %(next)s in %(delay).1fs%(note)s"


class ReconnectPolicy(Protocol):
    """How long a :class:`Reconnector` keeps trying (pure: no I/O, no clock of its own)."""

    def next_delay(self, proposed: float, failures: int, elapsed: float) -> float | None:
        """Seconds to wait before the next attempt, or None to give up.

        Parameters:
            proposed: the failover's wait (0 within a rotation, the §9 back-off after one).
            failures: failed attempts so far, this one included (>= 1).
            elapsed: seconds since the first failure.
        """
        ...

    def attempt_timeout(self, elapsed: float | None, connect_timeout: float) -> float | None:
        """Seconds the next connection attempt may take (None: the connection's own timeout).

        Parameters:
            elapsed: seconds since the first failure, None before any.
            connect_timeout: the connection's own connect timeout.
        """
        ...


@dataclass(frozen=True)
class Budgeted:
    """Keep trying for ``seconds`` after the first failure (and ``retries`` reconnections at most).

    Parameters:
        seconds: the time budget (> 0), or None for no time limit.
        retries: failed reconnections allowed after the first failure, or None for no limit.

    Raises:
        ValidationError: ``seconds`` <= 0 or ``retries`` < 0.
    """

    seconds: float | None
    retries: int | None = None

    def __post_init__(self) -> None:
        if self.seconds is not None and not self.seconds > 0:
            raise ValidationError(f"a reconnect budget must be > 0 seconds or None, got {self.seconds!r}")
        if self.retries is not None and self.retries < 0:
            raise ValidationError(f"reconnect retries must be >= 0 or None, got {self.retries!r}")

    def next_delay(self, proposed: float, failures: int, elapsed: float) -> float | None:
        """The failover's wait cut short at the budget; None once it or ``retries`` is spent."""
        if self.retries is not None and failures > self.retries:
            return None
        if self.seconds is None:
            return proposed
        remaining = self.seconds - elapsed
        return min(proposed, remaining) if remaining > 0 else None

    def attempt_timeout(self, elapsed: float | None, connect_timeout: float) -> float | None:
        """What is left of the budget, at most ``connect_timeout`` (at least :data:`MIN_ATTEMPT_TIMEOUT`)."""
        if self.seconds is None:
            return None
        return max(MIN_ATTEMPT_TIMEOUT, min(self.seconds - (elapsed or 0.0), float(connect_timeout)))


@dataclass(frozen=True)
class Forever:
    """Keep trying as long as the failures are transient, with the failover's back-off."""

    def next_delay(self, proposed: float, failures: int, elapsed: float) -> float:
        """Always the failover's wait."""
        return proposed

    def attempt_timeout(self, elapsed: float | None, connect_timeout: float) -> None:
        """The connection's own timeout."""
        return None


@dataclass(frozen=True)
class OnePass:
    """Try each of ``nodes`` nodes once, back to back; give up when every one failed.

    Parameters:
        nodes: how many nodes the failover list has (``len(failover.urls)``).

    Raises:
        ValidationError: ``nodes`` < 1.
    """

    nodes: int

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValidationError(f"a pass needs at least one node, got {self.nodes!r}")

    def next_delay(self, proposed: float, failures: int, elapsed: float) -> float | None:
        """0 while a node is left untried, else None."""
        return 0.0 if failures < self.nodes else None

    def attempt_timeout(self, elapsed: float | None, connect_timeout: float) -> None:
        """The connection's own timeout."""
        return None


class Reconnector:
    """The failures of one operation (or one connection loop) under a :class:`ReconnectPolicy`.

    The caller makes an attempt (with :meth:`attempt_timeout`), calls :meth:`connecting`
    before it connects and :meth:`succeeded` once connected; on a failure it calls
    :meth:`failed`, which raises or returns the seconds to wait before the next attempt.
    Not thread-safe: one per loop (the :class:`Failover` it reports to is shared).

    Parameters:
        policy: how long to keep trying.
        failover: the nodes and their back-off.
        url: the broker URL(s), for messages (password masked).
        name: what reconnects, for the log (``"worker beacon"``).
        must_exist: the operation reads an entity that must exist: a 404 is final at once.
        message: the warning logged for each retry (the fields of :data:`RETRY_MESSAGE`).
        clock: monotonic seconds (tests pin it).
    """

    def __init__(
        self,
        policy: ReconnectPolicy,
        failover: Failover,
        *,
        url: str,
        name: str = "connection",
        must_exist: bool = False,
        message: str = RETRY_MESSAGE,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.policy = policy
        self.failover = failover
        self.url = url
        self.name = name
        self.must_exist = must_exist
        self.message = message
        self._clock = clock
        self.failures = 0
        self._failing_since: float | None = None
        self._connecting_since: float | None = None
        self._not_found = False  # the last failure was a 404 (retried once)
        self._unserved: dict[str, float] = {}  # queue -> when it first refused a consumer (QueueNotServed)

    @property
    def elapsed(self) -> float | None:
        """Seconds since the first failure, None before any."""
        return None if self._failing_since is None else self._clock() - self._failing_since

    def attempt_timeout(self, connect_timeout: float) -> float | None:
        """Seconds the next connection attempt may take (see :meth:`ReconnectPolicy.attempt_timeout`)."""
        return self.policy.attempt_timeout(self.elapsed, connect_timeout)

    def connecting(self) -> None:
        """A connection attempt starts now: a budget counts from the start of the first that fails."""
        self._connecting_since = self._clock()

    def succeeded(self) -> None:
        """Connected: the failover starts a fresh rotation (the failures of this run still count)."""
        self._connecting_since = None
        self.failover.succeeded()

    def reset(self) -> None:
        """Forget the failures (a long-running loop whose connection worked again)."""
        self.failures = 0
        self._failing_since = None
        self._not_found = False
        self._unserved.clear()

    def failed(self, exc: BaseException, conn: Any, *, note: str = "") -> float:
        """``exc`` ended the attempt on ``conn``: move to the next node and say how long to wait.

        The caller waits (or notes a time not to connect before, for a loop that keeps
        serving meanwhile): the Reconnector never sleeps.

        Parameters:
            exc: the error (raw py-amqp / kombu, or already an ``OjsError``).
            conn: the kombu connection that failed (made by the failover).
            note: appended to the logged warning (e.g. what the loss leaves unsettled).

        Returns:
            Seconds to wait before the next attempt.

        Raises:
            BrokerRefusedError: ``exc`` is permanent (the one rule: see the module docstring).
            QueueUnavailableError: ``exc`` names a queue the broker cannot serve
                (:func:`~ojs_kombu.amqp.errors.unserved_queue`) and it has failed for
                :data:`UNSERVED_AFTER` seconds (the failures in between not reset).
            BrokerConnectionError: the policy gives up.
        """
        raise_if_permanent(exc, url=self.url, must_exist=self.must_exist)
        if (entity := unserved_queue(exc)) is not None:
            self._raise_if_unserved_too_long(entity, exc)
        if isinstance(exc, NotFound):
            if self._not_found:
                mapped = map_exception(exc, url=self.url, must_exist=True)
                assert isinstance(mapped, NotFoundError)
                raise mapped from exc
            self._not_found = True
        else:
            self._not_found = False
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = self._connecting_since if self._connecting_since is not None else now
        self._connecting_since = None
        self.failures += 1
        elapsed = now - self._failing_since
        failed_url = safe_url(self.failover.current)
        delay = self.policy.next_delay(self.failover.failed(conn), self.failures, elapsed)
        if delay is None:
            raise connection_error(self.url, exc, self.failures, elapsed) from exc
        logger.warning(
            self.message,
            {
                "name": self.name,
                "failed": failed_url,
                "error": exc,
                "next": safe_url(self.failover.current),
                "delay": delay,
                "note": note,
            },
        )
        METRICS.reconnected()
        return delay

    def _raise_if_unserved_too_long(self, entity: str, exc: BaseException) -> None:
        now = self._clock()
        seconds = now - self._unserved.setdefault(entity, now)
        if seconds < UNSERVED_AFTER:
            return
        code = int(getattr(exc, "reply_code", 0) or 0)
        text = str(getattr(exc, "reply_text", "") or exc)
        raise QueueUnavailableError(
            f"the broker at {safe_url(self.url)} lists queue {entity!r} but has failed every use of it "
            f"for {seconds:.0f}s ({code} {text}). If every node of the cluster is up, it is a stream or "
            "quorum queue whose member the broker lost (declared shortly before its node crashed): its "
            f"messages are gone; delete it (rabbitmqctl delete_queue {entity}) and start the worker again, "
            "which declares it anew. Otherwise start the missing nodes first",
            entity=entity,
            seconds=seconds,
            reply_code=code,
            reply_text=text,
        ) from exc


__all__ = [
    "MIN_ATTEMPT_TIMEOUT",
    "RETRY_MESSAGE",
    "UNSERVED_AFTER",
    "Budgeted",
    "Forever",
    "OnePass",
    "ReconnectPolicy",
    "Reconnector",
]
