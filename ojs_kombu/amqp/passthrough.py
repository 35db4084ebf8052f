"""What the ``ojs://`` channel needs of py-amqp's channel internals, in one place.

The transport's channel subclasses py-amqp's and rewrites what passes through it; where that
takes more than py-amqp's public methods (its one-at-a-time confirm mode for pass-through
traffic, a real ``Basic.Nack``, the delivery decoding of the connection's frame reader),
it goes through the small functions here, so py-amqp's private names stay under ``amqp/``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import amqp
from amqp import spec
from amqp.exceptions import ConsumerCancelled, MessageNacked

from ojs_kombu.amqp.delivery import RawDelivery
from ojs_kombu.amqp.framing import FrameReader

_C = TypeVar("_C", bound=type[amqp.Channel])


def publishes_through_basic_publish(cls: _C) -> _C:
    """Class decorator: py-amqp's confirm wrapper (``_basic_publish``) calls the class's ``basic_publish``.

    Parameters:
        cls: a py-amqp channel class overriding ``basic_publish``.

    Returns:
        ``cls``.
    """
    cls._basic_publish = cls.basic_publish
    return cls


def without_confirm_wrapper(channel: amqp.Channel) -> None:
    """Drop the one-at-a-time confirm wrapper py-amqp swaps in per instance (``confirm_publish``):
    the channel's own ``basic_publish`` decides per message."""
    channel.__dict__.pop("basic_publish", None)


def publish_plain(
    channel: amqp.Channel,
    msg: amqp.Message,
    exchange: str,
    routing_key: str,
    mandatory: bool,
    immediate: bool,
    timeout: float | None,
    confirm_timeout: float | None,
    argsig: str,
) -> Any:
    """py-amqp's own publish, confirmed one at a time when the connection has ``confirm_publish``.

    Parameters:
        channel: the channel to publish on.
        msg, exchange, routing_key, mandatory, immediate, timeout, argsig: py-amqp's ``basic_publish``'s.
        confirm_timeout: how long to wait for the confirm (default ``timeout``).

    Returns:
        What py-amqp's ``basic_publish`` returns.

    Raises:
        MessageNacked: the broker refused the message.
    """
    confirm = channel.connection.confirm_publish
    if confirm and not channel._confirm_selected:
        channel._confirm_selected = True
        channel.confirm_select()
    result = amqp.Channel._basic_publish(
        channel, msg, exchange, routing_key, mandatory, immediate, timeout, argsig=argsig
    )
    if confirm:

        def on_confirm(method: Any, *args: Any) -> None:
            if method == spec.Basic.Nack:
                raise MessageNacked()

        channel.wait([spec.Basic.Ack, spec.Basic.Nack], callback=on_confirm, timeout=confirm_timeout or timeout)
    return result


def send_nack(channel: amqp.Channel, delivery_tag: int, multiple: bool, requeue: bool) -> None:
    """A real ``Basic.Nack`` (py-amqp has no ``basic_nack``)."""
    channel.send_method(spec.Basic.Nack, "Lbb", (delivery_tag, multiple, requeue))


def consumer_cancelled(consumer_tag: str) -> ConsumerCancelled:
    """The error py-amqp raises for a broker ``Basic.Cancel``, which kombu answers by consuming again."""
    return ConsumerCancelled(consumer_tag, spec.Basic.Cancel)


def decode_deliveries(
    channel: amqp.Channel, reader: FrameReader | None, on_delivery: Callable[[RawDelivery], bool]
) -> None:
    """Have the connection's frame reader decode ``channel``'s deliveries, unless another open channel has it.

    One channel per connection can: the first that consumes, or the next one once it has closed.

    Parameters:
        channel: the consuming channel.
        reader: the connection's frame reader (None on TLS: py-amqp reads every frame).
        on_delivery: as :meth:`FrameReader.decode_deliveries`.
    """
    if reader is None:
        return
    current = channel.connection.channels.get(reader.deliveries_channel)
    if current is None or current is channel or not getattr(current, "is_open", False):
        reader.decode_deliveries(channel.channel_id, on_delivery)


__all__ = [
    "consumer_cancelled",
    "decode_deliveries",
    "publish_plain",
    "publishes_through_basic_publish",
    "send_nack",
    "without_confirm_wrapper",
]
