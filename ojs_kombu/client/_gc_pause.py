"""Pausing the cyclic garbage collector while a large batch is encoded, published and confirmed.

Private to the publishing service (:mod:`ojs_kombu.client.publishing`), which pauses a
batch's first publishing attempt only: the pause ends with the batch, when that attempt
fails (never across the wait before a reconnect), or as soon as a confirm wait reads
nothing for a second (a stalled broker); ``Client(gc_pause=False)`` switches it off.

Every object of a pipelined batch (the caller's jobs, their encoded messages and
publish tickets) lives until the batch's confirms are read, so each collection that
runs meanwhile scans them all again and frees none of them: with 20,000 jobs, the
two or three full collections cost about a sixth of ``enqueue_many``'s CPU.  The
pause delays collections, it never loses one: reference counting still frees every
acyclic object at once, and the allocations made meanwhile stay counted, so the
collector runs at the first allocation after the pause if they passed its threshold.

One pause at a time per process: a batch that starts while another holds it runs
unpaused, so the collector is never kept off for longer than one batch, however many
threads publish.
"""

from __future__ import annotations

import gc
import os
import threading
from types import TracebackType

_lock = threading.Lock()  # held by the one pause in progress
_reenable = False  # whether the pause in progress disabled an enabled collector


class GcPause:
    """A context manager that disables the cyclic collector for its duration, then restores it.

    Only the first of overlapping pauses (other threads, or nested) pauses; the others
    do nothing.  The collector is enabled again on leaving, by an exception as well,
    and only if it was enabled on entering (a program that disabled it keeps it
    disabled).  A child forked during a pause starts without it, its collector restored.
    """

    __slots__ = ("_owner",)

    def __init__(self) -> None:
        self._owner = False

    def __enter__(self) -> GcPause:
        return self.start()

    def start(self) -> GcPause:
        """Pause the collector now, unless another pause is in progress (as entering the block does)."""
        global _reenable
        if not self._owner and _lock.acquire(blocking=False):
            self._owner = True
            _reenable = gc.isenabled()
            gc.disable()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()

    def end(self) -> None:
        """End the pause now, before leaving the block (idempotent; from the pausing thread)."""
        if self._owner:
            self._owner = False
            if _reenable:
                gc.enable()
            _lock.release()


def _after_fork_in_child() -> None:
    global _lock, _reenable
    if _lock.locked():  # the forking thread, or a thread that does not exist in the child, held it
        _lock = threading.Lock()
        if _reenable:
            gc.enable()
        _reenable = False


os.register_at_fork(after_in_child=_after_fork_in_child)
