"""Buffered frame reading for the consumer's py-amqp connection.

py-amqp reads every frame with exact-size ``recv()`` calls (header, payload,
frame-end: three per frame, nine per delivered message), and
``drain_events(timeout=0)`` toggles the socket timeout around every frame and
ends with a ``socket.timeout`` exception.  That was most of the consumer
loop's CPU per message.

:class:`FrameReader` instead takes whatever the socket holds in one
``recv(65536)`` when ``select()`` says it is readable (:meth:`FrameReader.fill`),
and cuts complete frames out of that buffer for py-amqp's own frame handler
(:meth:`FrameReader.dispatch`), which assembles methods and messages and
counts ``bytes_recv`` for heartbeats exactly as before.

Everything else that reads the connection (synchronous RPCs such as queue
declarations, ``ConfirmedPublisher`` waiting for confirms) still goes through
``connection.drain_events`` -> ``transport.read_frame`` -> ``transport._read``;
the reader replaces ``_read`` on that one transport instance so those reads
are served from the same buffer first (the bytes must be consumed in order,
whoever reads them).  When the buffer runs short, ``_read`` reads the socket
with py-amqp's semantics: the socket timeout set by ``having_timeout`` applies,
``EAGAIN``/``EINTR`` on a frame's first read raise ``socket.timeout``, and an
orderly close raises ``OSError('Server unexpectedly closed connection')``.

Plain TCP only: on a TLS socket a readable fd may hold only part of a TLS
record, so a ``recv`` could block; the consumer keeps py-amqp's path there.
"""

from __future__ import annotations

import errno
import select
import socket
from collections.abc import Callable
from struct import Struct
from typing import Any

from amqp import Connection
from amqp.exceptions import UnexpectedFrame
from amqp.transport import TCPTransport

from ojs_kombu.amqp.delivery import DELIVER_SIGNATURE, RawDelivery, read_delivery

#: Bytes asked of the socket per ``recv``: many deliveries' worth.
RECV_SIZE = 65536

_HEADER = Struct(">BHI")  # frame type, channel, payload size
_FRAME_END = 0xCE
_METHOD_FRAME = 1
_EMPTY = b""
# Not blocking, whatever the socket's mode: fill() runs only after select() said readable.
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)


def supports(connection: Connection) -> bool:
    """Whether :class:`FrameReader` can serve ``connection`` (a plain TCP py-amqp connection)."""
    transport = getattr(connection, "_transport", None)
    return (
        isinstance(transport, TCPTransport)
        and isinstance(getattr(transport, "sock", None), socket.socket)
        and not hasattr(transport.sock, "pending")
    )  # an ssl.SSLSocket


class FrameReader:
    """Reads a py-amqp connection's frames from one buffer; for the connection's owner thread only."""

    def __init__(self, connection: Connection) -> None:
        transport = connection.transport
        self._transport = transport
        self._recv = transport.sock.recv
        self._on_frame = connection.on_inbound_frame
        self._connection = connection
        self._deliveries_channel = -1  # no channel: every frame goes to py-amqp
        self._on_delivery: Callable[[RawDelivery], bool] | None = None
        self._buf = _EMPTY
        self._pos = 0  # bytes of _buf already consumed
        # From now on drain_events() / read_frame() read through our buffer too.
        transport._read = self._read

    def decode_deliveries(self, channel: int, on_delivery: Callable[[RawDelivery], bool]) -> None:
        """Decode the deliveries of ``channel`` directly (:func:`~ojs_kombu.amqp.delivery.read_delivery`)
        and hand them to ``on_delivery`` instead of py-amqp's frame handler.

        Parameters:
            channel: the consuming channel's number.
            on_delivery: called with each complete delivery; returns False to leave that
                delivery to py-amqp after all (e.g. an unknown consumer tag).
        """
        self._deliveries_channel = channel
        self._on_delivery = on_delivery

    @property
    def deliveries_channel(self) -> int:
        """The channel whose deliveries :meth:`decode_deliveries` routes, or -1."""
        return self._deliveries_channel

    @property
    def buffered(self) -> int:
        """Bytes received and not yet consumed."""
        self._take_pushback()
        return len(self._buf) - self._pos

    def fill(self) -> int:
        """Append what the socket has (one ``recv``, never blocking); return the byte count.

        Raises the ``OSError`` py-amqp would on a reset or closed connection.
        """
        try:
            data = self._recv(RECV_SIZE, _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0  # a spurious wake-up: nothing to read after all
        except OSError:
            self._transport.connected = False
            raise
        if not data:
            self._transport.connected = False
            raise OSError("Server unexpectedly closed connection")
        self._take_pushback()
        pos = self._pos
        # The unconsumed tail is at most one partial frame: copying it is cheap.
        self._buf = self._buf[pos:] + data if pos < len(self._buf) else data
        self._pos = 0
        return len(data)

    def has_frame(self) -> bool:
        """Whether a complete frame is buffered (a buffered frame does not make the socket readable)."""
        self._take_pushback()
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 8:
            return False
        size: int = _HEADER.unpack_from(buf, pos)[2]
        return pos + 7 + size < len(buf)

    def dispatch(self) -> int:
        """Hand every complete buffered frame to py-amqp's frame handler; return how many.

        A handler may itself read the connection (e.g. a callback waiting for a
        synchronous reply), moving the buffer on: the state is re-read for
        every frame, and the position is advanced before the handler runs.
        """
        count = 0
        on_frame = self._on_frame
        while True:
            self._take_pushback()
            buf, pos = self._buf, self._pos
            if len(buf) - pos < 8:
                return count
            frame_type, channel, size = _HEADER.unpack_from(buf, pos)
            end = pos + 7 + size
            if end >= len(buf):
                return count  # partial frame: the rest comes with a later fill()
            if (
                channel == self._deliveries_channel
                and frame_type == _METHOD_FRAME
                and buf.startswith(DELIVER_SIGNATURE, pos + 7)
                and self._deliver(buf, pos)
            ):
                count += 1
                continue
            self._pos = end + 1
            if buf[end] != _FRAME_END:
                raise UnexpectedFrame(f"Received frame_end {buf[end]:#04x} while expecting 0xce")
            on_frame((frame_type, channel, buf[pos + 7 : end]))
            count += 1

    def _deliver(self, buf: bytes, pos: int) -> bool:
        """The delivery at ``pos`` decoded directly and consumed, if it can be (see :meth:`decode_deliveries`)."""
        found = read_delivery(buf, pos)
        if found is None:
            return False
        delivery, end, frames = found
        assert self._on_delivery is not None  # set with the channel
        self._pos = end  # before the handler runs, as for any frame
        if not self._on_delivery(delivery):
            self._pos = pos
            return False
        self._connection.bytes_recv += frames  # what py-amqp's frame handler counts (heartbeats)
        return True

    def _take_pushback(self) -> None:
        # py-amqp's read_frame puts the bytes of a frame it could not finish (socket.timeout)
        # back into transport._read_buffer; they come before everything we still hold.
        pushed = self._transport._read_buffer
        if pushed:
            self._transport._read_buffer = _EMPTY
            self._buf = pushed + self._buf[self._pos :]
            self._pos = 0

    def _read(self, n: int, initial: bool = False, _errnos: tuple[int, ...] = (errno.EAGAIN, errno.EINTR)) -> bytes:
        """``TCPTransport._read`` served from our buffer: exactly ``n`` bytes."""
        self._take_pushback()
        buf, pos = self._buf, self._pos
        end = pos + n
        if end <= len(buf):
            self._pos = end
            return buf[pos:end]
        # Short: read the socket like py-amqp does (its timeout applies), but take all it has.
        rbuf = buf[pos:]
        self._buf, self._pos = rbuf, 0
        recv = self._recv
        while len(rbuf) < n:
            try:
                data = recv(max(n - len(rbuf), RECV_SIZE))
            except OSError as exc:
                if exc.errno in _errnos:
                    if initial and self._transport.raise_on_initial_eintr:
                        raise TimeoutError() from None
                    continue
                raise
            if not data:
                raise OSError("Server unexpectedly closed connection")
            rbuf += data
            self._buf = rbuf  # kept if a later recv raises: nothing is lost
        self._pos = n
        return rbuf[:n]


def attach_reader(connection: Connection) -> FrameReader | None:
    """A :class:`FrameReader` on ``connection`` if it can serve it (plain TCP), else None (TLS: py-amqp reads).

    Parameters:
        connection: a connected py-amqp connection.
    """
    return FrameReader(connection) if supports(connection) else None


def socket_of(connection: Connection) -> Any:
    """The connection's socket (for ``select``)."""
    return connection.sock


def tls_pending(sock: Any) -> bool:
    """Whether a TLS socket holds decrypted bytes: they do not make its descriptor readable."""
    pending = getattr(sock, "pending", None)
    return bool(pending and pending())


def read_available(connection: Connection) -> None:
    """Hand every frame the socket holds now to py-amqp (its own read path: TLS)."""
    while True:
        try:
            connection.drain_events(timeout=0)
        except TimeoutError:
            return


def pump(connection: Connection, reader: FrameReader | None, timeout: float) -> None:
    """Read and dispatch what arrives within ``timeout`` seconds (through ``reader`` when there is one)."""
    if reader is None:
        try:
            connection.drain_events(timeout=timeout)
        except TimeoutError:
            pass
        return
    if not reader.has_frame():
        readable, _, _ = select.select([connection.sock], [], [], timeout)
        if readable:
            reader.fill()
    reader.dispatch()


__all__ = [
    "RECV_SIZE",
    "FrameReader",
    "attach_reader",
    "pump",
    "read_available",
    "socket_of",
    "supports",
    "tls_pending",
]
