"""Confirmed, pipelined publishing on one AMQP channel (binding §5.1, AMQP-014..016).

py-amqp's own confirm mode waits for each confirm before the next publish and
matches confirms by arrival order, so a ``Basic.Return`` in the middle of a
wait leaves an Ack unread for the next publish to consume.  This publisher
instead puts the channel in confirm mode itself, numbers its publishes (the
delivery tags of confirm mode), and resolves each one from the broker's
``Basic.Ack`` / ``Basic.Nack`` (``multiple`` honoured) and ``Basic.Return``:

* Ack after a Return for that message -> :class:`UnroutableError` for that job only;
* Nack -> :class:`PublishNackedError`;
* no answer before the deadline -> :class:`PublishTimeoutError`.

After a ``Basic.Nack`` the publisher moves to a fresh channel for its next publish, once
every publish of the old channel is settled: on RabbitMQ 3.10 a channel that published to a
quorum queue while its leader was being elected keeps the dead leader, and every later
publish of that channel to the queue is nacked (``docs/cluster.md``); a new channel reads
the current leader.  The Client, the consumers' republishes (retries, early deliveries, dead
letters) and the ``ojs://`` transport all publish through this class, so all follow that rule.

A channel is never shared between threads: one publisher per pooled connection.
A pipelined batch (``publish(..., flush=False)``) is buffered and written with one
socket write per :data:`~ojs_kombu.amqp.publish_buffer.FLUSH_BYTES` (see
:mod:`ojs_kombu.amqp.publish_buffer`); that is for a connection its thread owns
alone, such as the :class:`~ojs_kombu.Client`'s pooled ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from amqp import Connection, Message, spec
from amqp.serialization import dumps

from ojs_kombu.amqp.connection import close_quietly
from ojs_kombu.amqp.properties import WireMessage
from ojs_kombu.amqp.publish_buffer import FLUSH_BYTES, PublishBuffer, method_frame
from ojs_kombu.errors import PublishError, PublishNackedError, PublishTimeoutError, UnroutableError
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.wire.codec import OutgoingMessage

#: A message and where to publish it: ``(message, exchange, routing_key)``.
Destination = tuple[OutgoingMessage, str, str]


@dataclass(slots=True)
class PublishTicket:
    """One publish awaiting its confirm.  ``error`` is set when it failed."""

    tag: int
    job_id: str | None
    queue: str
    exchange: str
    routing_key: str
    started: float = field(default_factory=time.perf_counter)
    done: bool = False
    returned: UnroutableError | None = None
    error: PublishError | None = None
    on_done: Callable[[PublishTicket], None] | None = None

    def settle(self, error: PublishError | None) -> None:
        """Record the broker's answer and run the ``on_done`` callback."""
        self.done = True
        self.error = error
        if self.on_done is not None:
            self.on_done(self)

    def raise_for_error(self) -> None:
        """Raise the publish error, if any."""
        if self.error is not None:
            raise self.error


class ConfirmedPublisher:
    """Publishes on one channel in confirm mode and matches confirms by delivery tag.

    ``window`` bounds the number of unconfirmed publishes: past it, ``publish``
    reads confirms until half the window is free, so a large batch never
    buffers without limit in the broker or in this process.  ``renew_on_nack=False``
    keeps the channel after a ``Basic.Nack``: for a publisher whose nacks are answers, not
    faults (the unique locks' ``reject-publish`` classic queues, :mod:`ojs_kombu.amqp.locks`).
    """

    def __init__(self, connection: Connection, *, window: int = 1000, renew_on_nack: bool = True):
        self.connection = connection
        self.window = window
        self.renew_on_nack = renew_on_nack
        self._unconfirmed: dict[int, PublishTicket] = {}
        self._buffered: dict[str, int] = {}  # queue -> publishes in the buffer, counted when written
        #: A wait for confirms expired on this publisher: its node may confirm nothing more (a
        #: minority partition, a memory alarm), so its owner should drop the connection.
        self.timed_out = False
        #: Called when a wait for confirms has read nothing for a second (the broker stalls).
        self.on_stall: Callable[[], None] | None = None
        self._open_channel()

    def _open_channel(self) -> None:
        """Publish on a new channel in confirm mode from now on (its delivery tags start at 1)."""
        self.channel = self.connection.channel()
        self.channel.confirm_select()
        self.channel.events["basic_ack"].add(self._on_ack)
        self.channel.events["basic_nack"].add(self._on_nack)
        self.channel.events["basic_return"].add(self._on_return)
        self._methods: dict[tuple[str, str], tuple[bytes, bytes]] = {}  # method args and frame (channel id)
        self._last_tag = 0
        self._buffer = PublishBuffer(self.connection, self.channel.channel_id)
        self._nacked = False  # a Basic.Nack arrived on this channel: renew it (see the module docstring)

    def _renew_channel(self) -> None:
        """Close the nacked channel and open a fresh one; only when none of its publishes is pending."""
        old = self.channel
        # Its tags would match the new channel's tickets: nothing it still says may reach them.
        for event, handler in (
            ("basic_ack", self._on_ack),
            ("basic_nack", self._on_nack),
            ("basic_return", self._on_return),
        ):
            old.events[event].discard(handler)
        close_quietly(old)
        self._open_channel()

    @property
    def is_open(self) -> bool:
        """Whether the channel can still be used."""
        return bool(self.channel.is_open and self.connection.connected)

    @property
    def unconfirmed(self) -> int:
        """Publishes still waiting for their confirm."""
        return len(self._unconfirmed)

    def publish(
        self,
        message: OutgoingMessage,
        *,
        exchange: str,
        routing_key: str,
        queue: str,
        job_id: str | None = None,
        confirm_timeout: float = 30.0,
        on_done: Callable[[PublishTicket], None] | None = None,
        flush: bool = True,
    ) -> PublishTicket:
        """Send one message with ``mandatory=True``; return its ticket without waiting.

        Parameters:
            message: what to publish.
            exchange, routing_key: where to.
            queue: the job queue it is for (metrics, errors).
            job_id: the job's id (errors, matching a ``Basic.Return``).
            confirm_timeout: how long a full window waits for confirms.
            on_done: ``on_done(ticket)`` runs when the broker's confirm (or its absence) settles it.
            flush: ``False`` buffers the frames (pipelining from the connection's owner thread):
                they are written with the buffer, at the latest when confirms are read
                (:meth:`wait`, :meth:`wait_all`, a full window) or by :meth:`flush`.

        Returns:
            The publish's ticket.

        Raises:
            ValueError: a property does not fit its AMQP type.
            OSError and py-amqp's connection errors: the connection failed.
        """
        self._renew_if_nacked()
        # Straight to the frames: py-amqp's basic_publish may be its one-at-a-time
        # confirm wrapper, and its plain version polls the socket before every publish.
        method = self._methods.get((exchange, routing_key)) or self._method(exchange, routing_key)
        method_args, frame = method
        if flush:
            self.flush()  # what is buffered goes first: the broker numbers publishes in arrival order
            msg = WireMessage(message.body, application_headers=message.headers, **message.properties)
            self.connection.frame_writer(1, self.channel.channel_id, spec.Basic.Publish, method_args, msg)
            METRICS.published(queue)
        else:
            self._buffer.add(frame, message)
            self._buffered[queue] = self._buffered.get(queue, 0) + 1
            if len(self._buffer) >= FLUSH_BYTES:
                self.flush()
        self._last_tag += 1
        ticket = PublishTicket(self._last_tag, job_id, queue, exchange, routing_key, on_done=on_done)
        self._unconfirmed[ticket.tag] = ticket
        if len(self._unconfirmed) >= self.window:
            self._drain(lambda: len(self._unconfirmed) < self.window // 2, confirm_timeout)
        return ticket

    def publish_when_ready(
        self,
        destination: Destination | Callable[[], Destination],
        *,
        queue: str,
        prepare: Callable[[Connection, Destination], None] | None = None,
        job_id: str | None = None,
        confirm_timeout: float = 30.0,
        on_done: Callable[[PublishTicket], None] | None = None,
        flush: bool = True,
    ) -> PublishTicket:
        """Publish what ``destination`` says once nothing is left to wait for: as :meth:`publish`.

        A delayed job (the scheduling cascade, a retry queue) is due a delay after its
        publish, so every wait between measuring the delay and publishing makes it that much
        late.  Here what can wait comes first: ``prepare`` (declarations: a fresh cascade of
        35 quorum queues takes up to a second on a loaded broker) and this publisher's new
        channel after a ``Basic.Nack``; then ``destination()`` is asked for and published at
        once.  If it needs another exchange or routing key than the one just prepared (a
        retry's ladder step went down meanwhile), that one is prepared and asked for again;
        the delay only shrinks, so this ends.

        Parameters:
            destination: ``(message, exchange, routing_key)``, or what computes it from the clock.
            queue: the job queue it is for (metrics, errors).
            prepare: ``prepare(connection, destination)`` declares what a publish to the
                destination's exchange and routing key needs (cheap once declared).
            job_id: the job's id (errors, a ``Basic.Return``); default the message's ``message_id``.
            confirm_timeout, on_done, flush: as :meth:`publish`.

        Returns:
            The publish's ticket.

        Raises:
            What ``prepare`` and :meth:`publish` raise.
        """
        prepared: Destination | None = None
        while True:
            self._renew_if_nacked()
            current = destination() if callable(destination) else destination
            if prepare is None or (prepared is not None and current[1:] == prepared[1:]):
                break
            prepare(self.connection, current)
            prepared = current
        message, exchange, routing_key = current
        return self.publish(
            message,
            exchange=exchange,
            routing_key=routing_key,
            queue=queue,
            job_id=job_id if job_id is not None else message.properties.get("message_id"),
            confirm_timeout=confirm_timeout,
            on_done=on_done,
            flush=flush,
        )

    def _renew_if_nacked(self) -> None:
        if self._nacked and not self._unconfirmed:
            self._renew_channel()

    def publish_job(
        self,
        body: bytes,
        job_id: str,
        template: tuple[bytes, bytes],
        *,
        exchange: str,
        routing_key: str,
        queue: str,
        confirm_timeout: float = 30.0,
    ) -> PublishTicket:
        """Buffer a job's publish, as ``publish(..., flush=False)``, from its body and encoded properties.

        A batch's jobs share their properties but for the message id: ``template`` holds them
        encoded around it (:func:`~ojs_kombu.amqp.properties.properties_template`), so the
        frames are built without a property dict per job.  The message id is ``job_id``.

        Parameters:
            body: the message body.
            job_id: the job's id: the message id, and what a ``Basic.Return`` is matched by.
            template: the encoded properties before and after the message id.
            exchange, routing_key: where to.
            queue: the job queue it is for (metrics, errors).
            confirm_timeout: how long a full window waits for confirms.

        Returns:
            The publish's ticket.

        Raises:
            ValueError: the job id is longer than 255 bytes.
            OSError and py-amqp's connection errors: the connection failed.
        """
        self._renew_if_nacked()
        method = self._methods.get((exchange, routing_key)) or self._method(exchange, routing_key)
        buffered = self._buffer.add_job(method[1], template, job_id, body)
        self._buffered[queue] = self._buffered.get(queue, 0) + 1
        if buffered >= FLUSH_BYTES:
            self.flush()
        tag = self._last_tag = self._last_tag + 1
        ticket = self._unconfirmed[tag] = PublishTicket(tag, job_id, queue, exchange, routing_key)
        if len(self._unconfirmed) >= self.window:
            self._drain(lambda: len(self._unconfirmed) < self.window // 2, confirm_timeout)
        return ticket

    def _method(self, exchange: str, routing_key: str) -> tuple[bytes, bytes]:
        """The ``Basic.Publish`` arguments and frame (``mandatory``) for this channel, remembered."""
        method_args = dumps("Bssbb", (0, exchange, routing_key, True, False))  # mandatory=True
        method = (method_args, method_frame(self.channel.channel_id, method_args))
        if len(self._methods) >= 1024:
            self._methods.clear()
        self._methods[(exchange, routing_key)] = method
        return method

    def flush(self) -> None:
        """Write the publishes buffered by ``publish(..., flush=False)``.

        Raises:
            OSError and py-amqp's connection errors: the write failed (the connection is lost).
        """
        if self._buffered:
            counts, self._buffered = self._buffered, {}
            self._buffer.flush()
            for queue, count in counts.items():
                METRICS.published(queue, count)

    def wait(self, tickets: Iterable[PublishTicket], timeout: float = 30.0) -> None:
        """Read confirms until every ticket is resolved; time out the rest."""
        pending = [t for t in tickets if not t.done]
        self._drain(lambda: all(t.done for t in pending), timeout)

    def wait_all(self, timeout: float = 30.0) -> None:
        """Read confirms until nothing is unconfirmed."""
        self._drain(lambda: not self._unconfirmed, timeout)

    def _drain(self, done: Callable[[], bool], timeout: float) -> None:
        self.flush()
        deadline = time.monotonic() + timeout
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._expire_all(timeout)
                return
            try:
                self.connection.drain_events(timeout=min(remaining, 1.0))
            except TimeoutError:
                if self.on_stall is not None:
                    self.on_stall()
                continue

    def _expire_all(self, timeout: float) -> None:
        expired = list(self._unconfirmed.values())
        self._unconfirmed.clear()
        self.timed_out = self.timed_out or bool(expired)
        for ticket in expired:
            ticket.settle(
                PublishTimeoutError(
                    f"no publisher confirm within {timeout:.1f}s for job {ticket.job_id}", job_id=ticket.job_id
                )
            )

    def _settle(self, delivery_tag: int, multiple: bool) -> list[PublishTicket]:
        if multiple:
            tags = []
            for tag in self._unconfirmed:  # in publish order, so ascending: stop at the first one after
                if tag > delivery_tag:
                    break
                tags.append(tag)
        else:
            tags = [delivery_tag] if delivery_tag in self._unconfirmed else []
        return [self._unconfirmed.pop(tag) for tag in tags]

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        # While a full window waits for this ack the broker may have nothing left to do: settle
        # its publishes quickly (a multiple ack covers hundreds), so the next ones go out sooner.
        now = time.perf_counter()
        settled = self._settle(delivery_tag, multiple)
        METRICS.confirmed_many([now - ticket.started for ticket in settled])
        for ticket in settled:
            ticket.done = True  # PublishTicket.settle, inline
            ticket.error = ticket.returned
            if ticket.on_done is not None:
                ticket.on_done(ticket)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._nacked = self.renew_on_nack
        for ticket in self._settle(delivery_tag, multiple):
            METRICS.nacked_publish(ticket.queue)
            ticket.settle(
                PublishNackedError(
                    f"broker refused job {ticket.job_id} (Basic.Nack) on queue {ticket.queue!r}; "
                    "is the queue full (x-overflow=reject-publish)?",
                    job_id=ticket.job_id,
                )
            )

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Message) -> None:
        # The Return precedes the Ack of the same message; mark the oldest
        # unconfirmed publish of that message id.
        message_id = message.properties.get("message_id")
        for ticket in self._unconfirmed.values():
            if ticket.job_id == message_id and ticket.returned is None:
                ticket.returned = UnroutableError(
                    f"job {message_id} is unroutable: no queue is bound to {exchange!r} with key "
                    f"{routing_key!r} ({getattr(exc, 'reply_text', exc)})",
                    job_id=message_id,
                    reply_code=getattr(exc, "reply_code", 312),
                    exchange=exchange,
                    routing_key=routing_key,
                )
                METRICS.returned(ticket.queue)
                return

    def close(self) -> None:
        """Close the channel (best effort)."""
        close_quietly(self.channel)


__all__ = ["ConfirmedPublisher", "Destination", "PublishTicket"]
