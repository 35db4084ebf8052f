"""The acks of one event-loop tick, written to the socket at once.

Celery's worker acks each task from its event loop (kombu's hub): with
``prefork`` when a pool process reports the result, with ``threads`` through
``call_soon``.  py-amqp writes every ``Basic.Ack`` with its own ``sendall``,
about a quarter of the worker's main-process CPU per task.  :class:`AckBatch`
keeps the ``Basic.Ack`` frames the loop's thread produces during one tick and
writes them with one ``sendall`` when the loop next ticks (before it polls).

Each ack stays its own ``Basic.Ack`` frame, with the ``multiple`` flag its
caller gave (``False``: binding §5.3 forbids settling several jobs at once).
Any other frame written on the connection first writes the pending acks, so
the broker sees every frame in the order it was produced; acks from any other
thread, or while no loop drives the connection, are written at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from struct import Struct
from typing import Any

from amqp import spec

#: A ``Basic.Ack`` method frame: type 1, channel, payload size 13, class/method ids,
#: ``delivery-tag`` (long long), ``multiple`` (one bit in an octet), frame end.
_ACK_FRAME = Struct(">BHIHHQBB")
_ACK_PAYLOAD_SIZE = 13
_FRAME_END = 0xCE

FrameWriter = Callable[[int, int, Any, Any, Any], Any]


def ack_frame(channel_id: int, delivery_tag: int, multiple: bool = False) -> bytes:
    """The wire bytes of one ``Basic.Ack`` method frame (what py-amqp's ``basic_ack`` writes).

    Parameters:
        channel_id: the channel the delivery came on.
        delivery_tag: the delivery to acknowledge.
        multiple: AMQP's ``multiple`` flag.

    Returns:
        The frame, header and frame-end octet included.
    """
    class_id, method_id = spec.Basic.Ack
    return _ACK_FRAME.pack(
        1, channel_id, _ACK_PAYLOAD_SIZE, class_id, method_id, delivery_tag, int(multiple), _FRAME_END
    )


class AckBatch:
    """``Basic.Ack`` frames held until the event loop's next tick, then written with one socket write.

    Parameters:
        write: writes bytes to the connection's socket (py-amqp's ``transport.write``).
    """

    def __init__(self, write: Callable[[bytes], Any]):
        self._write = write
        self._pending = bytearray()
        self._lock = threading.Lock()
        #: The thread running the event loop that flushes the batch; None: not batching.
        self._loop_thread: int | None = None

    def defer(self, channel_id: int, delivery_tag: int, multiple: bool = False) -> bool:
        """Hold a ``Basic.Ack`` for the next :meth:`flush` when called from the loop's thread.

        Parameters:
            channel_id: the channel the delivery came on.
            delivery_tag: the delivery to acknowledge.
            multiple: AMQP's ``multiple`` flag.

        Returns:
            True if the ack is held; False if the caller must write it itself (not the
            loop's thread, or no loop drives the connection).
        """
        if self._loop_thread != threading.get_ident():
            return False
        frame = ack_frame(channel_id, delivery_tag, multiple)
        with self._lock:
            self._pending += frame
        return True

    def tick(self) -> None:
        """The event loop's tick: write the held acks; from now on this thread's acks are held.

        Raises:
            OSError: the socket write failed (the connection is lost; kombu reconnects).
        """
        self._loop_thread = threading.get_ident()
        self.flush()

    def stop(self) -> None:
        """Write the held acks and hold no more (the loop is closing).

        Raises:
            OSError: the socket write failed.
        """
        self._loop_thread = None
        self.flush()

    def flush(self) -> None:
        """Write the held acks, if any, with one socket write.

        Raises:
            OSError: the socket write failed.
        """
        if self._pending:
            with self._lock:
                self._flush_locked()

    def _flush_locked(self) -> None:
        if self._pending:
            data, self._pending = bytes(self._pending), bytearray()
            self._write(data)

    def wrap(self, frame_writer: FrameWriter) -> FrameWriter:
        """``frame_writer`` (py-amqp's) writing the held acks before each frame, so that order is kept.

        Parameters:
            frame_writer: the connection's frame writer.

        Returns:
            The frame writer to install on the connection.
        """
        lock = self._lock

        def write_frame(type_: int, channel: int, method_sig: Any, args: Any, content: Any) -> Any:
            with lock:
                self._flush_locked()
                return frame_writer(type_, channel, method_sig, args, content)

        return write_frame


__all__ = ["AckBatch", "FrameWriter", "ack_frame"]
