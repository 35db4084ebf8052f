"""Many ``Basic.Publish`` frame sets written with one socket write.

py-amqp's frame writer sends each message (method, content header and body
frames) with its own ``sendall``: on a pipelined batch that was the largest
single cost per job.  :class:`PublishBuffer` builds the same frames and keeps
them in the connection's :class:`~ojs_kombu.amqp.outbox.Outbox`, in order with
every other frame of the connection, until :meth:`PublishBuffer.flush` (or the
outbox, before the next frame or read) writes them all at once; the frames on
the wire are the ones py-amqp would write (the unit tests decode them with
py-amqp's own frame handler).

The outbox writes outside py-amqp's per-connection write lock, so the buffer is
for the thread that owns the connection (as
:class:`~ojs_kombu.amqp.publisher.ConfirmedPublisher` is).
"""

from __future__ import annotations

import struct

from amqp import Connection, spec

from ojs_kombu.amqp.outbox import outbox
from ojs_kombu.amqp.properties import encode_properties, shortstr
from ojs_kombu.wire.codec import OutgoingMessage

#: Buffered bytes past which a publisher flushes (a batch never buffers without bound).
FLUSH_BYTES = 128 * 1024

_FRAME_HEADER = struct.Struct(">BHI")  # frame type, channel, payload size
_CONTENT_HEADER = struct.Struct(">BHIHHQ")  # frame header, then class id, weight, body size
_FRAME_END = b"\xce"
_LENGTH = tuple(bytes((n,)) for n in range(256))  # a short string's length octet
_METHOD, _HEADER, _BODY = 1, 2, 3
_PUBLISH_METHOD = struct.pack(">HH", *spec.Basic.Publish)
_BASIC_CLASS = spec.Basic.Publish[0]


def method_frame(channel_id: int, method_args: bytes) -> bytes:
    """The ``Basic.Publish`` method frame with its encoded arguments.

    Parameters:
        channel_id: the channel it goes on.
        method_args: ``dumps("Bssbb", (ticket, exchange, routing_key, mandatory, immediate))``.

    Returns:
        The whole frame (header, payload, frame end).
    """
    payload = _PUBLISH_METHOD + method_args
    return _FRAME_HEADER.pack(_METHOD, channel_id, len(payload)) + payload + _FRAME_END


def content_frames(channel_id: int, message: OutgoingMessage, frame_max: int) -> bytes:
    """The content header frame and the body frames of ``message``, as py-amqp splits them.

    Parameters:
        channel_id: the channel it goes on.
        message: body, properties and headers table.
        frame_max: the connection's negotiated frame size; a body frame's payload holds at most
            ``frame_max - 8`` bytes.

    Returns:
        The frames in wire order, joined (no body frame for an empty body).

    Raises:
        ValueError: a property does not fit its AMQP type (a short string over 255 bytes).
    """
    return _content(channel_id, encode_properties(message.properties, message.headers), message.body, frame_max)


def _content(channel_id: int, properties: bytes, body: bytes, frame_max: int) -> bytes:
    """The content header frame of the encoded ``properties`` and the body frames of ``body``."""
    size = len(body)
    header = (
        _CONTENT_HEADER.pack(_HEADER, channel_id, 12 + len(properties), _BASIC_CLASS, 0, size) + properties + _FRAME_END
    )
    chunk = frame_max - 8
    if size <= chunk:  # the common case: one body frame, or none
        return header + _FRAME_HEADER.pack(_BODY, channel_id, size) + body + _FRAME_END if size else header
    frames = [header]
    for start in range(0, size, chunk):
        part = body[start : start + chunk]
        frames.append(_FRAME_HEADER.pack(_BODY, channel_id, len(part)) + part + _FRAME_END)
    return b"".join(frames)


class PublishBuffer:
    """Frames of publishes on one channel, kept in the connection's outbox and written together by :meth:`flush`.

    Parameters:
        connection: the py-amqp connection; only its owner thread may use the buffer.
        channel_id: the channel the publishes go on.
    """

    def __init__(self, connection: Connection, channel_id: int) -> None:
        self.connection = connection
        self.channel_id = channel_id
        self._outbox = outbox(connection)
        self._frames = self._outbox.frames  # the outbox's own list: in order with its other frames

    def __len__(self) -> int:
        """Publish bytes kept in the outbox, not written yet."""
        return self._outbox.size

    def add(self, method: bytes, message: OutgoingMessage) -> None:
        """Buffer one publish: its method frame and its content frames.

        Parameters:
            method: the method frame (:func:`method_frame` for this buffer's channel).
            message: what to publish.

        Raises:
            ValueError: as :func:`content_frames` (nothing is buffered then).
        """
        content = content_frames(self.channel_id, message, self.connection.frame_max)
        self._frames.append(method)
        self._frames.append(content)
        self._outbox.size += len(method) + len(content)

    def add_job(self, method: bytes, template: tuple[bytes, bytes], message_id: str, body: bytes) -> int:
        """Buffer one publish whose properties are ``template`` around ``message_id``.

        The frames are those :meth:`add` buffers for a message with those properties and body.

        Parameters:
            method: the method frame (:func:`method_frame` for this buffer's channel).
            template: ``(before, after)`` of :func:`~ojs_kombu.amqp.properties.properties_template`.
            message_id: the message's id.
            body: the message body.

        Returns:
            The bytes buffered now (``len(self)``).

        Raises:
            ValueError: the message id is longer than 255 bytes (nothing is buffered then).
        """
        before, after = template
        size = len(body)
        if not 0 < size <= self.connection.frame_max - 8:  # no body frame, or several: as add
            content = _content(self.channel_id, before + shortstr(message_id) + after, body, self.connection.frame_max)
            self._frames += (method, content)
            box = self._outbox
            box.size += len(method) + len(content)
            return box.size
        # The common case, without joining anything: the pieces of the frames go to the buffer
        # as they are, and flush joins them all at once.
        raw_id = message_id.encode()
        if len(raw_id) > 255:
            raise ValueError(f"AMQP short string longer than 255 bytes: {raw_id[:40]!r}...")
        properties = len(before) + 1 + len(raw_id) + len(after)
        channel = self.channel_id
        self._frames += (
            method,
            _CONTENT_HEADER.pack(_HEADER, channel, 12 + properties, _BASIC_CLASS, 0, size),
            before,
            _LENGTH[len(raw_id)],
            raw_id,
            after,
            _FRAME_END,
            _FRAME_HEADER.pack(_BODY, channel, size),
            body,
            _FRAME_END,
        )
        box = self._outbox
        box.size += len(method) + 20 + properties + 8 + size  # frame headers 7 + 7, their ends, 12 of header
        return box.size

    def flush(self) -> None:
        """Write every frame the outbox keeps (these publishes and what came before them) with one socket write.

        Raises:
            OSError: the write failed; the frames are dropped (the connection is lost with them).
        """
        self._outbox.flush()


__all__ = ["FLUSH_BYTES", "PublishBuffer", "content_frames", "method_frame"]
