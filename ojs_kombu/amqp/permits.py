"""Concurrency permits across processes and machines, on RabbitMQ alone (DESIGN §21, ``ojs-rate-limiting.md`` §5.1).

A concurrency limit of N for a key is N *permit tokens* in a quorum queue
(``Names.limit_permit_queue``).  Token ``i`` (0 ≤ i < N) is a message whose body names its
index.  A process takes a permit by receiving one token and keeping it **unacknowledged** while
the job runs; it gives it back by returning the token to the queue; a process that dies (SIGKILL,
a lost connection) gives it back through the broker, which requeues the unacknowledged
deliveries of a closed connection.

**At most one holder per index, enforced by the broker.**  Tokens can be duplicated: seeding
by several processes at once (RabbitMQ's ``x-max-length`` with ``reject-publish`` is not exact
on quorum queues: 2 of 8 simultaneous publishes acked on 4.3, see :mod:`ojs_kombu.amqp.lease`),
or a renewal interrupted between its publish and its ack.  So a token alone does not make a
permit: its receiver also subscribes an *exclusive consumer* to the (always empty, durable,
classic) index queue ``Names.limit_holder_queue(key, i)``.  RabbitMQ lets one consumer at a time
subscribe exclusively (another gets ``403 ACCESS_REFUSED ... in exclusive use``) and removes it
when its channel or connection closes, exactly when it returns the connection's tokens.  A permit
is handed out only while its holder's consumer is subscribed, so at most one process holds index
``i`` and at most N hold permits of the key at any moment, whatever the number of token copies.
A receiver that meets a held index waits up to ``dedupe_grace`` seconds (the broker may requeue a
dead holder's token a moment before it removes its consumer), then acknowledges the copy: a
duplicate is removed.  (An exclusive consumer costs 0.27 ms to subscribe and cancel on RabbitMQ
4.3; an exclusive queue, declared and deleted, 5–9 ms: it is a metadata store write.)  Tokens with an index ≥ N (the limit
shrank) are acknowledged too.

**Seeding** (:meth:`Permits.ensure`) runs under a lock, an exclusive consumer on the queue
``Names.limit_seed_lock``: the seeder takes every ready token (keeping one per index, removing
copies and indexes ≥ N), probes each missing index queue (an exclusive subscription: refused
means held), mints the indexes that are neither ready nor held, and returns the rest.
A token in flight during the probe (a holder releasing it, a dead holder's token being returned)
may be minted once more; the copy is harmless (above) and removed when it meets the original.

**Returning a token never drops it** (``docs/cluster.md``, the delivery limit): a quorum queue
drops a message returned more than ``x-delivery-limit`` times.  The permit queue's limit is
2**31-1 (the most RabbitMQ takes; 4.x's default is 20) and a token is returned with
``Basic.Nack(requeue=True)``, which RabbitMQ 4.3 does not count as a return; 3.10 and 4.0 count
it (and stamp ``x-delivery-count``), so a holder that sees a count of :data:`RENEW_AFTER_RETURNS`
or more *renews* the token instead: it publishes a fresh copy (confirmed), then acknowledges the
worn one.  A crash between the two leaves a duplicate, which the holder queue makes harmless.

A :class:`Permits` owns one connection, used by one thread at a time under a lock; a keeper
thread services the AMQP heartbeat while permits are held and jobs run
(:mod:`ojs_kombu.amqp.permit_connection`: the connection, and the exclusive holds on marker queues).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import orjson
from amqp import Channel, spec
from amqp import Message as WireMessage
from amqp.exceptions import ChannelError, MessageNacked

from ojs_kombu.amqp.permit_connection import Hold, PermitConnection
from ojs_kombu.amqp.windows import WindowTokens
from ojs_kombu.errors import PermitLostError, ValidationError
from ojs_kombu.model.naming import Names
from ojs_kombu.model.ratelimit import RateLimitPolicy
from ojs_kombu.policy.ratelimit import WindowSchedule

logger = logging.getLogger(__name__)

PERMIT_DELIVERY_LIMIT = 2**31 - 1
"""``x-delivery-limit`` of a permit queue: the most RabbitMQ accepts (4.x's default, 20, would drop tokens)."""

PERMIT_CONSUMER_TIMEOUT_MS = 2**31 - 1
"""``x-consumer-timeout`` of a permit queue (RabbitMQ ≥ 3.12): a permit is held as long as its job runs."""

RENEW_AFTER_RETURNS = 1_000_000
"""A token whose ``x-delivery-count`` reached this is renewed (republished, then acked) instead of returned."""

MAX_PERMITS = 10_000
"""The largest concurrency limit :meth:`Permits.ensure` takes: each permit is a token and an index queue."""

DEFAULT_DEDUPE_GRACE = 2.0
"""Seconds a receiver waits for an index's holder queue to be released before it removes its token as a copy."""

DEFAULT_PERMITS_HEARTBEAT = 10.0
"""AMQP heartbeat of a :class:`Permits` connection, in seconds: a silent holder loses its permits after 2–3."""

_LOCK_RETRY = 0.02

SEED_SETTLE = 0.05
"""Seconds :meth:`Permits.ensure` waits before it mints a token that looked missing, and looks again: a
token released at that moment (its holder's consumer cancelled, the token not yet back) reappears."""


def permit_queue_arguments() -> dict[str, Any]:
    """The arguments of a permit queue (see the module).

    Returns:
        A new dict.
    """
    return {
        "x-queue-type": "quorum",
        "x-delivery-limit": PERMIT_DELIVERY_LIMIT,
        "x-consumer-timeout": PERMIT_CONSUMER_TIMEOUT_MS,
    }


def _requeue(channel: Channel, tag: int) -> None:
    """``Basic.Nack(requeue=True)`` of one delivery (py-amqp has no ``basic_nack``): 4.3 does not count it."""
    channel.send_method(spec.Basic.Nack, "Lbb", (tag, False, True))


def _token_body(key: str, index: int) -> bytes:
    return orjson.dumps({"permit": key, "index": index})


def _token_index(body: Any, key: str) -> int | None:
    try:
        data = orjson.loads(body)
    except (orjson.JSONDecodeError, TypeError):
        return None
    if not isinstance(data, dict) or data.get("permit") != key:
        return None
    index = data.get("index")
    return index if type(index) is int and index >= 0 else None


@dataclass(frozen=True)
class PermitState:
    """A key's permits as the broker counts them (:meth:`Permits.inspect`)."""

    key: str
    limit: int
    available: int
    active: int
    holding: int
    waiting: int


class Permit:
    """One concurrency permit of a key, held until :meth:`release` (or the end of a ``with`` block).

    Created by :meth:`Permits.acquire`.  ``key`` and ``index`` name it; ``waited`` is the number of
    seconds :meth:`Permits.acquire` took.
    """

    def __init__(
        self, owner: Permits, key: str, index: int, tag: int, hold: Hold, delivery_count: int, waited: float
    ) -> None:
        self._owner = owner
        self.key = key
        self.index = index
        self.waited = waited
        self._tag = tag
        self._generation = owner._generation
        self._hold = hold
        self._delivery_count = delivery_count
        self.released = False

    def release(self) -> None:
        """Give the permit back (idempotent): the next waiter, in any process, can take it.

        Raises:
            PermitLostError: the connection was lost meanwhile (the broker took the permit back already).
        """
        if not self.released:
            self.released = True
            self._owner._release(self)

    @property
    def held(self) -> bool:
        """Whether the permit is still held: not released, and its connection not lost (the keeper thread
        notices a lost connection within a second; a job may check it before an irreversible step)."""
        return not self.released and self._owner._holds(self)

    def __enter__(self) -> Permit:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<Permit {self.key}#{self.index} {state}>"


class Permits(PermitConnection):
    """Concurrency permits for any number of keys, on one connection of its own.

    Parameters:
        url: the broker URL; default ``$OJS_AMQP_URL``, then the local broker.
        names: the deployment's entity names (its prefix).
        heartbeat: AMQP heartbeat in seconds (serviced by a keeper thread).
        dedupe_grace: see :data:`DEFAULT_DEDUPE_GRACE`.
        renew_after: see :data:`RENEW_AFTER_RETURNS`.
        ssl, transport_options: as for :class:`~ojs_kombu.client.Client`.
        connection_name: the connection's name in the management UI.

    Methods may be called from several threads: they take turns on the connection.

    Raises:
        ValidationError: a bad URL or ``ssl`` option.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        names: Names | None = None,
        heartbeat: float = DEFAULT_PERMITS_HEARTBEAT,
        dedupe_grace: float = DEFAULT_DEDUPE_GRACE,
        renew_after: int = RENEW_AFTER_RETURNS,
        ssl: Any = None,
        transport_options: dict[str, Any] | None = None,
        connection_name: str = "ojs-permits",
    ) -> None:
        super().__init__(
            url, heartbeat=heartbeat, ssl=ssl, transport_options=transport_options, connection_name=connection_name
        )
        self.names = names or Names()
        self.dedupe_grace = dedupe_grace
        self.renew_after = renew_after
        self._limits: dict[str, int] = {}
        self._waiting: dict[str, int] = {}
        self.duplicates_removed = 0
        """Token copies this instance acknowledged (an index held elsewhere, or a second ready copy)."""
        self.renewed = 0
        """Tokens this instance renewed (republished) because of their delivery count."""
        self._windows: WindowTokens | None = None

    def __enter__(self) -> Permits:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- declaring and seeding ---------------------------------------------------------------------

    def _declare(self, key: str) -> str:
        queue = self.names.limit_permit_queue(key)
        self._declare_queue(queue, permit_queue_arguments())
        return queue

    def ensure(self, key: str | RateLimitPolicy, limit: int | None = None, *, timeout: float = 30.0) -> int:
        """Declare the key's permit queue and make its token count ``limit`` (see the module).

        Every process that uses the key calls it (idempotent; cheap when nothing is missing), with
        the same limit: a smaller one shrinks the key's tokens, a larger one adds tokens.

        Parameters:
            key: the key, or a :class:`~ojs_kombu.model.ratelimit.RateLimitPolicy` with ``concurrency``.
            limit: the number of permits (≥ 0); taken from the policy when ``key`` is one.
            timeout: seconds to wait for another process's seeding to finish.

        Returns:
            The number of tokens minted.

        Raises:
            ValidationError: no limit, a negative one, or a bad key.
            TimeoutError: another process held the seeding lock for ``timeout`` seconds.
            TopologyConflictError: the permit queue exists with other arguments.
            BrokerConnectionError, BrokerRefusedError: as the broker answers.
        """
        if isinstance(key, RateLimitPolicy):
            limit = key.concurrency if limit is None else limit
            key = key.key
        else:
            key = RateLimitPolicy(key=key).key
        if limit is None or type(limit) is not int or not 0 <= limit <= MAX_PERMITS:
            raise ValidationError(
                f"a concurrency limit must be an integer from 0 to {MAX_PERMITS}, got {limit!r}", field="concurrency"
            )
        lock = self.names.limit_seed_lock(key)
        deadline = time.monotonic() + timeout
        with self._guarded():
            queue = self._declare(key)
            while (seeding := self._try_hold(lock)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has been seeding {queue} for {timeout:g} s")
                self._io.release()
                try:
                    time.sleep(_LOCK_RETRY)
                finally:
                    self._io.acquire()
            try:
                self._limits[key] = limit
                return self._seed(key, queue, limit)
            finally:
                self._unhold(seeding)

    def _seed(self, key: str, queue: str, limit: int) -> int:
        tokens = self._tokens
        assert tokens is not None
        ready: dict[int, int] = {}
        held = self._held.setdefault(key, set())
        self._take_ready(key, queue, limit, ready)
        missing = [i for i in range(limit) if i not in ready and i not in held and self._free(key, i)]
        if missing:
            # A token between its holder's cancel and its return looks missing: look again a moment later.
            self._io.release()
            try:
                time.sleep(SEED_SETTLE)
            finally:
                self._io.acquire()
            self._take_ready(key, queue, limit, ready)
        minted = 0
        for index in missing:
            if index in ready or index in held:
                continue
            probe = self._try_hold(self.names.limit_holder_queue(key, index))
            if probe is None:
                continue  # held by another process
            try:
                self._mint(queue, key, index)
                minted += 1
            finally:
                self._unhold(probe)
        for tag in ready.values():
            _requeue(tokens, tag)
        if minted:
            logger.info("permits: minted %d token(s) of %s (limit %d)", minted, key, limit)
        return minted

    def _take_ready(self, key: str, queue: str, limit: int, ready: dict[int, int]) -> None:
        """Take every ready token into ``ready`` (index -> delivery tag), removing copies and indexes ≥ ``limit``."""
        tokens = self._tokens
        assert tokens is not None
        while (message := tokens.basic_get(queue, no_ack=False)) is not None:
            tag = message.delivery_info["delivery_tag"]
            index = _token_index(message.body, key)
            if index is None or index >= limit or index in ready:
                tokens.basic_ack(tag)
                self.duplicates_removed += index is not None and index < limit
                continue
            ready[index] = tag

    def _free(self, key: str, index: int) -> bool:
        """Whether no process holds ``index`` of ``key`` now (a probe of its index queue)."""
        probe = self._try_hold(self.names.limit_holder_queue(key, index))
        if probe is None:
            return False
        self._unhold(probe)
        return True

    def _mint(self, queue: str, key: str, index: int) -> None:
        self._publish_channel().basic_publish_confirm(
            WireMessage(_token_body(key, index), content_type="application/json", delivery_mode=2),
            exchange="",
            routing_key=queue,
            mandatory=True,
        )

    # -- acquiring and releasing -------------------------------------------------------------------

    def acquire(self, key: str | RateLimitPolicy, timeout: float | None = None) -> Permit | None:
        """Take a permit of ``key``, waiting up to ``timeout`` seconds (``None``: forever; ``0``: do not wait).

        Waiters are served in the order the broker delivers returned tokens to them (first come,
        first served across processes).

        Parameters:
            key: the key (or its policy), passed to :meth:`ensure` by this instance before.
            timeout: seconds to wait at most.

        Returns:
            The permit, or None when none came free in time.

        Raises:
            ValidationError: the key was not passed to :meth:`ensure` here.
            PermitLostError: the Permits is closed.
            BrokerConnectionError, BrokerRefusedError: as the broker answers.
        """
        if isinstance(key, RateLimitPolicy):
            key = key.key
        limit = self._limits.get(key)
        if limit is None:
            raise ValidationError(f"call ensure({key!r}, limit) before acquiring its permits", field="key")
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        queue = self.names.limit_permit_queue(key)
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            return self._acquire(key, limit, queue, started, deadline)
        finally:
            self._waiting[key] -= 1

    def _acquire(self, key: str, limit: int, queue: str, started: float, deadline: float | None) -> Permit | None:
        while True:
            with self._guarded():
                self._open()
                tokens = self._tokens
                assert tokens is not None
                message = tokens.basic_get(queue, no_ack=False)
                if message is not None:
                    permit = self._claim(key, limit, message, tokens, started)
                    if permit is not None:
                        return permit
                    continue
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            message, tokens = self._wait(queue, remaining)
            if message is not None:
                with self._guarded():
                    permit = self._claim(key, limit, message, tokens, started)
                    if permit is not None:
                        return permit

    def _wait(self, queue: str, remaining: float | None) -> tuple[WireMessage | None, Channel]:
        """Subscribe until one token is delivered or ``remaining`` seconds passed; then cancel.

        Returns the token (or None) and the channel it was delivered on.
        """
        received: list[WireMessage] = []
        with self._guarded():
            self._open()
            tokens = self._tokens
            assert tokens is not None
            tag = tokens.basic_consume(queue, callback=received.append, no_ack=False)
        end = None if remaining is None else time.monotonic() + remaining
        try:
            while not received:
                left = 0.2 if end is None else min(0.2, end - time.monotonic())
                if left <= 0:
                    break
                # Short turns: other threads' acquires and releases share the connection.
                with self._guarded():
                    if not self._same_connection(tokens):
                        break  # the connection was dropped meanwhile (its tokens went back)
                    try:
                        self._connection.drain_events(timeout=left)
                    except TimeoutError:
                        pass
        finally:
            with self._guarded():
                if self._same_connection(tokens):
                    tokens.basic_cancel(tag)  # deliveries that race the cancel land in `received`
        for extra in received[1:]:
            with self._guarded():
                if self._same_connection(tokens):
                    _requeue(tokens, extra.delivery_info["delivery_tag"])
        return (received[0] if received else None), tokens

    def _claim(self, key: str, limit: int, message: WireMessage, tokens: Channel, started: float) -> Permit | None:
        """Make a token received on ``tokens`` a permit: own its index queue, or remove the token as a copy.

        Returns None when the token was removed, or went back with a connection lost meanwhile.
        """
        if not self._same_connection(tokens):
            return None
        tag = message.delivery_info["delivery_tag"]
        index = _token_index(message.body, key)
        held = self._held.setdefault(key, set())
        if index is None or index >= limit or index in held:
            tokens.basic_ack(tag)  # garbage, above the limit, or a copy of one this connection holds
            self.duplicates_removed += index is not None and index < limit
            return None
        holder = self.names.limit_holder_queue(key, index)
        grace_end = time.monotonic() + self.dedupe_grace
        while (hold := self._try_hold(holder)) is None:
            if time.monotonic() >= grace_end:
                tokens.basic_ack(tag)
                self.duplicates_removed += 1
                logger.info("permits: removed a copy of %s#%d (held elsewhere)", key, index)
                return None
            self._io.release()
            try:
                time.sleep(_LOCK_RETRY)
            finally:
                self._io.acquire()
            if not self._same_connection(tokens):
                return None  # the connection was lost meanwhile: the token went back with it
        held.add(index)
        headers = message.properties.get("application_headers") or {}
        count = headers.get("x-delivery-count", 0)
        return Permit(self, key, index, tag, hold, count if isinstance(count, int) else 0, time.monotonic() - started)

    def _same_connection(self, tokens: Channel) -> bool:
        return self._tokens is tokens

    def _release(self, permit: Permit) -> None:
        with self._io:
            tokens = self._tokens
            if tokens is None or not self._owns(permit):
                raise PermitLostError(f"{permit!r}: the connection was lost; the broker took the permit back")
            held = self._held[permit.key]
            with self._guarded():
                # Unsubscribe first: a token returned before it would meet a held index.
                self._unhold(permit._hold)
                held.discard(permit.index)
                if permit._delivery_count >= self.renew_after:
                    self._renew(permit)
                else:
                    _requeue(tokens, permit._tag)

    def _renew(self, permit: Permit) -> None:
        tokens = self._tokens
        assert tokens is not None
        try:
            self._mint(self.names.limit_permit_queue(permit.key), permit.key, permit.index)
        except (MessageNacked, ChannelError):
            _requeue(tokens, permit._tag)  # keep the worn one
            return
        tokens.basic_ack(permit._tag)
        self.renewed += 1

    def _holds(self, permit: Permit) -> bool:
        with self._io:
            return self._owns(permit)

    def _owns(self, permit: Permit) -> bool:
        """Whether ``permit`` was taken on the current connection and is held (under ``_io``)."""
        return (
            self._tokens is not None
            and permit._generation == self._generation
            and permit.index in self._held.get(permit.key, ())
        )

    def inspect(self, key: str) -> PermitState:
        """The key's permits as the broker counts them now (spec §10.1 inspection; the metrics' source).

        Parameters:
            key: a key passed to :meth:`ensure` by this instance.

        Returns:
            ``limit`` (this instance's), ``available`` (tokens ready in the queue), ``active``
            (``limit - available``, at least 0: held in every process), ``holding`` (held by this
            instance) and ``waiting`` (this instance's :meth:`acquire` calls waiting now).  Waiters of
            every process are not counted by the broker: a quorum queue's consumer count also
            includes cancelled consumers that still hold a token, so each process reports its own.

        Raises:
            ValidationError: the key was not passed to :meth:`ensure` here.
        """
        limit = self._limits.get(key)
        if limit is None:
            raise ValidationError(f"call ensure({key!r}, limit) before inspecting its permits", field="key")
        with self._guarded():
            ok = self._control_channel().queue_declare(self.names.limit_permit_queue(key), passive=True)
        available = int(ok.message_count)
        return PermitState(key, limit, available, max(0, limit - available), self.holding(key), self.waiting(key))

    # -- window rates (start tokens, :mod:`ojs_kombu.amqp.windows`) on this connection ---------------

    def _window_tokens(self) -> WindowTokens:
        channel = self._control_channel()
        if self._windows is None or self._windows.channel is not channel:  # a new connection: declare again
            self._windows = WindowTokens(channel, self.names)
        return self._windows

    def take_start(self, key: str, schedule: WindowSchedule) -> int | None:
        """Spend one start token of ``key``'s window, without waiting (:meth:`WindowTokens.take`).

        Parameters:
            key: the rate limit key.
            schedule: the window.

        Returns:
            The slot the token was published for, or None when this slot's tokens are spent.

        Raises:
            BrokerConnectionError, BrokerRefusedError: as the broker answers.
        """
        with self._guarded():
            return self._window_tokens().take(key, schedule)

    def refill_starts(self, key: str, schedule: WindowSchedule, slot: int, *, now: float | None = None) -> int:
        """Publish slot ``slot``'s start tokens of ``key``'s window (:meth:`WindowTokens.refill`).

        Parameters:
            key: the rate limit key.
            schedule: the window.
            slot: the current slot.
            now: the Unix time (default: now).

        Returns:
            Tokens published.

        Raises:
            BrokerConnectionError, BrokerRefusedError: as the broker answers.
        """
        with self._guarded():
            return self._window_tokens().refill(key, schedule, slot, now=now)

    def waiting(self, key: str) -> int:
        """How many :meth:`acquire` calls of this instance wait for a permit of ``key`` now.

        Parameters:
            key: the key.

        Returns:
            The count.
        """
        return self._waiting.get(key, 0)

    def holding(self, key: str) -> int:
        """How many permits of ``key`` this instance holds now.

        Parameters:
            key: the key.

        Returns:
            The count.
        """
        return len(self._held.get(key, ()))


__all__ = [
    "DEFAULT_DEDUPE_GRACE",
    "DEFAULT_PERMITS_HEARTBEAT",
    "MAX_PERMITS",
    "PERMIT_CONSUMER_TIMEOUT_MS",
    "PERMIT_DELIVERY_LIMIT",
    "RENEW_AFTER_RETURNS",
    "SEED_SETTLE",
    "Permit",
    "PermitState",
    "Permits",
    "permit_queue_arguments",
]
