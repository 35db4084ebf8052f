"""One event loop on a thread of its own, where a :class:`~ojs_kombu.runtime.worker.Worker` runs
its ``async def`` handlers.

Every coroutine job of a worker runs on this one loop: 200 jobs that each wait on I/O take
one thread, not 200.  The worker's prefetch (``concurrency``) bounds how many run at once.
A handler that blocks (``time.sleep``, a synchronous client) stalls every coroutine job of
the worker: such work belongs in a plain ``def`` handler, or in ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

logger = logging.getLogger(__name__)


class CoroutineRunner:
    """An event loop running on a daemon thread, started at construction.

    Parameters:
        name: the thread's name.
    """

    def __init__(self, name: str = "ojs-coroutines"):
        self.loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[Any]] = set()  # strong references: the loop keeps weak ones
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, start: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Run the coroutine ``start()`` makes as a task of the loop (from any thread)."""
        self.loop.call_soon_threadsafe(self._start, start)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel the tasks still running, stop the loop and wait at most ``timeout`` s for its thread.

        Idempotent.
        """
        if self.loop.is_closed() or not self._thread.is_alive():
            return
        try:
            self.loop.call_soon_threadsafe(self._cancel_and_stop)
        except RuntimeError:  # closed meanwhile
            return
        self._thread.join(timeout)

    @property
    def running(self) -> int:
        """Tasks not finished yet."""
        return len(self._tasks)

    def _start(self, start: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        task = self.loop.create_task(start())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _cancel_and_stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        # Stop once the cancelled tasks have run their cancellation (one more pass of the loop).
        self.loop.call_soon(self.loop.stop)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            except Exception:
                logger.exception("shutting down the coroutine loop's async generators failed")
            self.loop.close()


__all__ = ["CoroutineRunner"]
