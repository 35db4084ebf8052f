"""The ``ojs://`` channel's side of the settle path: the runtime's :class:`Settler` over a kombu channel.

The transport does not settle jobs itself: it builds a
:class:`~ojs_kombu.runtime.consumer.Delivery` from the raw py-amqp message
(:func:`delivery_of`) and hands it to the same
:class:`~ojs_kombu.runtime.settle.Settler` the Worker and the Dramatiq consumer
use, with a :class:`ChannelSettlement` as its
:class:`~ojs_kombu.runtime.settle.Settlement`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import amqp

from ojs_kombu.amqp.publisher import ConfirmedPublisher, Destination, PublishTicket
from ojs_kombu.runtime.consumer import Delivery
from ojs_kombu.wire.codec import ACCEPTED_CONTENT_TYPES, CONTENT_TYPE
from ojs_kombu.wire.headers import Header

logger = logging.getLogger(__name__)


class SettlingChannel(Protocol):
    """What :class:`ChannelSettlement` needs of the channel (:class:`~ojs_kombu.transport.channel.Channel`)."""

    @property
    def is_open(self) -> bool:
        """Whether the channel can still settle its deliveries."""

    @property
    def publisher(self) -> ConfirmedPublisher:
        """The connection's confirmed publisher."""

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        """``Basic.Ack``."""

    def basic_nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = False) -> None:
        """``Basic.Nack``."""


class ChannelSettlement:
    """A :class:`~ojs_kombu.runtime.settle.Settlement` over an ``ojs://`` channel.

    Runs in the thread that owns the connection (kombu's consumer thread or
    event loop), like every call the framework makes on the channel.

    Parameters:
        channel: the channel the deliveries came from.
    """

    def __init__(self, channel: SettlingChannel):
        self.channel = channel

    def ack(self, delivery: Delivery) -> None:
        """``Basic.Ack`` ``delivery``."""
        self.channel.basic_ack(delivery.delivery_tag)

    def nack(
        self,
        delivery: Delivery,
        record: Destination | None = None,
        prepare: Callable[[Any, Destination], None] | None = None,
    ) -> None:
        """``Basic.Nack(requeue=False)`` ``delivery`` (into its dead letter queue).

        With ``record`` (the job's final failure), ``record`` is published through the
        connection's confirmed publisher first (after ``prepare``) and the nack follows its
        confirm (or its refusal); never blocking the caller.
        """
        if record is None:
            self.channel.basic_nack(delivery.delivery_tag)
            return
        channel = self.channel

        def settle(ticket: PublishTicket) -> None:
            if not channel.is_open:
                return  # the broker redelivers the original
            if ticket.error is not None:
                logger.error(
                    "recording the final failure of job %s failed (%s); dead-lettering it without the record",
                    delivery.properties.get("message_id"),
                    ticket.error,
                )
            channel.basic_nack(delivery.delivery_tag)

        channel.publisher.publish_when_ready(record, queue=delivery.queue, prepare=prepare, on_done=settle)

    def republish(
        self,
        delivery: Delivery,
        destination: Destination | Callable[[], Destination],
        queue: str,
        prepare: Callable[[Any, Destination], None] | None = None,
    ) -> None:
        """Publish ``destination`` through the connection's confirmed publisher, then ack ``delivery``.

        The publisher (its channel set up first) carries it out with
        :meth:`~ojs_kombu.amqp.publisher.ConfirmedPublisher.publish_when_ready`: ``prepare``,
        then a callable ``destination`` is asked for.  The confirm is read whenever the
        connection is next drained (the framework's consumer loop), so a delivery callback
        never blocks on it.  If the broker refuses the publish, ``delivery`` is nacked into
        its dead letter queue; if the channel has closed meanwhile, the broker redelivers
        the original.
        """
        channel = self.channel

        def settle(ticket: PublishTicket) -> None:
            if not channel.is_open:
                return
            if ticket.error is None:
                channel.basic_ack(delivery.delivery_tag)
            else:
                logger.error(
                    "republishing job %s failed (%s); sending it to its dead letter queue", ticket.job_id, ticket.error
                )
                channel.basic_nack(delivery.delivery_tag)

        channel.publisher.publish_when_ready(destination, queue=queue, prepare=prepare, on_done=settle)


def is_envelope(properties: dict[str, Any]) -> bool:
    """Whether a message of these AMQP properties is an OJS envelope: the OJS content type, or JSON
    carrying the binding's headers (lenient producers)."""
    content_type = properties.get("content_type")
    if content_type == CONTENT_TYPE:  # what this library sends: nothing to normalise
        return True
    content_type = (content_type or "").split(";")[0].strip().lower()
    if content_type == CONTENT_TYPE:
        return True
    headers = properties.get("application_headers") or {}
    return content_type in ACCEPTED_CONTENT_TYPES and Header.QUEUE in headers and "task" not in headers


def delivery_of(raw: amqp.Message, queue: str) -> Delivery:
    """The runtime's :class:`Delivery` of a raw py-amqp message from OJS queue ``queue``."""
    return delivery_from(raw.properties, raw.body, raw.delivery_info, queue)


def delivery_from(properties: dict[str, Any], body: bytes | str, info: dict[str, Any], queue: str) -> Delivery:
    """The runtime's :class:`Delivery` of a message from OJS queue ``queue``, from its parts.

    Parameters:
        properties: its AMQP properties, the headers in ``application_headers`` (not modified).
        body: its body (text, as py-amqp decodes it, is encoded back to UTF-8).
        info: its ``delivery_tag``, ``redelivered``, ``exchange`` and ``routing_key``.
        queue: the OJS queue it was delivered from.

    Returns:
        The delivery, with its own properties and headers dicts.
    """
    properties = dict(properties)
    headers = dict(properties.pop("application_headers", None) or {})
    if not isinstance(body, bytes):
        body = str(body).encode("utf-8")
    return Delivery(
        body=body,
        properties=properties,
        headers=headers,
        delivery_tag=info["delivery_tag"],
        redelivered=bool(info.get("redelivered")),
        exchange=info.get("exchange", ""),
        routing_key=info.get("routing_key", ""),
        queue=queue,
        generation=0,  # the channel's deliveries die with it: ChannelSettlement checks is_open
    )


__all__ = ["ChannelSettlement", "SettlingChannel", "delivery_from", "delivery_of", "is_envelope"]
