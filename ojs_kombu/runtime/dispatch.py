"""Where a delivered job runs: on the consumer thread (inline) or on a handler thread.

The consumer loop hands each delivery of a pass to :meth:`Dispatch.receive`; after the pass
(:meth:`Dispatch.run_ready`, the consumer's ``on_pass``) the consumer thread runs them
itself while jobs are short (a no-op job costs less than handing it to another thread and
waking it), else they go to the ``concurrency`` handler threads.  A job run on the consumer
thread lends the connection to the stand-in meanwhile (:mod:`~ojs_kombu.runtime.handover`);
one that is not short (it waited more than :data:`INLINE_MAX_WAIT` beyond its CPU time, or
outlasted the hand-over's patience) twice in a row, or once past the patience, sends the
jobs to the handler threads for :data:`POOL_SPELL` seconds; then one runs inline again, to
look, once no handler thread runs a job.
"""

from __future__ import annotations

import queue as queue_module
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from ojs_kombu.runtime.consumer import Consumer, Delivery
from ojs_kombu.runtime.handover import Handover

#: A job run on the consumer thread is short if it waited (wall-clock time beyond its thread's
#: CPU time) less than this many seconds and did not outlast the hand-over's patience.
INLINE_MAX_WAIT = 0.001

#: Seconds the jobs go to the handler threads after a job that was not short; then one runs
#: on the consumer thread again, to look, once no handler thread runs a job.
POOL_SPELL = 0.1


class Dispatch:
    """The inline-or-pool choice for one consumer, and the handler threads.

    Parameters:
        consumer: the consumer whose passes deliver the jobs (its connection is lent while a job
            runs on its thread).
        handle: runs one delivery's job and settles it (in a slot of the worker's concurrency).
        in_flight: how many jobs run now (on any thread).
        inline: run short jobs on the consumer thread; False: always on a handler thread.
    """

    def __init__(
        self,
        consumer: Consumer,
        handle: Callable[[Delivery], None],
        in_flight: Callable[[], int],
        *,
        inline: bool = True,
    ) -> None:
        self.inline = inline
        self._handle = handle
        self._in_flight = in_flight
        self._ready: deque[Delivery] = deque()  # delivered in this pass of the loop, not started
        self._work: queue_module.SimpleQueue[Delivery | None] = queue_module.SimpleQueue()  # cheaper hand-off
        self._inline_off_until = 0.0  # monotonic: until then, jobs go to the handler threads
        self._long_jobs = 0  # jobs in a row that were not short, run on the consumer thread
        #: The handler threads started so far.
        self.threads: list[threading.Thread] = []
        #: The lending of the consumer's connection while its thread runs a job.
        self.handover = Handover(consumer, self.to_pool)

    def receive(self, delivery: Delivery) -> None:
        """A delivery of the current pass: run or handed out after the pass (:meth:`run_ready`)."""
        self._ready.append(delivery)

    def run_ready(self) -> None:
        """After each pass of the consumer loop, in the consumer thread: run the pass's
        deliveries here while jobs are short, else hand them to the handler threads."""
        ready = self._ready
        while ready:
            if not self.inline or (self._inline_off_until and not self._may_look()):
                self.to_pool()
                return
            try:
                delivery = ready.popleft()
            except IndexError:  # stop() handed it back meanwhile
                return
            self._run_inline(delivery)

    def _run_inline(self, delivery: Delivery) -> None:
        """Run ``delivery``'s job in the consumer thread, the connection lent to the stand-in meanwhile."""
        handover = self.handover
        started, cpu = time.monotonic(), time.thread_time()
        handover.lend()
        try:
            self._handle(delivery)
        finally:
            handover.reclaim()
        took = time.monotonic() - started
        if took <= handover.patience and took - (time.thread_time() - cpu) <= INLINE_MAX_WAIT:
            self._long_jobs = 0
        else:
            # Two in a row: one alone may have waited for the CPU (another process, the GIL).
            self._long_jobs += 1
            if self._long_jobs >= 2 or took > handover.patience:
                self._inline_off_until = started + took + POOL_SPELL
                self._long_jobs = 0

    def _may_look(self) -> bool:
        """After the spell of a job that was not short: whether a job may run here again, to look.

        Only with no job running on a handler thread: a job here would wait for the GIL
        meanwhile, and look like one that waits.
        """
        if time.monotonic() < self._inline_off_until or self._in_flight():
            return False
        self._inline_off_until = 0.0
        return True

    def to_pool(self) -> None:
        """Hand every delivery not started yet to the handler threads (the stand-in's pass, too)."""
        ready = self._ready
        while ready:
            try:
                self._work.put(ready.popleft())
            except IndexError:
                return

    def submit(self, delivery: Delivery) -> None:
        """Hand ``delivery`` to the handler threads (a job parked for its permits, now admitted)."""
        self._work.put(delivery)

    def unstarted(self) -> Iterator[Delivery]:
        """At shutdown: take every delivery no thread has started yet, one at a time."""
        self.to_pool()  # the consumer thread's unstarted ones join the handler threads' queue
        while True:
            try:
                delivery = self._work.get_nowait()
            except queue_module.Empty:
                return
            if delivery is None:  # a concurrent stop()'s sentinel: leave it for its thread
                self._work.put(None)
                return
            yield delivery

    def add_threads(self, wanted: int, name: str = "ojs-handler") -> None:
        """Start handler threads until there are ``wanted`` of them."""
        while len(self.threads) < wanted:
            thread = threading.Thread(target=self._work_loop, name=f"{name}-{len(self.threads)}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def _work_loop(self) -> None:
        while (delivery := self._work.get()) is not None:
            self._handle(delivery)

    def release_threads(self) -> None:
        """Have every handler thread end once the deliveries handed to it so far are done."""
        for _ in self.threads:
            self._work.put(None)

    def join_threads(self, timeout: float) -> None:
        """Wait up to ``timeout`` for each handler thread to end."""
        for thread in self.threads:
            thread.join(timeout=timeout)


__all__ = ["INLINE_MAX_WAIT", "POOL_SPELL", "Dispatch"]
