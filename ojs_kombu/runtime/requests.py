"""Settle requests: what a handler thread asks the consumer loop to do with a delivery.

Only the loop's thread writes on the connection (AMQP-028): :meth:`Consumer.ack
<ojs_kombu.runtime.consumer.Consumer.ack>`, ``nack`` and ``republish`` put one of these on
:class:`SettleRequests` and wake the loop if it waits; the loop carries them out in order.
"""

from __future__ import annotations

import logging
import queue as queue_module
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from amqp import Channel

from ojs_kombu.amqp.outbox import Outbox
from ojs_kombu.amqp.publisher import ConfirmedPublisher, Destination, PublishTicket
from ojs_kombu.observability.logs import message_log_extra
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.runtime.delivery import Delivery
from ojs_kombu.runtime.wakeup import Wakeup
from ojs_kombu.runtime.window import Window

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Ack:
    """``Basic.Ack`` the delivery (``multiple=False``)."""

    delivery: Delivery


@dataclass(frozen=True, slots=True)
class Nack:
    """``Basic.Nack(requeue=False)`` the delivery: into its dead letter queue."""

    delivery: Delivery


@dataclass(frozen=True, slots=True)
class Republish:
    """Publish ``destination`` (confirmed), then ack the delivery; nack it if the publish fails.

    ``destination`` may be a callable asked for once ``prepare(connection, destination)``
    has run (a delay then runs from the publish, not from the request).  With ``then="nack"``
    the publish is a dead letter's final-failure record: the delivery is nacked after it,
    confirmed or not.
    """

    delivery: Delivery
    destination: Destination | Callable[[], Destination]
    queue: str
    prepare: Callable[[Any, Destination], None] | None = None
    then: Literal["ack", "nack"] = "ack"


@dataclass(frozen=True, slots=True)
class AckMany:
    """Ack a batch's deliveries (:mod:`~ojs_kombu.runtime.batching`): one ``Basic.Ack(multiple=True)``
    when they are exactly the channel's outstanding deliveries up to the highest of them, else
    one ``Basic.Ack`` each (in the same outbox flush).  ``delivery`` is the one with the highest tag."""

    delivery: Delivery
    deliveries: tuple[Delivery, ...]


#: One settle request.
SettleRequest = Ack | Nack | Republish | AckMany


class SettleRequests:
    """The requests made and not carried out yet: any thread puts, the loop's thread takes.

    Parameters:
        wakeup: the loop's self-pipe, used when the loop waits (:attr:`Wakeup.idle`).
    """

    def __init__(self, wakeup: Wakeup) -> None:
        self._queue: queue_module.SimpleQueue[SettleRequest] = queue_module.SimpleQueue()
        self.wakeup = wakeup
        #: Take the next request without waiting; raises :class:`queue.Empty` when there is none.
        self.take = self._queue.get_nowait
        #: Whether no request is waiting.
        self.empty = self._queue.empty

    def put(self, request: SettleRequest) -> None:
        """Add ``request`` (thread-safe); wake the loop if it waits."""
        self._queue.put(request)
        # Only a loop that waits in select() needs the pipe: a busy one carries out every request
        # made so far before it waits again.  idle is set before the loop's last look at the
        # queue, and read here after the put, so one of the two sees the other (see Wakeup.wait).
        if self.wakeup.idle:
            self.wakeup.wake()

    def drop_all(self) -> None:
        """Forget every request made so far (their connection is gone: the broker redelivers)."""
        while True:
            try:
                self._queue.get_nowait()
            except queue_module.Empty:
                return


class SettleExecutor:
    """Carries settle requests out on the consuming channel, in the loop's thread.

    Attached to each connection's channel, outbox and publisher (:meth:`attach`); a
    request of an older connection (its ``generation``) is dropped: its channel is gone
    and the broker redelivers the message.

    Parameters:
        requests: where the requests wait.
        window: counts what is settled.
    """

    def __init__(self, requests: SettleRequests, window: Window) -> None:
        self._requests = requests
        self._window = window
        self._channel: Channel | None = None
        self._outbox: Outbox | None = None
        self._publisher: ConfirmedPublisher | None = None
        self._generation = 0
        #: The delivery tags of the current channel not acked nor nacked yet (for :class:`AckMany`).
        self.outstanding: set[int] = set()
        #: ``Basic.Ack(multiple=True)`` frames written (an :class:`AckMany` each).
        self.multiple_acks = 0
        #: :class:`AckMany` requests acked one by one (their tags were not the outstanding ones).
        self.single_ack_batches = 0

    def attach(self, channel: Channel, outbox: Outbox, publisher: ConfirmedPublisher, generation: int) -> None:
        """Settle on ``channel`` from now on (deliveries of connection ``generation``)."""
        self._channel, self._outbox, self._publisher, self._generation = channel, outbox, publisher, generation
        self.outstanding = set()

    def delivered(self, delivery_tag: int) -> None:
        """The current channel delivered ``delivery_tag`` (in the loop's thread): outstanding until settled."""
        self.outstanding.add(delivery_tag)

    def detach(self) -> None:
        """The connection is gone: nothing can be settled until the next :meth:`attach`."""
        self._channel = self._outbox = self._publisher = None

    def execute(self) -> None:
        """Carry out the settle requests made so far.

        The acks and nacks of one pass are held in the connection's outbox and leave in one
        socket write, each its own frame, in order with a republish's frames (which go out
        with them, or before the publisher waits for anything).
        """
        box = self._outbox
        take = self._requests.take
        try:
            while True:
                try:
                    request = take()
                except queue_module.Empty:
                    return
                delivery = request.delivery
                if delivery.generation != self._generation:
                    continue  # its channel is gone; the broker redelivers it
                if type(request) is Republish:
                    self._republish(request)
                    continue
                if box is not None:
                    box.hold()  # again: a read (a republish's declaration) sent what was held
                if type(request) is Ack:
                    self.ack(delivery)
                elif type(request) is AckMany:
                    self.ack_many(request.deliveries)
                else:
                    self.nack(delivery)
        finally:
            if box is not None:
                box.flush()

    def finish(self, timeout: float) -> None:
        """The end of consuming: :meth:`execute` the last requests, wait for republishes to settle."""
        self.execute()
        if self._publisher is not None:
            self._publisher.wait_all(timeout=timeout)  # republishes settle (ack or nack) before we go

    def ack(self, delivery: Delivery) -> None:
        """``Basic.Ack`` ``delivery`` now (in the outbox: held during a pass)."""
        channel, box = self._channel, self._outbox
        assert channel is not None and box is not None  # only settled while connected (same generation)
        box.ack(channel, delivery.delivery_tag)
        self.outstanding.discard(delivery.delivery_tag)
        self._window.settled(delivery.queue, METRICS.messages_acked)

    def ack_many(self, deliveries: tuple[Delivery, ...]) -> None:
        """Ack ``deliveries`` now: one ``Basic.Ack(multiple=True)`` when their tags are every outstanding
        tag up to the highest of them (``multiple`` acks all of those: one of another handler's, or a
        republish's waiting for its confirm, must not be), else one ``Basic.Ack`` each."""
        channel, box = self._channel, self._outbox
        assert channel is not None and box is not None  # only settled while connected (same generation)
        deliveries = tuple(d for d in deliveries if d.generation == self._generation)  # others: redelivered
        tags = {d.delivery_tag for d in deliveries}
        if not tags:
            return
        top = max(tags)
        outstanding = self.outstanding
        if len(tags) > 1 and tags <= outstanding and sum(1 for t in outstanding if t <= top) == len(tags):
            box.ack_multiple(channel, top)
            outstanding.difference_update(tags)
            self.multiple_acks += 1
            settled = self._window.settled
            for delivery in deliveries:
                settled(delivery.queue, METRICS.messages_acked)
            return
        if len(tags) > 1:
            self.single_ack_batches += 1
        for delivery in deliveries:
            self.ack(delivery)

    def nack(self, delivery: Delivery) -> None:
        """``Basic.Nack(requeue=False)`` ``delivery`` now: dead-lettered."""
        channel, box = self._channel, self._outbox
        assert channel is not None and box is not None  # only settled while connected (same generation)
        box.nack(channel, delivery.delivery_tag)
        self.outstanding.discard(delivery.delivery_tag)
        self._window.settled(delivery.queue, METRICS.messages_nacked)

    def _republish(self, request: Republish) -> None:
        assert self._publisher is not None  # connected
        delivery = request.delivery
        self._publisher.publish_when_ready(
            request.destination,
            queue=request.queue,
            prepare=request.prepare,
            on_done=lambda ticket: self._after_republish(delivery, ticket, request.then),
        )

    def _after_republish(self, delivery: Delivery, ticket: PublishTicket, then: str) -> None:
        if delivery.generation != self._generation:
            return
        if ticket.error is None:
            if then == "ack":
                self.ack(delivery)
            else:
                self.nack(delivery)
            return
        if then == "nack":
            logger.error(
                "recording the final failure of job %s failed (%s); dead-lettering it without the record",
                delivery.properties.get("message_id"),
                ticket.error,
                extra=message_log_extra(delivery.properties.get("message_id"), delivery.queue),
            )
            self.nack(delivery)
            return
        logger.error(
            "republishing job %s failed (%s); sending it to its dead letter queue",
            ticket.job_id,
            ticket.error,
            extra=message_log_extra(ticket.job_id, delivery.queue),
        )
        self.nack(delivery)


__all__ = ["Ack", "AckMany", "Nack", "Republish", "SettleExecutor", "SettleRequest", "SettleRequests"]
