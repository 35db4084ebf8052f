"""Running one job: its handler in a slot of the worker's concurrency, then its outcome to the Settler.

:class:`Processing` is what a :class:`~ojs_kombu.runtime.worker.Worker` does with each
delivery its :class:`~ojs_kombu.runtime.dispatch.Dispatch` hands to a thread: judge it
(:meth:`Settler.triage <ojs_kombu.runtime.settle.Settler.triage>`, the one place a delivery
is judged before it runs), run the job's handler with :func:`current_job` set (a plain
handler in the calling thread, an ``async def`` as a task of the worker's event loop,
:mod:`~ojs_kombu.runtime.coroutines`), and turn what the handler did into one call of the
Settler: :meth:`~ojs_kombu.runtime.settle.Settler.succeed` (with the handler's return value),
:meth:`~ojs_kombu.runtime.settle.Settler.cancel` (cancelled while it ran), or
:meth:`~ojs_kombu.runtime.settle.Settler.fail_attempt` (its retry policy decides).
A job with concurrency limits takes its permits first (:class:`~ojs_kombu.runtime.limits.Limiter`),
and gives them back once its run is settled.
While the worker drains (a graceful shutdown) a job not started yet is handed back instead.
It also counts what the shutdown waits for: the deliveries not yet settled, the jobs running.

What the worker does with every kind of delivery (DESIGN §5):

===========================================  ===================================================
delivery                                     outcome
===========================================  ===================================================
handler returned                             ``Basic.Ack``
handler raised, attempts left                retry queue (confirmed publish, attempt+1), then ack
handler raised, exhausted / non-retryable    ``Basic.Nack(requeue=False)`` -> ``ojs.queue.dlx.{q}``
                                             (ack and drop if ``on_exhaustion="discard"``)
``redelivered`` (a worker died running it)   a failed attempt with error code ``worker_lost``
cancelled (``Client.cancel``) before it ran   ack, not run (logged, counted)
cancelled while running                      ``current_job().cancelled`` set, ``Cancelled`` raised in
                                             the handler (unless ``cancel_running="cooperative"``);
                                             ack whatever the handler then does, never retried
``expires_at`` passed                        ack, not run (logged)
``scheduled_at`` still ahead                 back into the scheduler (confirmed), then ack
no free permit for its ``rate_limit``        ``on_limit``: wait unacked off the concurrency slots
(or its queue's ``rate_limits``)             (or back through the scheduler), reschedule, or drop
                                             (``docs/limits.md``)
undecodable / invalid envelope / no handler  republished to the DLQ with ``x-ojs-error-code``
                                             and ``x-ojs-error-message``, then ack
handler raised ``SystemExit`` or             a failed attempt like any exception (retry or DLQ),
``KeyboardInterrupt``                        then the worker shuts down gracefully (see below)
===========================================  ===================================================
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from pydantic import PrivateAttr

from ojs_kombu.errors import Cancelled, OjsError
from ojs_kombu.model.job import Job
from ojs_kombu.model.workflow import WorkflowContext
from ojs_kombu.observability.logs import job_log_extra
from ojs_kombu.observability.tracing import job_span
from ojs_kombu.policy.retry import Failure, decide
from ojs_kombu.runtime.control import Cancellations, RunningEntry
from ojs_kombu.runtime.coroutines import CoroutineRunner
from ojs_kombu.runtime.delivery import Delivery
from ojs_kombu.runtime.handlers import Handlers
from ojs_kombu.runtime.lifecycle import Lifecycle
from ojs_kombu.runtime.limits import Admitted, Limiter
from ojs_kombu.runtime.settle import Settler

logger = logging.getLogger(__name__)


class BatchTaker(Protocol):
    """Where jobs of batch handlers go (:class:`~ojs_kombu.runtime.batching.Batching`)."""

    def take(self, delivery: Delivery, job: Job) -> bool:
        """Add ``job`` to its batch; False if its type has no batch handler."""

    def stop(self) -> None:
        """End the collectors."""


class RunningJob(Job):
    """The job a handler is running, as :func:`current_job` returns it: a :class:`Job` plus
    :attr:`cancelled`."""

    _run: RunningEntry | None = PrivateAttr(default=None)
    _results: Callable[[str], dict[str, Any]] | None = PrivateAttr(default=None)

    @property
    def cancelled(self) -> threading.Event:
        """Set (within ~1 s of ``Client.cancel``) when the job has been cancelled; a handler may poll it."""
        run = self._run
        if run is None:  # made by hand, not by a Worker: nothing will cancel it
            run = self._run = RunningEntry(self.id, self.queue, threading.get_ident())
        return run.cancelled  # made when first asked for: most runs never look

    @property
    def parent_results(self) -> dict[str, Any]:
        """The results this job of a workflow receives (ojs-workflows.md §7), keyed by step index as a string.

        A chain's step N: every earlier step's result (``{"0": ..., "N-1": ...}``); a batch's
        callback: every job's (a failed one's is ``{"error": {...}}``); ``{}`` for a job that is
        not part of a workflow, or the first step.  A batch's callback whose jobs' results are over
        :data:`~ojs_kombu.model.workflow.MAX_INLINE_RESULTS_BYTES` together does not carry them: they
        are read from the batch's fan-in (``meta.workflow.results_from``) when first asked for.

        Raises:
            OjsError: the results are in the fan-in and it could not be read (or the job was not
                made by a Worker, which alone can read it).
        """
        context = WorkflowContext.from_meta(self.meta)
        if context is None:
            return {}
        if context.results_from is None:
            return dict(context.parent_results)
        if self._results is None:
            raise OjsError(
                f"job {self.id}'s parent results are in fan-in {context.results_from}: only a Worker reads them"
            )
        return {**context.parent_results, **self._results(context.results_from)}

    @classmethod
    def of(
        cls, job: Job, attempt: int, run: RunningEntry, results: Callable[[str], dict[str, Any]] | None = None
    ) -> RunningJob:
        """``job`` at execution ``attempt``, in the Worker's ``run`` of it.

        A copy of ``job``'s validated state, built the way pydantic's ``model_copy`` builds one
        (no validation, no default factories: this runs per job).

        Parameters:
            job: the job as decoded.
            attempt: this execution, 1-based.
            run: the run's entry in :class:`~ojs_kombu.runtime.control.Cancellations` (its
                ``cancelled`` event).
            results: reads a fan-in's results (``meta.workflow.results_from``), for :attr:`parent_results`.

        Returns:
            The running job.
        """
        running = cls.__new__(cls)
        object.__setattr__(running, "__dict__", {**job.__dict__, "attempt": attempt})
        object.__setattr__(running, "__pydantic_fields_set__", job.__pydantic_fields_set__ | {"attempt"})
        object.__setattr__(running, "__pydantic_extra__", dict(job.__pydantic_extra__ or {}))
        object.__setattr__(running, "__pydantic_private__", {"_run": run, "_results": results})
        return running


_current_job: contextvars.ContextVar[RunningJob | None] = contextvars.ContextVar("ojs_current_job", default=None)


def current_job() -> RunningJob:
    """The job the calling handler is running (``attempt`` is this execution, 1-based), with its
    ``cancelled`` event.

    Raises :class:`~ojs_kombu.errors.OjsError` outside a handler.
    """
    job = _current_job.get()
    if job is None:
        raise OjsError("current_job() is only available inside a job handler")
    return job


class Processing:
    """Runs the jobs of one consumer's deliveries and settles them (see the module docstring).

    Parameters:
        settler: settles every delivery (and judges it first).
        handlers: the worker's registry.
        cancellations: the cancels known, and the runs it registers (to interrupt them).
        lifecycle: where ``started`` goes (the Settler emits the outcomes).
        concurrency: jobs run at once, on any thread.
        worker_id: names the event loop's thread.
        on_exit: called with a handler's ``SystemExit`` / ``KeyboardInterrupt`` once its job is
            settled: the worker shuts down.
    """

    def __init__(
        self,
        settler: Settler,
        handlers: Handlers,
        cancellations: Cancellations,
        lifecycle: Lifecycle,
        concurrency: int,
        *,
        worker_id: str,
        on_exit: Callable[[BaseException], None],
    ) -> None:
        self.settler = settler
        self.handlers = handlers
        self.cancellations = cancellations
        self.lifecycle = lifecycle
        self.worker_id = worker_id
        self.on_exit = on_exit
        #: Set by a graceful shutdown: a job not started yet is handed back, not run.
        self.draining = threading.Event()
        #: Jobs running now (on any thread).
        self.in_flight = 0
        #: Deliveries received and not yet settled (acked, republished, handed back ...).
        self.unsettled = 0
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(concurrency)  # jobs running at once, on any thread
        self._runner: CoroutineRunner | None = None  # the event loop, made for the first coroutine job
        self._runner_lock = threading.Lock()
        #: The batch handlers' collectors (set by the Worker): a job of theirs joins a batch.
        self.batching: BatchTaker | None = None
        #: The concurrency limits (set by the Worker): a limited job runs holding its permits.
        self.limiter: Limiter | None = None

    def received(self) -> None:
        """A delivery arrived (counted until it is settled)."""
        with self._lock:
            self.unsettled += 1

    def handle(self, delivery: Delivery) -> None:
        """Run ``delivery``'s job and settle it (or hand it back unstarted when draining), in one
        of the ``concurrency`` slots (the consumer thread's job takes one too)."""
        with self._slots:
            self._handle_in_slot(delivery)

    def _handle_in_slot(self, delivery: Delivery) -> None:
        if self.draining.is_set():
            self.hand_back(delivery)
            return
        with self._lock:
            self.in_flight += 1
        deferred = False  # a coroutine job: counted out when its coroutine ends
        try:
            deferred = self._process(delivery)
        except Exception:  # noqa: BLE001 - logged with its traceback, the delivery dead-lettered
            self.settler.reject_unexpected(delivery)
        finally:
            if not deferred:
                self._done()

    def _began(self, count: int) -> None:
        """``count`` collected jobs (a batch) start running: in flight until :meth:`_done`."""
        with self._lock:
            self.in_flight += count

    def _done(self, count: int = 1) -> None:
        """A job (``count`` of a batch) left its slot: run and settled, or left to the broker."""
        with self._lock:
            self.in_flight -= count
            self.unsettled -= count

    def forsake(self, delivery: Delivery) -> None:
        """A delivery parked for its permits whose connection was lost (the broker has it back): counted out, never run."""
        with self._lock:
            self.unsettled -= 1

    def hand_back(self, delivery: Delivery) -> None:
        """An unstarted job at shutdown: back to its queue unchanged (no attempt spent)."""
        if self.limiter is not None:
            self.limiter.forget(delivery)
        try:
            self.settler.hand_back(delivery)
        finally:
            with self._lock:
                self.unsettled -= 1

    def _process(self, delivery: Delivery) -> bool:
        """Run ``delivery``'s job and settle it; True when it went to the event loop instead
        (an ``async def`` handler), which settles it when its coroutine ends."""
        limiter = self.limiter
        job = self.settler.triage(delivery)
        if job is None:
            if limiter is not None:
                limiter.forget(delivery)  # admitted after waiting, then cancelled meanwhile ...
            return False
        if self.batching is not None and self.batching.take(delivery, job):
            # Collected, not running (its batch counts it in while it runs): else a drain would never
            # let the dispatch run jobs on the consumer thread again (Dispatch waits for in_flight == 0).
            with self._lock:
                self.in_flight -= 1
            return True  # settled, and counted out, when its batch has run (runtime/batching.py)
        attempt = job.attempt + 1
        handler = self.handlers.get(job.type)
        if handler is None:
            self.settler.reject_invalid(delivery, "unknown_type", f"no handler is registered for job type {job.type!r}")
            self.settler.ended(job, "discarded")
            return False
        held: Admitted = ()
        if limiter is not None:
            verdict = limiter.admit(delivery, job)
            if isinstance(verdict, str):
                if verdict == "parked":  # not running, still unsettled: back through handle() with its permits
                    with self._lock:
                        self.in_flight -= 1
                    return True
                return False  # settled: rescheduled or dropped
            held = verdict
            if held:
                try:
                    return self._run(delivery, job, attempt, handler, held)
                except BaseException:
                    limiter.release(held)  # settled already, or a bug of ours before: not held past it
                    raise
        return self._run(delivery, job, attempt, handler, held)

    def _run(self, delivery: Delivery, job: Job, attempt: int, handler: Callable[..., Any], held: Admitted) -> bool:
        """Run ``job``'s handler and settle it (True: it went to the event loop, which settles it)."""
        if self.handlers.is_async(job.type):
            self._coroutines().submit(partial(self._run_coroutine, delivery, job, attempt, handler, held))
            return True
        token = None
        self.lifecycle.emit("started", job, attempt)
        try:
            with self.cancellations.running(job.id, job.queue) as entry:
                token = _current_job.set(RunningJob.of(job, attempt, entry, self._fan_in_results))
                with job_span(job, attempt):
                    result = handler(*job.args, **job.kwargs)
        except BaseException as exc:  # noqa: BLE001 - every outcome settles the delivery
            self._settle_run(delivery, job, attempt, exc, held=held)
        else:
            self._settle_run(delivery, job, attempt, None, result, held=held)
        finally:
            if token is not None:
                _current_job.reset(token)
        return False

    def _fan_in_results(self, fan_in_id: str) -> dict[str, Any]:
        """A fan-in's results, for a callback whose ``parent_results`` were too big to carry (``results_from``)."""
        hook = self.settler.workflow
        if hook is None:
            raise OjsError(f"the results of fan-in {fan_in_id} are read by a worker's workflow hook; this one has none")
        return hook.results(fan_in_id)

    def _coroutines(self) -> CoroutineRunner:
        """The worker's event loop for ``async def`` handlers, started on first use."""
        runner = self._runner
        if runner is None:
            with self._runner_lock:
                runner = self._runner
                if runner is None:
                    runner = self._runner = CoroutineRunner(f"ojs-coroutines-{self.worker_id}")
        return runner

    def stop_coroutines(self) -> None:
        """Stop the event loop (its coroutines still running are left to the broker), if started."""
        if self._runner is not None:
            self._runner.stop()
        if self.batching is not None:
            self.batching.stop()

    async def _run_coroutine(
        self, delivery: Delivery, job: Job, attempt: int, handler: Callable[..., Any], held: Admitted = ()
    ) -> None:
        """A coroutine job, as :meth:`_process` runs a plain one: its own task, its own ``current_job()``.

        In ``"interrupt"`` mode a cancel cancels the task (``asyncio.CancelledError`` in the handler);
        the run is settled as cancelled.  A task cancelled because the worker stops past its grace
        period is not settled: the broker redelivers the job.
        """
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def interrupt() -> None:
            if task is not None:
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # the loop is closed: the worker has stopped
                    pass

        try:
            self.lifecycle.emit("started", job, attempt)
            outcome: BaseException | None = None
            result: Any = None
            entry = self.cancellations.enter(job.id, job.queue, interrupt=interrupt)
            try:
                _current_job.set(RunningJob.of(job, attempt, entry, self._fan_in_results))  # the task's own context
                if entry.is_cancelled:  # cancelled before the task could be interrupted
                    raise Cancelled()
                with job_span(job, attempt):
                    result = await handler(*job.args, **job.kwargs)
            except asyncio.CancelledError:
                if not entry.is_cancelled:
                    raise
                outcome = Cancelled()
            except BaseException as exc:  # noqa: BLE001 - every outcome settles the delivery
                outcome = exc
            finally:
                self.cancellations.leave(entry)
            self._settle_run(delivery, job, attempt, outcome, result, held=held)
        except asyncio.CancelledError:
            logger.warning(
                "job %s still running when the worker stopped; the broker will redeliver it",
                job.id,
                extra=job_log_extra(job, attempt),
            )
        except Exception:  # noqa: BLE001 - logged with its traceback, the delivery dead-lettered
            self.settler.reject_unexpected(delivery)
        finally:
            if held and self.limiter is not None:
                self.limiter.release(held)  # given back by _settle_run already, unless it was not reached
            self._done()

    def _settle_run(
        self,
        delivery: Delivery,
        job: Job,
        attempt: int,
        exc: BaseException | None,
        result: Any = None,
        *,
        settler: Settler | None = None,
        held: Admitted = (),
    ) -> None:
        """Settle a run of ``job`` whose handler returned ``result`` (``exc`` None) or raised ``exc``
        (through ``settler``: a batch's keeps its acks; default the worker's), then give back the
        permits it ran ``held`` (the one place they are given back after a run)."""
        try:
            self._settle_outcome(delivery, job, attempt, exc, result, settler or self.settler)
        finally:
            if held and self.limiter is not None:
                self.limiter.release(held)

    def _settle_outcome(
        self, delivery: Delivery, job: Job, attempt: int, exc: BaseException | None, result: Any, settler: Settler
    ) -> None:
        if self.cancellations.is_cancelled(job.id):
            settler.cancel(delivery, job, attempt, "running")  # whatever the handler then did
            if exc is not None and not isinstance(exc, Exception | Cancelled):
                self.on_exit(exc)  # SystemExit / KeyboardInterrupt: the job is settled, then exit
            return
        if exc is None:
            settler.succeed(delivery, job, attempt, result)
            return
        extra = job_log_extra(job, attempt)
        logger.info("job %s (%s) attempt %d failed: %r", job.id, job.type, attempt, exc, extra=extra)
        settler.fail_attempt(delivery, job, attempt, Failure.from_exception(exc), decide(job, attempt, exc))
        if not isinstance(exc, Exception):  # SystemExit, KeyboardInterrupt: the program wants to end
            logger.error(
                "the handler of job %s raised %s: attempt %d failed; the worker shuts down",
                job.id,
                type(exc).__name__,
                attempt,
                extra=extra,
            )
            self.on_exit(exc)


__all__ = ["BatchTaker", "Processing", "RunningJob", "current_job"]
