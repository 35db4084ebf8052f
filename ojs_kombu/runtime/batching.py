"""Batch consumption (seed 002, DESIGN §21): a batch handler runs a list of jobs at once.

A job whose type has a batch handler (:meth:`Worker.batch_handler
<ojs_kombu.runtime.worker.Worker.batch_handler>`) is judged like any other
(:meth:`Settler.triage <ojs_kombu.runtime.settle.Settler.triage>`), then, instead of running,
joins its type's :class:`Batcher`: one thread per batch handler collects up to ``size`` jobs,
or what arrived within ``timeout`` seconds of the first, and calls the handler with them
(a :class:`~ojs_kombu.runtime.processing.RunningJob` each) while the next batch collects.

* A job cancelled before its batch is called is dropped from it (settled as cancelled).
* The handler returns: every job succeeded.  It returns a list as long as the batch: the
  item of each job is its result, or, an exception, its failure.  It raises
  :class:`~ojs_kombu.errors.BatchItemFailed` ``(index, exc)``: that job failed, the others
  succeeded.  It raises anything else: every job failed with it.  Each failed job follows its
  own retry policy (retry, dead letter, discard), as a plain handler's would.
* The jobs are settled through the Settler as one by one (their events, unique locks ...), its
  acks collected and made one request: one ``Basic.Ack(multiple=True)`` when the batch's
  delivery tags are the channel's outstanding ones up to the highest; else (another handler's
  delivery, or a failed member's republish waiting for its confirm, lies among them) one
  ``Basic.Ack`` each, in the same outbox flush (:meth:`SettleExecutor.ack_many
  <ojs_kombu.runtime.requests.SettleExecutor.ack_many>`).
* A graceful stop runs the batch in collection at once (within the grace period), then the
  collector ends.  A worker that dies mid-batch leaves every member to the broker (redelivered).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ojs_kombu.amqp.publisher import Destination
from ojs_kombu.errors import BatchItemFailed
from ojs_kombu.model.job import Job
from ojs_kombu.runtime.control import RunningEntry
from ojs_kombu.runtime.delivery import Delivery
from ojs_kombu.runtime.handlers import BatchSpec
from ojs_kombu.runtime.settle import Settlement

if TYPE_CHECKING:
    from ojs_kombu.runtime.processing import Processing

logger = logging.getLogger(__name__)

#: The longest a collector waits without looking whether the worker drains.
_DRAIN_LOOK = 0.05

_Item = tuple[Delivery, Job]


def _no_interrupt() -> None:
    """A batch's thread runs every member: a cancel marks its member, never interrupts the batch."""


class CollectedAcks:
    """A :class:`~ojs_kombu.runtime.settle.Settlement` that keeps the acks of a batch (for one request)
    and passes nacks and republishes on to the consumer.

    Parameters:
        consumer: the worker's consumer.
    """

    def __init__(self, consumer: Settlement) -> None:
        self.consumer = consumer
        #: The deliveries acked so far.
        self.acked: list[Delivery] = []

    def ack(self, delivery: Delivery) -> None:
        """Keep ``delivery``'s ack for the batch's one request."""
        self.acked.append(delivery)

    def nack(
        self,
        delivery: Delivery,
        record: Destination | None = None,
        prepare: Callable[[Any, Destination], None] | None = None,
    ) -> None:
        """As :meth:`Settlement.nack <ojs_kombu.runtime.settle.Settlement.nack>`, at once."""
        self.consumer.nack(delivery, record, prepare)

    def republish(
        self,
        delivery: Delivery,
        destination: Destination | Callable[[], Destination],
        queue: str,
        prepare: Callable[[Any, Destination], None] | None = None,
    ) -> None:
        """As :meth:`Settlement.republish <ojs_kombu.runtime.settle.Settlement.republish>`, at once."""
        self.consumer.republish(delivery, destination, queue, prepare)


def outcomes(size: int, returned: Any, raised: BaseException | None) -> list[tuple[BaseException | None, Any]]:
    """Each member's ``(failure, result)`` from what a batch handler of ``size`` jobs did.

    Parameters:
        size: the number of jobs it was called with.
        returned: what it returned (``raised`` None).
        raised: what it raised, or None.

    Returns:
        ``size`` pairs, in the order of the jobs.
    """
    if isinstance(raised, BatchItemFailed) and 0 <= raised.index < size:
        return [(raised.exc, None) if i == raised.index else (None, None) for i in range(size)]
    if raised is not None:
        return [(raised, None)] * size
    if isinstance(returned, list | tuple) and len(returned) == size:
        return [(r, None) if isinstance(r, BaseException) else (None, r) for r in returned]
    return [(None, None)] * size


class Batcher:
    """Collects the jobs of one batch handler and runs them, on its own thread (see the module).

    Parameters:
        job_type: the handler's job type (names the thread).
        spec: the handler, its size and timeout.
        processing: the worker's processing (its Settler, cancellations, lifecycle, counts).
        ack_many: acks a batch's deliveries (one request, :meth:`Consumer.ack_many
            <ojs_kombu.runtime.consumer.Consumer.ack_many>`).
        running: makes each member's :class:`~ojs_kombu.runtime.processing.RunningJob`.
    """

    def __init__(
        self,
        job_type: str,
        spec: BatchSpec,
        processing: Processing,
        ack_many: Callable[[list[Delivery]], None],
        running: Callable[[Job, int, RunningEntry], Job],
    ) -> None:
        self.job_type = job_type
        self.spec = spec
        self._processing = processing
        self._ack_many = ack_many
        self._running = running
        self._pending: deque[_Item] = deque()  # joined, not yet passed to the handler
        self._lock = threading.Lock()  # orders add() and the collector's take
        self._wake = threading.Event()  # a first job joined, the batch is full, or stop()
        self._ending = False
        self._thread = threading.Thread(target=self._loop, name=f"ojs-batch-{job_type}", daemon=True)
        self._thread.start()
        #: Batches called so far.
        self.batches = 0

    def add(self, delivery: Delivery, job: Job) -> None:
        """``job`` (judged to run) joins the batch in collection."""
        with self._lock:
            self._pending.append((delivery, job))
            count = len(self._pending)
        # The collector wakes for the first job and for a full batch, not for each job (a thread
        # switch per job would cost more than the job's share of the batch).
        if count == 1 or count == self.spec.size:
            self._wake.set()

    def stop(self) -> None:
        """End the collector once the items added so far have run."""
        self._ending = True
        self._wake.set()

    @property
    def held(self) -> int:
        """The jobs that joined and have not been passed to the handler yet."""
        return len(self._pending)

    def _loop(self) -> None:
        pending, wake, draining = self._pending, self._wake, self._processing.draining
        size, timeout = self.spec.size, self.spec.timeout
        while True:
            wake.clear()
            if not pending:
                if self._ending:
                    return
                wake.wait()
                continue
            deadline = time.monotonic() + timeout
            while len(pending) < size and not self._ending and not draining.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wake.clear()
                if len(pending) < size:
                    wake.wait(min(left, _DRAIN_LOOK))
            with self._lock:
                batch = [pending.popleft() for _ in range(min(size, len(pending)))]
            self.run(batch)

    def run(self, batch: list[_Item]) -> None:
        """Call the handler with ``batch``'s jobs (the cancelled ones dropped) and settle each."""
        processing = self._processing
        settler = copy.copy(processing.settler)
        collected = CollectedAcks(settler.consumer)
        settler.consumer = collected
        members: list[tuple[Delivery, Job, int, RunningEntry]] = []
        processing._began(len(batch))
        try:
            for delivery, job in batch:
                attempt = job.attempt + 1
                if processing.cancellations.is_cancelled(job.id):
                    settler.cancel(delivery, job, attempt, "pending")
                    continue
                entry = processing.cancellations.enter(job.id, job.queue, interrupt=_no_interrupt)
                members.append((delivery, job, attempt, entry))
                processing.lifecycle.emit("started", job, attempt)
            if members:
                self.batches += 1
                returned: Any = None
                raised: BaseException | None = None
                try:
                    returned = self.spec.fn([self._running(job, attempt, entry) for _, job, attempt, entry in members])
                except BaseException as exc:  # noqa: BLE001 - every outcome settles the members
                    raised = exc
                finally:
                    for *_, entry in members:
                        processing.cancellations.leave(entry)
                for (delivery, job, attempt, _), (failure, result) in zip(
                    members, outcomes(len(members), returned, raised), strict=True
                ):
                    try:
                        processing._settle_run(delivery, job, attempt, failure, result, settler=settler)
                    except Exception:  # noqa: BLE001 - logged with its traceback, the delivery dead-lettered
                        processing.settler.reject_unexpected(delivery)
        finally:
            self._ack_many(collected.acked)
            processing._done(len(batch))


class Batching:
    """The batch handlers' collectors of one worker, started on their first job.

    Parameters:
        processing: the worker's processing.
        ack_many: acks a batch's deliveries (one request).
        running: makes each member's running job.
    """

    def __init__(
        self,
        processing: Processing,
        ack_many: Callable[[list[Delivery]], None],
        running: Callable[[Job, int, RunningEntry], Job],
    ) -> None:
        self._processing = processing
        self._ack_many = ack_many
        self._running = running
        self._lock = threading.Lock()
        #: The collectors started (job type -> batcher).
        self.batchers: dict[str, Batcher] = {}

    def take(self, delivery: Delivery, job: Job) -> bool:
        """Add ``job`` to its batch handler's batch; False if its type has none (a plain job)."""
        spec = self._processing.handlers.batches.get(job.type)
        if spec is None:
            return False
        batcher = self.batchers.get(job.type)
        if batcher is None or batcher.spec is not spec:
            with self._lock:
                batcher = self.batchers.get(job.type)
                if batcher is None or batcher.spec is not spec:
                    if batcher is not None:
                        batcher.stop()  # re-registered: the old collector runs what it has
                    batcher = self.batchers[job.type] = Batcher(
                        job.type, spec, self._processing, self._ack_many, self._running
                    )
        batcher.add(delivery, job)
        return True

    def stop(self) -> None:
        """End every collector (after what it has ran)."""
        with self._lock:
            for batcher in self.batchers.values():
                batcher.stop()


__all__ = ["Batcher", "Batching", "CollectedAcks", "outcomes"]
