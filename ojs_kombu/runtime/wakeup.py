"""The consumer loop's self-pipe: another thread makes the loop's ``select`` return at once.

Handler threads settle deliveries through requests the loop carries out
(:mod:`~ojs_kombu.runtime.requests`); a loop busy with frames carries them out before it
waits again, so only a loop that waits (or is about to) needs waking: :attr:`Wakeup.idle`
is set before the loop's last look at its requests and read by a requester after it made
its request, so one of the two sees the other.  One byte per wake-up, not per request.

Closing: :meth:`Wakeup.close` releases the pipe, or, while the loop still runs (it outlived
a join timeout), the loop's :meth:`Wakeup.end` does.  A wake-up after that is dropped: it
never writes to the closed descriptor, whose number the process may already have given to
another file.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable
from typing import Any

from ojs_kombu.errors import OjsError


class Wakeup:
    """A self-pipe that wakes one loop waiting in ``select``; :meth:`wake` is thread-safe."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        self._pending = False  # a byte is (about to be) in the pipe: the loop will wake
        #: The loop is about to wait (or waits) in ``select``: a request must wake it.
        self.idle = False
        self._lock = threading.Lock()  # guards writes to the pipe against close()
        self._closed = False  # close() was called: never write to the pipe again
        self._running = False  # a loop is running: it releases the pipe when it ends

    def wake(self) -> None:
        """Make a ``select`` in :meth:`wait` return now (or the next one, if none waits)."""
        # The loop clears the flag after it has read the pipe, then looks at its work again.
        if self._pending:
            return
        with self._lock:
            if self._closed:
                return  # the loop has ended; the request is moot (the broker redelivers)
            self._pending = True
            try:
                os.write(self.write_fd, b"x")
            except BlockingIOError:
                pass  # the pipe is full: the loop is awake anyway

    def wait(self, sock: Any, interval: float, no_work: Callable[[], bool]) -> bool:
        """Wait until ``sock`` is readable, :meth:`wake` is called, or ``interval`` passes.

        Parameters:
            sock: the connection's socket.
            interval: the longest wait.
            no_work: looked at once :attr:`idle` is set: False (work came before) waits not at all.

        Returns:
            Whether ``sock`` is readable.
        """
        self.idle = True
        try:
            timeout = interval if no_work() else 0.0
            readable, _, _ = select.select([sock, self.read_fd], [], [], timeout)
        finally:
            self.idle = False
        if self.read_fd in readable:
            self._clear()
        return sock in readable

    def _clear(self) -> None:
        try:
            while os.read(self.read_fd, 4096):
                pass
        except BlockingIOError:
            pass
        # Only now: a byte written before this point may just have been read.  Work that came
        # while the flag was still set is found by the loop's next look at it.
        self._pending = False

    def begin(self) -> None:
        """A loop starts using the pipe.

        Raises:
            OjsError: :meth:`close` was called already.
        """
        with self._lock:
            if self._closed:
                raise OjsError("the consumer is closed")
            self._running = True

    def end(self) -> None:
        """The loop has ended: release the pipe if :meth:`close` was called meanwhile."""
        with self._lock:
            self._running = False
            if self._closed:
                self._release()

    def close(self) -> None:
        """Release the pipe now, or when the running loop ends; later wake-ups are dropped.  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self._running:
                self._release()

    def _release(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            os.close(fd)
        self.read_fd = self.write_fd = -1


__all__ = ["Wakeup"]
