"""One ordered write path per py-amqp connection: acks, nacks, publishes and py-amqp's own frames.

:func:`outbox` attaches an :class:`Outbox` to a connection the first time anything asks
for it, and returns the same one afterwards: the consumer loop, the ``ojs://`` transport's
event loop and every :class:`~ojs_kombu.amqp.publisher.ConfirmedPublisher` on that connection
share it.  It replaces the connection's frame writer with py-amqp's own built over the outbox
instead of the transport, so every frame written on the connection passes through it:

* frames that may wait (a settle frame while :meth:`Outbox.hold` is on, a deferred settle, a
  pipelined publish) are kept in one list, in the order they were made;
* any other frame is written after what is kept, in the same socket write;
* every blocking read of the connection (a synchronous method's reply, a confirm wait)
  first sends what is kept, so nothing waits for an answer to a frame it has not sent.

So frames leave in the order they were made, whoever made them, and a frame that may
wait is never forgotten by a read: both are properties of this object, not conventions
of its callers.  :meth:`Outbox.flush` sends what is kept now (a loop does so before it
waits in ``select``, which is no read of the connection).

The outbox writes outside py-amqp's write lock: it is for the thread that owns the
connection (the consumer loop, kombu's event loop, a pooled connection's user).
"""

from __future__ import annotations

import threading
from struct import Struct
from typing import Any

from amqp import Channel, Connection, spec

_METHOD_FRAME = 1
_FRAME_END = 0xCE
# A Basic.Ack / Basic.Nack frame: header, class, method, delivery-tag, the flags octet, frame end.
_SETTLE_FRAME = Struct(">BHIHHQBB")
_EMPTY = b""
_ACK = spec.Basic.Ack
_NACK = spec.Basic.Nack
#: The attribute of a py-amqp connection that holds its outbox.
_ATTRIBUTE = "ojs_outbox"


class Outbox:
    """The frames written on one py-amqp connection, in the order they were made (see the module docstring).

    Built by :func:`outbox`, never directly: one per connection.

    Parameters:
        connection: a connected py-amqp connection (plain TCP or TLS).
    """

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.transport = connection.transport
        self._write = connection.transport.write
        #: The frames kept, in order; never rebound (a publish buffer appends to it directly).
        self.frames: list[bytes] = []
        #: Bytes of publishes kept (what a publisher flushes at).
        self.size = 0
        self._holding = False
        self._defer_thread: int | None = None
        connection.frame_writer = connection.frame_writer_cls(connection, self)
        read = connection.blocking_read

        def blocking_read(timeout: float | None = None) -> Any:
            if self.frames:
                self.flush()  # a reply never waits for a frame still kept here
            return read(timeout)

        connection.blocking_read = blocking_read

    # -- writing ------------------------------------------------------------------------------

    def hold(self) -> None:
        """Keep the frames written from now on until :meth:`flush`."""
        self._holding = True

    def write(self, data: bytes | memoryview) -> None:
        """The transport's ``write`` as py-amqp's frame writer calls it: what is kept goes first.

        A kept frame is copied: py-amqp hands over a view of a buffer it reuses for the next frame.
        """
        frames = self.frames
        if self._holding:
            frames.append(bytes(data))
        elif frames:
            frames.append(bytes(data))
            data = _EMPTY.join(frames)
            frames.clear()
            self.size = 0
            self._write(data)
        else:
            self._write(data)

    def flush(self) -> None:
        """Stop holding; send what is kept with one write (raises what ``transport.write`` raises).

        What is kept is dropped if the write fails: the connection is lost with it.
        """
        self._holding = False
        frames = self.frames
        if frames:
            data = frames[0] if len(frames) == 1 else _EMPTY.join(frames)
            frames.clear()
            if self.size:  # publishes (py-amqp counts its own frames, _settle_frame the settles)
                self.size = 0
                self._connection.bytes_sent += 1  # heartbeats: something was sent
            self._write(data)

    # -- settling -----------------------------------------------------------------------------

    def ack(self, channel: Channel, delivery_tag: int) -> None:
        """``Basic.Ack`` of one delivery, ``multiple=False`` (binding §5.3): kept while holding.

        Parameters:
            channel: the delivery's channel; closed, py-amqp's error for a closed channel is raised.
            delivery_tag: the delivery's tag.
        """
        if channel.is_open:
            self.write(self._settle_frame(channel.channel_id, _ACK, delivery_tag))
        else:
            channel.send_method(_ACK, "Lb", (delivery_tag, False))

    def ack_multiple(self, channel: Channel, delivery_tag: int) -> None:
        """``Basic.Ack(multiple=True)``: every delivery of ``channel`` up to ``delivery_tag``; kept while holding.

        Parameters: as :meth:`ack`.
        """
        if channel.is_open:
            self.write(self._settle_frame(channel.channel_id, _ACK, delivery_tag, 1))
        else:
            channel.send_method(_ACK, "Lb", (delivery_tag, True))

    def nack(self, channel: Channel, delivery_tag: int) -> None:
        """``Basic.Nack(multiple=False, requeue=False)`` of one delivery (dead-lettered): as :meth:`ack`."""
        if channel.is_open:
            self.write(self._settle_frame(channel.channel_id, _NACK, delivery_tag))
        else:
            channel.send_method(_NACK, "Lbb", (delivery_tag, False, False))

    def settle(self, channel: int, method: tuple[int, int], delivery_tag: int) -> None:
        """Write a ``Basic.Ack`` or ``Basic.Nack`` frame of one delivery, its flags all off.

        The same bytes py-amqp's ``basic_ack(tag, multiple=False)`` / ``send_method(Basic.Nack,
        "Lbb", (tag, False, False))`` write, without their generic argument encoding and
        promise; counted for heartbeats like every frame.

        Parameters:
            channel: the delivery's channel number.
            method: ``amqp.spec.Basic.Ack`` or ``amqp.spec.Basic.Nack``.
            delivery_tag: the delivery's tag.
        """
        self.write(self._settle_frame(channel, method, delivery_tag))

    def defer_settle(self, channel: int, method: tuple[int, int], delivery_tag: int) -> None:
        """:meth:`settle`, the frame kept until the next :meth:`flush`, read or frame written (it goes first).

        Parameters: as :meth:`settle`.
        """
        self.frames.append(self._settle_frame(channel, method, delivery_tag))

    def defer_from(self, thread: int | None) -> None:
        """Let :func:`defer_ack` keep the acks made by ``thread`` (an event loop that flushes before it
        polls); ``None``: write every ack at once again."""
        self._defer_thread = thread

    def _settle_frame(self, channel: int, method: tuple[int, int], delivery_tag: int, flags: int = 0) -> bytes:
        """The ``Basic.Ack`` / ``Basic.Nack`` frame of one delivery (``flags`` 1: ``multiple``); counted for heartbeats."""
        self._connection.bytes_sent += 1
        return _SETTLE_FRAME.pack(_METHOD_FRAME, channel, 13, method[0], method[1], delivery_tag, flags, _FRAME_END)


def outbox(connection: Connection) -> Outbox:
    """The connection's :class:`Outbox`, attached now if it has none yet (the one place it is attached).

    Parameters:
        connection: a connected py-amqp connection.

    Returns:
        Its outbox; a new one after the connection connected again (a new transport).
    """
    box: Outbox | None = getattr(connection, _ATTRIBUTE, None)
    if box is None or box.transport is not connection.transport:
        box = Outbox(connection)
        setattr(connection, _ATTRIBUTE, box)
    return box


def defer_ack(channel: Channel, delivery_tag: int) -> bool:
    """Keep ``Basic.Ack`` of ``delivery_tag`` in the channel's outbox if the calling thread defers its acks.

    For the ``ojs://`` transport: the acks kombu's event loop thread makes in one pass of the
    loop leave in one write, right before it polls (:meth:`Outbox.defer_from`).

    Parameters:
        channel: the delivery's channel.
        delivery_tag: the delivery's tag.

    Returns:
        Whether the ack was kept (False: the caller sends it as usual).
    """
    box: Outbox | None = getattr(channel.connection, _ATTRIBUTE, None)
    if box is None or box._defer_thread != threading.get_ident() or not channel.is_open:
        return False
    box.defer_settle(channel.channel_id, _ACK, delivery_tag)
    return True


__all__ = ["Outbox", "defer_ack", "outbox"]
