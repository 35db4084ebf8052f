"""Lending the consumer's connection while the consumer thread runs a job itself.

A :class:`~ojs_kombu.Worker` runs a short job on its consumer thread, without handing
it to a handler thread (a hand-over costs two thread wake-ups and GIL switches, more
than a short job's own work).  While the consumer thread runs a job, nobody reads the
socket: that is fine for a job of a millisecond, not for one of a minute (heartbeats,
cancels, the other deliveries, the handler threads' acks).  So the consumer thread
*lends* the connection for the length of the job (:meth:`Handover.lend`, two attribute
writes), and a stand-in thread looks every ``patience`` seconds: a job lent for longer
than that makes the stand-in take the connection and run the consumer loop's passes
(:meth:`Consumer.serve <ojs_kombu.runtime.consumer.Consumer.serve>`) until the consumer
thread takes it back (:meth:`Handover.reclaim`).  One thread at a time uses the
connection and its channels, handed over under a lock: the binding's "channel pool
with proper synchronization" (§11.2, AMQP-028).

The stand-in sleeps while nothing is lent: the first lend after a quiet spell wakes
it, and it goes back to sleep once no job was lent for a while.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ojs_kombu.runtime.consumer import Consumer

logger = logging.getLogger(__name__)

#: Seconds a job may run on the consumer thread before the stand-in takes the connection.
DEFAULT_PATIENCE = 0.01

#: The stand-in's looks without a lend after which it sleeps until the next lend.
_QUIET_LOOKS = 20


class Handover:
    """The consumer thread's lending of its connection, and the stand-in thread that serves it.

    Parameters:
        consumer: the consumer whose loop runs in the consumer thread.
        on_pass: what the stand-in does after each pass it serves, instead of the consumer
            thread's own ``on_pass`` (the Worker hands the deliveries to its handler threads).
        patience: seconds a lent connection goes unserved before the stand-in takes it.
    """

    def __init__(self, consumer: Consumer, on_pass: Callable[[], None], *, patience: float = DEFAULT_PATIENCE):
        self.consumer = consumer
        self.on_pass = on_pass
        self.patience = patience
        self.takeovers = 0
        """How many times the stand-in took the connection (a job ran longer than ``patience``)."""
        self._lock = threading.Lock()  # guards the hand-over: _lent, _serving, _want_back
        self._lent = False
        self._lent_at = 0.0
        self._lends = 0
        self._serving = False  # the stand-in holds the connection
        self._want_back = False
        self._returned = threading.Event()  # the stand-in gave the connection back
        self._awake = threading.Event()  # set by a lend: the stand-in watches
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def lent(self) -> bool:
        """Whether the consumer thread is running a job (its connection lent) now."""
        return self._lent

    @property
    def serving(self) -> bool:
        """Whether the stand-in holds the connection now."""
        return self._serving

    def start(self) -> None:
        """Start the stand-in thread."""
        self._thread = threading.Thread(target=self._run, name="ojs-stand-in", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the stand-in thread (after the consumer was stopped: a pass it serves then ends)."""
        self._stop.set()
        self._awake.set()
        self.consumer.wake()
        if self._thread is not None:
            self._thread.join(timeout)

    def lend(self) -> None:
        """The consumer thread is about to run a job: the stand-in may take the connection from now on."""
        self._lent_at = time.monotonic()
        self._lends += 1  # before looking at _awake: the stand-in clears it, then looks at _lends
        self._lent = True
        if not self._awake.is_set():
            self._awake.set()

    def reclaim(self) -> None:
        """The job has returned: take the connection back, waiting for a pass the stand-in is serving.

        Raises:
            BaseException: what ended the stand-in's serving (the consumer loop's own error:
                a permanent refusal, ``connect_retries`` spent), for the consumer thread to end with.
        """
        with self._lock:
            self._lent = False
            serving = self._serving
            if serving:
                self._want_back = True
        if serving:
            self.consumer.wake()  # a pass waiting in select returns
            self._returned.wait()
        error = self._error
        if error is not None:
            self._error = None
            raise error

    # -- the stand-in thread -------------------------------------------------------------------

    def _run(self) -> None:
        quiet = 0
        seen = self._lends
        while not self._stop.is_set():
            if not self._awake.wait(1.0):
                continue
            self._stop.wait(self.patience)
            if self._lends == seen and not self._lent:
                quiet += 1
                if quiet >= _QUIET_LOOKS:
                    self._awake.clear()
                    if self._lends != seen or self._lent:  # a lend raced the clear: keep watching
                        self._awake.set()
                    quiet = 0
                continue
            quiet = 0
            seen = self._lends
            if self._take():
                self._serve()

    def _take(self) -> bool:
        with self._lock:
            if not self._lent or time.monotonic() - self._lent_at < self.patience:
                return False
            self._serving = True
            self._want_back = False
            self._returned.clear()
        return True

    def _serve(self) -> None:
        self.takeovers += 1
        consumer = self.consumer
        try:
            self.on_pass()  # the deliveries the consumer thread has not started
            consumer.serve(lambda: self._want_back or self._stop.is_set(), self.on_pass)
            if consumer.stopped and self._lent:
                consumer.shutdown()  # the consumer thread is still in its job past the grace period
        except BaseException as exc:  # re-raised in the consumer thread by reclaim()
            self._error = exc
            logger.warning("the stand-in serving the connection for the consumer thread stopped: %r", exc, exc_info=exc)
        finally:
            with self._lock:
                self._serving = False
                self._want_back = False
            self._returned.set()


__all__ = ["DEFAULT_PATIENCE", "Handover"]
