"""Unique-job locks on RabbitMQ alone (DESIGN §19): a set-if-absent per key, with expiry, no other datastore.

A lock is a classic queue ``ojs.lock.{key}`` declared with ``x-max-length=1`` and
``x-overflow=reject-publish``.  Acquiring publishes one persistent token (the holder's job id,
per-message ``expiration`` = the period) with publisher confirms: the broker takes it only when
the queue is empty, so ``Basic.Ack`` = acquired and ``Basic.Nack`` = held by another job.  The
queue process handles publishes one at a time, so any number of concurrent acquirers get
exactly one ack.  The token's TTL frees the lock at the end of the period even if every holder
crashed, and ``x-expires`` removes the idle queue itself.

Measured choices (``docs/unique-jobs.md``):

* **Classic, not quorum.** On RabbitMQ 4.3 a quorum queue with ``x-max-length=1`` and
  ``reject-publish`` acked 2 to 16 of 16 concurrent publishes: its limit is applied after the
  fact, so it is no set-if-absent.  A lock therefore lives on one node.
* **The holder's id is not read from the lock queue.** ``x-max-length`` counts *ready*
  messages only: while a ``Basic.Get`` holds the token unacknowledged, the queue is "empty"
  and takes another acquirer's token, and the requeued token makes two holders.  The holder's
  id is written, after the ack, to a second queue ``ojs.lock.{key}.holder`` (``x-max-length=1``,
  ``drop-head``, same TTL) that readers may take and requeue without touching the lock.
* **The period is a per-message TTL, not ``x-message-ttl``**: the remaining period differs
  from one acquirer to the next, and queue arguments must be equal for every declarer of a name.
  ``x-expires`` is one constant per deployment for the same reason, so a token never lives
  longer than it (``queue_expires``, default 7 days): a lock without a period ends by then too.
* **One open file per live lock.** A classic queue holding a persistent message keeps a file
  open (measured on 4.3: 1.0 per queue; none for a transient message), so the token is persistent
  (a lock outlives a broker restart) and the holder's record is not; a node holds at most
  about its file descriptor limit of live locks (``persistent=False``: no file, and a restart
  frees every lock).

* **Two round trips.** The declarations of the lock and of its record's queue, then the token,
  go out together on the publisher's channel (in order on one channel: a refused declaration
  discards the token with it), and the record follows the ack; :meth:`UniqueLocks.acquire_many`
  does that for a batch at once.  Profiled on 4.3, the sequential version spent 3.0 of its 4.3 ms
  in the two durable declarations.

A :class:`UniqueLocks` uses one py-amqp connection from one thread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from amqp import Connection, spec
from amqp.exceptions import NotFound, PreconditionFailed

from ojs_kombu.amqp.connection import close_quietly
from ojs_kombu.amqp.errors import map_exceptions, raise_if_permanent
from ojs_kombu.amqp.publisher import ConfirmedPublisher, PublishTicket
from ojs_kombu.errors import PublishNackedError, PublishTimeoutError, UnroutableError, ValidationError
from ojs_kombu.model.naming import Names
from ojs_kombu.wire.codec import OutgoingMessage

DEFAULT_QUEUE_EXPIRES: Final = timedelta(days=7)
"""``x-expires`` of the lock queues, and the longest a lock lives (its period capped)."""

_ATTEMPTS: Final = 5  # acquire: a lock freed or a queue deleted between two steps is tried again
_REFUSED_PAUSE: Final = 0.03  # seconds (times the attempt) before declaring again after a 404 (RabbitMQ's own pause)
_HOLDER_WAIT: Final = 2.0  # seconds a reader waits for a new holder to write its id
_SCHEDULED_AT: Final = "x-ojs-scheduled-at"  # the holder record's header: the holder's scheduled_at


def lock_ttl_ms(period: timedelta | None, expires_ms: int) -> int:
    """How long a lock of ``period`` lives, in ms: the period (at least 1 ms), capped at ``expires_ms``.

    Parameters:
        period: the lock's period; None means ``expires_ms``.
        expires_ms: the longest a lock lives (``queue_expires``).

    Returns:
        The TTL in milliseconds.

    Raises:
        ValidationError: ``period`` is not positive.
    """
    if period is None:
        return expires_ms
    if period <= timedelta(0):
        raise ValidationError(f"period must be greater than zero, got {period!r}", field="period")
    return min(expires_ms, max(1, math.ceil(period.total_seconds() * 1000)))


@dataclass(frozen=True, slots=True)
class LockRequest:
    """One lock to take (:meth:`UniqueLocks.acquire_many`): the arguments of :meth:`UniqueLocks.acquire`."""

    key: str
    holder_id: str
    period: timedelta | None
    scheduled_at: str | None = None


@dataclass(frozen=True, slots=True)
class Acquired:
    """The lock of ``key`` is now held by ``holder_id`` until released or ``ttl_ms`` elapsed."""

    key: str
    holder_id: str
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class Held:
    """The lock of ``key`` is held by another job: ``existing_id``, or None when its id could not be read.

    ``existing_scheduled_at`` is the ``scheduled_at`` the holder wrote with its id
    (``acquire(scheduled_at=...)``), or None.
    """

    key: str
    existing_id: str | None
    existing_scheduled_at: str | None = None


class UniqueLocks:
    """Acquire, read and release unique-job locks on one AMQP connection.

    Parameters:
        connection: a connected py-amqp connection, used from this thread only.
        names: the deployment's entity names (its prefix).
        queue_expires: ``x-expires`` of the lock queues: the same for every process of a
            deployment (RabbitMQ refuses a declaration with other arguments).  A lock never
            lives longer than this, whatever its period.
        delete_on_release: a release deletes the two queues of the lock (the node then holds
            queues for live locks only); False leaves them to ``x-expires``, which makes the
            next acquire of the same key about 4x cheaper but keeps an idle queue pair per
            key until ``queue_expires`` (``docs/unique-jobs.md`` has the numbers).
        persistent: the token is a persistent message, so a lock outlives a broker restart.
            RabbitMQ keeps one file open per classic queue holding a persistent message: a
            node holds at most about its file descriptor limit of live locks.  False keeps the
            tokens in memory (no file each): a broker restart frees every lock.
    """

    def __init__(
        self,
        connection: Connection,
        *,
        names: Names | None = None,
        queue_expires: timedelta = DEFAULT_QUEUE_EXPIRES,
        delete_on_release: bool = True,
        persistent: bool = True,
    ):
        if queue_expires <= timedelta(0):
            raise ValidationError("queue_expires must be greater than zero", field="queue_expires")
        self.connection = connection
        self.names = names if names is not None else Names()
        self.expires_ms = math.ceil(queue_expires.total_seconds() * 1000)
        self.delete_on_release = delete_on_release
        self.persistent = persistent
        self._publisher = ConfirmedPublisher(connection, renew_on_nack=False)  # a nack is "held", no fault
        self._channel: Any = connection.channel()

    # -- the public operations

    def acquire(
        self, key: str, holder_id: str, period: timedelta | None, *, scheduled_at: str | None = None
    ) -> Acquired | Held:
        """Take the lock of ``key`` for ``holder_id`` unless another holds it (atomic set-if-absent).

        Parameters:
            key: the uniqueness key (:func:`ojs_kombu.policy.unique_key`).
            holder_id: the id of the job that will hold it.
            period: how long the lock may live at most; None or longer than ``queue_expires``
                means ``queue_expires``.
            scheduled_at: the holder's ``scheduled_at``, kept with its id in the holder's record
                (``Held.existing_scheduled_at`` of a later acquirer: ``replace_except_schedule``).

        Returns:
            :class:`Acquired`, or :class:`Held` with the holder's id.

        Raises:
            ValidationError: ``period`` is not positive, or ``holder_id`` is empty.
            PublishError: the broker did not confirm the token (timeout, unroutable five times).
            BrokerRefusedError: a lock queue exists with other arguments (another ``queue_expires``).
        """
        return self.acquire_many([LockRequest(key, holder_id, period, scheduled_at)])[0]

    def acquire_many(self, requests: Sequence[LockRequest]) -> list[Acquired | Held]:
        """Take the locks of a batch, each as :meth:`acquire` does, in two round trips for all.

        The declarations and tokens of every lock go out together, then the records of the
        locks taken; a request whose key another holds (or an earlier request of the batch)
        gets :class:`Held` with that holder's id.

        Parameters:
            requests: what to lock, in order.

        Returns:
            One :class:`Acquired` or :class:`Held` per request, in order.

        Raises:
            ValidationError, PublishError, BrokerRefusedError: as :meth:`acquire`.
        """
        for request in requests:
            if not request.holder_id:
                raise ValidationError("holder_id must not be empty", field="holder_id")
        ttls = [lock_ttl_ms(request.period, self.expires_ms) for request in requests]
        results: list[Acquired | Held | None] = [None] * len(requests)
        pending = list(range(len(requests)))
        refused: NotFound | None = None
        for attempt in range(_ATTEMPTS):
            if not pending:
                break
            if refused is not None:
                time.sleep(_REFUSED_PAUSE * attempt)
            try:
                tickets = self._declare_and_publish([requests[i] for i in pending], [ttls[i] for i in pending])
            except NotFound as exc:
                refused = exc  # nothing was published: every pending request is tried again
                continue
            refused = None
            won = [i for i, ticket in zip(pending, tickets, strict=True) if ticket.error is None]
            self._write_holders([(requests[i], ttls[i]) for i in won])
            retry = []
            for i, ticket in zip(pending, tickets, strict=True):
                error, key = ticket.error, requests[i].key
                if error is None:
                    results[i] = Acquired(key, requests[i].holder_id, ttls[i])
                elif isinstance(error, UnroutableError):
                    retry.append(i)  # the queue was deleted (released, expired) after our declaration
                elif not isinstance(error, PublishNackedError):
                    raise error
                elif (held := self._held(key)).existing_id is not None or self._lock_count(self.names.lock_queue(key)):
                    results[i] = held
                else:
                    retry.append(i)  # freed between the nack and the read: try again
            pending = retry
        if pending and refused is not None:
            raise_if_permanent(refused, must_exist=True)  # a 404 every time: NotFoundError
        for i in pending:
            results[i] = self._held(requests[i].key)
        return [result for result in results if result is not None]

    def holder(self, key: str) -> str | None:
        """The id of the job holding the lock of ``key``, or None when it is free.

        Reads the holder's record without touching the lock.  A holder that has just
        acquired writes its record a moment later: while the lock is held and the record
        not there yet, this waits for it (up to 2 s, then None).

        Parameters:
            key: the uniqueness key.

        Returns:
            The holder's job id, or None.
        """
        return self._held(key).existing_id

    def _held(self, key: str) -> Held:
        """The holder's record of ``key`` (as :meth:`holder` reads it) as a :class:`Held`."""
        deadline = time.monotonic() + _HOLDER_WAIT
        while True:
            message = self._get(self.names.lock_holder_queue(key))
            if message is not None:
                self._channel.basic_reject(message.delivery_tag, requeue=True)
                headers = message.properties.get("application_headers") or {}
                scheduled = headers.get(_SCHEDULED_AT)
                if isinstance(scheduled, bytes):
                    scheduled = scheduled.decode("utf-8")
                return Held(key, _body_text(message), scheduled if isinstance(scheduled, str) else None)
            if not self._lock_count(self.names.lock_queue(key)) or time.monotonic() >= deadline:
                return Held(key, None)
            time.sleep(0.005)

    def release(self, key: str, holder_id: str) -> bool:
        """Free the lock of ``key`` if ``holder_id`` holds it; a lock held by another job is left alone.

        A release after the lock expired and another job took it does not free the new
        holder's lock: the holder's record names the other job, and the lock's token is
        never taken unless the record names ``holder_id``.  The record is not persistent: after
        a broker restart (or when it is still missing 2 s after an acquire) the token itself
        is read, and put back if it is another job's.

        Parameters:
            key: the uniqueness key.
            holder_id: the job that took the lock.

        Returns:
            True when this removed ``holder_id``'s token; False when it no longer held the lock.
        """
        record_queue = self.names.lock_holder_queue(key)
        lock = self.names.lock_queue(key)
        deadline = time.monotonic() + _HOLDER_WAIT
        while (record := self._get(record_queue)) is None:
            if not self._lock_count(lock):
                return False
            if time.monotonic() >= deadline:
                break  # held, but no record: the broker restarted since the acquire
            time.sleep(0.005)
        if record is not None and _body_text(record) != holder_id:
            self._channel.basic_reject(record.delivery_tag, requeue=True)
            return False
        # The record is ours, so the token is ours too unless it expired in the last moment.
        channel = self._channel
        token = self._get(lock)
        if self._channel is not channel:
            return False  # no lock queue (expired): closing the channel requeued our stale record
        released = token is not None and _body_text(token) == holder_id
        if token is not None:
            if released:
                self._channel.basic_ack(token.delivery_tag)
            else:
                self._channel.basic_reject(token.delivery_tag, requeue=True)
        if record is not None:
            self._channel.basic_ack(record.delivery_tag)
        if released and self.delete_on_release:
            self._delete_if_empty(lock)
            self._delete_if_empty(record_queue)
        return released

    def close(self) -> None:
        """Close this object's channels (not the connection)."""
        self._publisher.close()
        close_quietly(self._channel)

    # -- steps

    def _arguments(self, overflow: str) -> dict[str, Any]:
        return {
            "x-queue-type": "classic",
            "x-max-length": 1,
            "x-overflow": overflow,
            "x-expires": self.expires_ms,
        }

    def _declare(self, queue: str, *, overflow: str) -> None:
        # Every acquire declares: it restarts the idle queue's x-expires clock.
        with map_exceptions():
            self._call(
                lambda ch: ch.queue_declare(queue, durable=True, auto_delete=False, arguments=self._arguments(overflow))
            )

    def _declare_and_publish(self, requests: list[LockRequest], ttls: list[int]) -> list[PublishTicket]:
        """Declare both queues of every request's lock, then publish the tokens, in one round trip.

        All on the publisher's channel, declarations first: a channel handles its methods in
        order, so each queue exists when its token is routed, and a refused declaration closes
        the channel before any token is handled (RabbitMQ discards what follows an error on a
        channel).  A refusal therefore leaves no token behind whose confirm went unread: had a
        record's queue been declared on another channel, or a token gone out before a later
        lock's declaration, its lock could be taken without the acquirer knowing it.  Every
        declaration is awaited before the tokens' confirms are read, so a reader of a record
        (the ``Held`` path) finds its queue.

        Returns:
            The tokens' tickets, settled: no error = acquired.

        Raises:
            NotFound: a declaration was refused with 404, nothing was published.  RabbitMQ 4.3 says
                "home node ... of durable queue ... is down or inaccessible" to a declaration that
                meets the queue while a concurrent declarer is creating it (seen once in 34 runs
                of 16 concurrent acquirers of one new key, while the node created a benchmark's
                5,000 locks): the caller tries again.
            BrokerRefusedError: a lock queue exists with other arguments (another ``queue_expires``).
        """
        arguments = self._arguments("reject-publish"), self._arguments("drop-head")
        replies = _DeclareOks(self._publisher.channel)
        try:
            with map_exceptions():
                try:
                    for request in requests:
                        replies.send(self.names.lock_queue(request.key), arguments[0])
                        replies.send(self.names.lock_holder_queue(request.key), arguments[1])
                    tickets = []
                    for request, ttl_ms in zip(requests, ttls, strict=True):
                        lock = self.names.lock_queue(request.key)
                        message = self._message(request.holder_id, ttl_ms, persistent=self.persistent, headers=None)
                        tickets.append(
                            self._publisher.publish(
                                message, exchange="", routing_key=lock, queue=lock, job_id=request.holder_id
                            )
                        )
                    replies.wait(self.connection)
                except (NotFound, PreconditionFailed):
                    # The broker closed the channel: its tokens were discarded unread, and so are their tickets.
                    self._publisher.close()
                    self._publisher = ConfirmedPublisher(self.connection, renew_on_nack=False)
                    raise
        finally:
            replies.close()
        self._publisher.wait(tickets)
        return tickets

    def _message(
        self, holder_id: str, ttl_ms: int, *, persistent: bool, headers: dict[str, Any] | None
    ) -> OutgoingMessage:
        return OutgoingMessage(
            holder_id.encode("utf-8"),
            {
                "message_id": holder_id,
                "expiration": str(ttl_ms),
                "delivery_mode": 2 if persistent else 1,
                "content_type": "text/plain",
            },
            headers or {},
        )

    def _publish(
        self, queue: str, holder_id: str, ttl_ms: int, *, persistent: bool, headers: dict[str, Any] | None = None
    ) -> Exception | None:
        message = self._message(holder_id, ttl_ms, persistent=persistent, headers=headers)
        ticket = self._publisher.publish(message, exchange="", routing_key=queue, queue=queue, job_id=holder_id)
        self._publisher.wait([ticket])
        return ticket.error

    def _write_holders(self, taken: list[tuple[LockRequest, int]]) -> None:
        """Publish the holder's record of every lock taken (request, ttl_ms), confirmed; their queues are declared."""
        tickets = []
        for request, ttl_ms in taken:
            record = self.names.lock_holder_queue(request.key)
            headers = {_SCHEDULED_AT: request.scheduled_at} if request.scheduled_at else None
            message = self._message(request.holder_id, ttl_ms, persistent=False, headers=headers)
            tickets.append(
                self._publisher.publish(
                    message, exchange="", routing_key=record, queue=record, job_id=request.holder_id
                )
            )
        self._publisher.wait(tickets)
        for (request, ttl_ms), ticket in zip(taken, tickets, strict=True):
            if isinstance(ticket.error, UnroutableError):  # deleted since by the release of the previous holder
                self._write_holder(request.key, request.holder_id, ttl_ms, request.scheduled_at)
            elif ticket.error is not None:
                raise ticket.error

    def _write_holder(self, key: str, holder_id: str, ttl_ms: int, scheduled_at: str | None) -> None:
        record_queue = self.names.lock_holder_queue(key)
        headers = {_SCHEDULED_AT: scheduled_at} if scheduled_at else None
        error: Exception | None = None
        for attempt in range(_ATTEMPTS):
            try:
                self._declare(record_queue, overflow="drop-head")
            except NotFound as exc:  # being created by another acquirer (see _declare_and_publish)
                error = exc
                time.sleep(_REFUSED_PAUSE * (attempt + 1))
                continue
            error = self._publish(record_queue, holder_id, ttl_ms, persistent=False, headers=headers)
            if not isinstance(error, UnroutableError):
                break
        if isinstance(error, NotFound):
            raise_if_permanent(error, must_exist=True)
        if error is not None:
            raise error

    def _get(self, queue: str) -> Any:
        try:
            return self._call(lambda ch: ch.basic_get(queue, no_ack=False))
        except NotFound:
            return None

    def _lock_count(self, queue: str) -> int:
        try:
            return int(self._call(lambda ch: ch.queue_declare(queue, passive=True)).message_count)
        except NotFound:
            return 0

    def _delete_if_empty(self, queue: str) -> None:
        try:
            self._call(lambda ch: ch.queue_delete(queue, if_empty=True))
        except (NotFound, PreconditionFailed):
            pass  # gone already, or a new holder's token is in it: it stays

    def _call(self, operation: Any) -> Any:
        """Run ``operation(channel)``; a channel the broker closed (404, 406) is replaced before the error rises."""
        try:
            return operation(self._channel)
        except (NotFound, PreconditionFailed):
            close_quietly(self._channel)
            self._channel = self.connection.channel()
            raise


class _DeclareOks:
    """Durable ``queue.declare``s sent on one channel without waiting, and the wait for all their replies.

    py-amqp drops a reply nobody waits for, and waits for one method at a time: the replies
    (in the order of the declarations, on one channel) are counted by a listener instead.
    """

    def __init__(self, channel: Any):
        self.channel = channel
        self.sent = 0
        self.received = 0
        channel._callbacks[spec.Queue.DeclareOk] = self._on_reply

    def _on_reply(self, *_: Any) -> None:
        self.received += 1

    def send(self, queue: str, arguments: dict[str, Any]) -> None:
        self.channel.send_method(
            spec.Queue.Declare, "BsbbbbbF", (0, queue, False, True, False, False, False, arguments), wait=None
        )
        self.sent += 1

    def wait(self, connection: Any, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.received < self.sent:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishTimeoutError(f"no reply to a lock's queue.declare within {timeout:.0f}s")
            connection.drain_events(timeout=remaining)

    def close(self) -> None:
        self.channel._callbacks.pop(spec.Queue.DeclareOk, None)


def _body_text(message: Any) -> str:
    body = message.body
    return body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else str(body)


__all__ = ["DEFAULT_QUEUE_EXPIRES", "Acquired", "Held", "LockRequest", "UniqueLocks", "lock_ttl_ms"]
