"""Leader election for cron schedulers on RabbitMQ alone (``ojs-cron.md`` §7, DESIGN §20).

Every scheduler instance runs a :class:`LeaderLease`: a thread with a connection of its own
that consumes the lease queue ``ojs.queue.cron.leader`` (:mod:`ojs_kombu.amqp.lease`: a quorum
queue with a single active consumer, holding one token that is never acknowledged).  The
instance the broker delivers the token to is the leader; when its connection dies (a crash,
SIGKILL, a closed or timed-out connection) the broker returns the token to the queue and
delivers it to the next consumer: failover needs no timer of ours (CRON-21, CRON-22).

**A leader knows when it stops being one.**  It renews its claim (CRON-23) with a round trip
to the broker every ``renew_interval`` seconds, each bounded by ``renew_timeout``.
:attr:`LeaderLease.is_leader` is true only while the token is held *and* the last round trip
was sent at most ``lease_ttl = renew_interval + renew_timeout`` seconds ago, so it turns false by
itself, even when the lease's thread is stuck or the process was paused.  What the leader
observes, and when:

* its connection closed, reset, or closed by the broker (``Connection.Close``), its channel
  closed, or its consumer cancelled (``Basic.Cancel``: a consumer timeout, the queue deleted):
  at the next read, within ``renew_interval``;
* a silent broker or network (no answer at all): when a round trip is not answered,
  at most ``lease_ttl`` after the last answered one.

The broker hands the token on only after it finds the leader's connection dead: at once when
the socket closes (a killed process, a closed connection), else when it has heard nothing for
two to three AMQP heartbeats (``heartbeat``, :data:`DEFAULT_LEASE_HEARTBEAT` = 10 s).  Since
``lease_ttl`` must be at most half the heartbeat, a leader cut off silently has stopped before
anyone else can be handed the token (measured: stopped after 1.0 s, token handed on after 16.5 s,
with a 6 s heartbeat and a 1.5 s ttl).  Two overlaps remain: when
the broker closes the leader's connection (or cancels its consumer) it delivers the token to the
next instance at the same moment, and the old leader reads the news milliseconds later (1.3 ms
after the new one was elected, in one run); and a process paused *between* checking
:attr:`~LeaderLease.is_leader` and acting on it.  The tick's job id, derived from (cron name,
scheduled time) and guarded by a unique lock (DESIGN §20), covers both.

Failover time: the next consumer is delivered the token as soon as the broker closes the
old leader's connection: within tens of milliseconds after a SIGKILL or a closed connection
(figures in ``docs/periodic-jobs.md``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ojs_kombu.amqp.connection import close_quietly, resolve_url, safe_url
from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.failover import Failover
from ojs_kombu.amqp.lease import LeaseChannel
from ojs_kombu.amqp.reconnect import Forever, Reconnector
from ojs_kombu.errors import BrokerRefusedError, OjsError, TopologyError, ValidationError
from ojs_kombu.model.naming import Names

logger = logging.getLogger(__name__)

DEFAULT_LEASE_HEARTBEAT = 10.0
"""AMQP heartbeat of a lease's connection, in seconds: RabbitMQ closes a silent connection 2–3
heartbeats after it went quiet (16.5 s measured with 6 s), and only then hands the token on, so
10 s keeps failover after a silent partition within the spec's 30 s (CRON-S05).  The library's
other connections keep :data:`~ojs_kombu.amqp.connection.DEFAULT_HEARTBEAT`."""
DEFAULT_RENEW_INTERVAL = 1.0
"""Seconds between two renewals (round trips) of a lease."""
DEFAULT_RENEW_TIMEOUT = 4.0
"""Seconds a renewal waits for the broker's answer before the lease is dropped."""


class _LeaseCancelled(OjsError):
    """The broker cancelled the lease consumer (a consumer timeout, the queue deleted): subscribe again."""


class LeaderLease:
    """One scheduler instance's claim on the cron leadership (see the module).

    Parameters:
        url: the broker URL (or a failover list); default ``$OJS_AMQP_URL``, then the local broker.
        names: the deployment's entity names (its prefix).
        heartbeat: AMQP heartbeat of the lease's connection in seconds (default 10); at least
            ``2 × (renew_interval + renew_timeout)``.
        renew_interval: seconds between renewals.
        renew_timeout: seconds a renewal may take.
        ssl, transport_options: as for :class:`~ojs_kombu.client.Client`.
        connection_name: the connection's name in the management UI.
        on_elected: called in the lease's thread when this instance becomes the leader.
        on_lost: called when it stops being the leader, with the reason (in the lease's thread,
            or in the thread that calls :meth:`stop`).  :attr:`is_leader` may turn false earlier,
            by itself, when a renewal is overdue.

    Raises:
        ValidationError: a heartbeat of 0 or shorter than twice the lease's time to live, a
            non-positive interval or timeout, a bad URL or ``ssl`` option.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        names: Names | None = None,
        heartbeat: float = DEFAULT_LEASE_HEARTBEAT,
        renew_interval: float = DEFAULT_RENEW_INTERVAL,
        renew_timeout: float = DEFAULT_RENEW_TIMEOUT,
        ssl: Any = None,
        transport_options: dict[str, Any] | None = None,
        connection_name: str = "ojs-cron-leader",
        on_elected: Callable[[], None] | None = None,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        if renew_interval <= 0 or renew_timeout <= 0:
            raise ValidationError("renew_interval and renew_timeout must be positive", field="renew_interval")
        self.lease_ttl = renew_interval + renew_timeout
        if not heartbeat or heartbeat < 2 * self.lease_ttl:
            raise ValidationError(
                f"heartbeat={heartbeat!r}: the lease needs an AMQP heartbeat of at least 2 × (renew_interval + "
                f"renew_timeout) = {2 * self.lease_ttl:g} s, so that a leader cut off from the broker stops "
                "before the broker hands its token to another instance",
                field="heartbeat",
            )
        self.url = resolve_url(url)
        self.names = names or Names()
        self.queue = self.names.cron_leader_queue
        self.heartbeat = heartbeat
        self.renew_interval = renew_interval
        self.renew_timeout = renew_timeout
        self._on_elected = on_elected
        self._on_lost = on_lost
        self._failover = Failover(
            self.url,
            heartbeat=heartbeat,
            ssl=ssl,
            transport_options=transport_options,
            connection_name=connection_name,
        )
        self._connection = self._failover.connection()
        # Transient failures are retried as long as the lease runs; a permanent refusal stops it.
        self._reconnect = Reconnector(Forever(), self._failover, url=self.url, name="cron leader lease")
        self._lease: LeaseChannel | None = None
        self._holding = False
        self._confirmed = 0.0
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: OjsError | None = None
        """The permanent error that stopped the lease (access refused, an inequivalent queue), or None."""
        self.elections = 0
        """How many times this instance became the leader."""
        self.seeded = False
        """Whether a token this instance published was accepted."""

    # -- the public side --------------------------------------------------------------------------

    @property
    def subscribed(self) -> bool:
        """Whether the lease is connected and subscribed to the lease queue (as the leader or waiting)."""
        return self._lease is not None

    @property
    def is_leader(self) -> bool:
        """Whether this instance is the leader now: it holds the token and renewed within ``lease_ttl``."""
        return self._holding and time.monotonic() - self._confirmed <= self.lease_ttl

    def start(self) -> LeaderLease:
        """Start the lease's thread (connect, seed, consume); idempotent.

        Returns:
            self.
        """
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"ojs-leader-lease-{self.queue}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Give the leadership up and disconnect: the broker hands the token to the next instance at once.

        Parameters:
            timeout: seconds to wait for the thread (it notices within ``renew_interval``).
        """
        self._stopping.set()
        self._set_holding(False, "stopped")
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_until_leader(self, timeout: float | None = None) -> bool:
        """Block until this instance is the leader.

        Parameters:
            timeout: seconds to wait at most (``None``: forever).

        Returns:
            Whether it is the leader.

        Raises:
            OjsError: the lease stopped on a permanent error (:attr:`error`).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self.is_leader:
                if self.error is not None:
                    raise self.error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 0.5) if remaining is not None else 0.5)
        return True

    def __enter__(self) -> LeaderLease:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the lease's thread ------------------------------------------------------------------------

    def _set_holding(self, holding: bool, reason: str = "") -> None:
        with self._changed:
            was = self._holding
            self._holding = holding
            if holding:
                self._confirmed = time.monotonic()
            self._changed.notify_all()
        if holding and not was:
            self.elections += 1
            logger.info("cron leader: elected (%s)", self.queue)
            if self._on_elected is not None:
                self._on_elected()
        elif was and not holding:
            logger.warning("cron leader: leadership lost (%s)", reason)
            if self._on_lost is not None:
                self._on_lost(reason)

    def _run(self) -> None:
        errors = (
            OjsError,
            TimeoutError,
            OSError,
            *self._connection.connection_errors,
            *self._connection.channel_errors,
        )
        while not self._stopping.is_set():
            try:
                try:
                    self._connect()
                    self._serve()
                except TopologyError:
                    raise  # the lease queue exists with other arguments: permanent, like a refusal
                except errors as exc:
                    self._set_holding(False, f"{type(exc).__name__}: {exc}")
                    self._disconnect(graceful=False)
                    self._stopping.wait(self._reconnect.failed(exc, self._connection))
            except (BrokerRefusedError, TopologyError) as exc:
                self.error = exc
                self._set_holding(False, str(exc))
                logger.error("cron leader lease stopped: %s", exc)
                self._disconnect(graceful=False)
                return
        self._disconnect(graceful=True)

    def _connect(self) -> None:
        with map_exceptions(url=self.url):
            self._reconnect.connecting()
            self._failover.connect(self._connection)
            channel = self._connection.connection.channel()
            lease = LeaseChannel(
                channel,
                self.queue,
                on_token=lambda: self._set_holding(True),
                on_cancel=lambda: self._set_holding(False, "the broker cancelled the lease consumer"),
            )
            self.seeded = lease.seed() or self.seeded
            lease.consume()
            self._lease = lease
        self._reconnect.succeeded()
        self._reconnect.reset()
        logger.info("cron leader lease: waiting for the token on %s (%s)", self.queue, safe_url(self._failover.current))

    def _serve(self) -> None:
        connection = self._connection.connection
        lease = self._lease
        assert lease is not None
        next_renewal = time.monotonic() + self.renew_interval
        with map_exceptions(url=self.url):
            while not self._stopping.is_set():
                try:
                    connection.drain_events(timeout=max(0.0, next_renewal - time.monotonic()))
                except TimeoutError:
                    pass
                if lease.cancelled:
                    raise _LeaseCancelled(f"the broker cancelled the consumer of {self.queue}")
                if time.monotonic() < next_renewal:
                    continue
                sent = time.monotonic()
                lease.renew(self.renew_timeout)
                connection.heartbeat_tick()
                if lease.holds_token:
                    with self._changed:
                        self._confirmed = sent
                next_renewal = sent + self.renew_interval

    def _disconnect(self, *, graceful: bool) -> None:
        lease, self._lease = self._lease, None
        try:
            if graceful:
                if lease is not None:
                    close_quietly(lease.channel)
                self._connection.release()
            else:
                self._connection.collect()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass

    @property
    def surplus_tokens_removed(self) -> int:
        """Surplus tokens this instance acknowledged while leader (seeders racing each other)."""
        return 0 if self._lease is None else self._lease.surplus_acked


__all__ = ["DEFAULT_RENEW_INTERVAL", "DEFAULT_RENEW_TIMEOUT", "LeaderLease"]
