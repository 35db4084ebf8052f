"""A direct decoder of one delivered message: ``Basic.Deliver`` + content header + body frames.

py-amqp turns a delivery into a ``Message`` through its frame handler (three frames, a
partial message per channel), ``Connection.on_inbound_method``, ``dispatch_method`` (the
arguments decoded by the generic ``loads``) and ``Channel._on_basic_deliver`` (a
``delivery_info`` dict); about a third of the consumer thread's time per job.  When all the
frames of a delivery are already buffered (they nearly always are: they arrive together),
:func:`read_delivery` decodes them in one go: the arguments with one ``struct`` per
field and the properties with py-amqp's own ``decode_properties_basic``, so the result is
the same as py-amqp's.  Anything else (a frame of another type or channel in between, an
incomplete delivery, another content class) is left to py-amqp: :func:`read_delivery`
returns ``None`` and consumes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from struct import error as StructError
from typing import Any, NamedTuple

from amqp.serialization import decode_properties_basic

#: The payload of a ``Basic.Deliver`` method frame starts with class 60, method 60.
DELIVER_SIGNATURE = b"\x00\x3c\x00\x3c"

_FRAME_HEADER = Struct(">BHI")  # frame type, channel, payload size
_TAG_AND_FLAG = Struct(">QB")  # delivery-tag, redelivered (the bit in its own octet)
_CONTENT_HEADER = Struct(">HxxQ")  # class, weight (ignored), body size
_FRAME_END = 0xCE
_CONTENT_HEADER_FRAME = 2
_BODY_FRAME = 3
_BASIC_CLASS = 60

_decode_properties: Callable[[bytes, int], tuple[dict[str, Any], int]] = decode_properties_basic


class RawDelivery(NamedTuple):
    """A delivered message as the frames carry it (the arguments of ``Basic.Deliver``, the
    content header's properties, the body)."""

    consumer_tag: str
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: dict[str, Any]
    body: bytes


def _shortstr(buf: bytes, offset: int) -> tuple[str, int]:
    end = offset + 1 + buf[offset]
    return buf[offset + 1 : end].decode("utf-8", "surrogatepass"), end  # as py-amqp's loads('s')


def read_delivery(buf: bytes, pos: int) -> tuple[RawDelivery, int, int] | None:
    """Decode the delivery whose ``Basic.Deliver`` method frame starts at ``buf[pos]``.

    Parameters:
        buf: received bytes.
        pos: where the method frame starts (its type, channel and size header); the
            caller has checked that it is a method frame whose payload starts with
            :data:`DELIVER_SIGNATURE`.

    Returns:
        ``(delivery, end, frames)``: the delivery, the position after its last frame and
        how many frames it took; or ``None`` when the delivery is not complete in ``buf``
        or is not a plain basic delivery on one channel (then py-amqp reads it).
    """
    try:
        return _read(buf, pos)
    except (IndexError, StructError):  # a malformed frame: py-amqp reports it
        return None


def _read(buf: bytes, pos: int) -> tuple[RawDelivery, int, int] | None:
    length = len(buf)
    _, channel, size = _FRAME_HEADER.unpack_from(buf, pos)
    end = pos + 7 + size
    if end >= length or buf[end] != _FRAME_END:
        return None
    consumer_tag, offset = _shortstr(buf, pos + 11)
    delivery_tag, flags = _TAG_AND_FLAG.unpack_from(buf, offset)
    exchange, offset = _shortstr(buf, offset + 9)
    routing_key, offset = _shortstr(buf, offset)
    if offset != end:
        return None
    header = end + 1
    if header + 7 > length:
        return None
    frame_type, header_channel, size = _FRAME_HEADER.unpack_from(buf, header)
    end = header + 7 + size
    if frame_type != _CONTENT_HEADER_FRAME or header_channel != channel or end >= length or buf[end] != _FRAME_END:
        return None
    class_id, body_size = _CONTENT_HEADER.unpack_from(buf, header + 7)
    if class_id != _BASIC_CLASS:
        return None
    properties, _ = _decode_properties(buf, header + 19)
    position, frames, received = end + 1, 2, 0
    chunks: list[bytes] = []
    while received < body_size:
        if position + 7 > length:
            return None
        frame_type, body_channel, size = _FRAME_HEADER.unpack_from(buf, position)
        end = position + 7 + size
        if frame_type != _BODY_FRAME or body_channel != channel or end >= length or buf[end] != _FRAME_END:
            return None
        chunks.append(buf[position + 7 : end])
        received += size
        frames += 1
        position = end + 1
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    delivery = RawDelivery(consumer_tag, delivery_tag, bool(flags & 1), exchange, routing_key, properties, body)
    return delivery, position, frames


__all__ = ["DELIVER_SIGNATURE", "RawDelivery", "read_delivery"]
