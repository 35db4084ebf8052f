"""Workflows performed: the planner's actions (:mod:`ojs_kombu.policy.workflow`) carried out on RabbitMQ.

* :class:`WorkflowRunner` performs actions over one py-amqp connection: ``OpenFanIn`` →
  :meth:`FanIn.open <ojs_kombu.amqp.fanin.FanIn.open>`; ``Enqueue`` → the job, with its
  ``meta.workflow``, published (confirmed) to its job queue; ``Report`` →
  :meth:`FanIn.report <ojs_kombu.amqp.fanin.FanIn.report>`, and for the one reporter that gets
  ``Ready``, :func:`~ojs_kombu.policy.workflow.after_fan_in`'s actions, its jobs published through
  :meth:`FanIn.fire <ojs_kombu.amqp.fanin.FanIn.fire>` (so a winner run again publishes only
  what it had not); ``Finished`` → a ``finished`` record, the fan-in streams deleted, and the
  workflow's sweep job (:func:`sweep_job`) published to the queue of the job that ended it.  Every
  job that ends records a ``step`` in the workflow's record stream
  (:mod:`ojs_kombu.amqp.workflowlog`), which ``Client.workflow(id)`` reads.
  ``Client.enqueue_workflow`` uses :meth:`WorkflowRunner.start`.
* :class:`WorkflowHook` is the worker's completion hook: :meth:`WorkflowHook.on_terminal` when a
  job reached a terminal state (completed; failed for good: dead-lettered or discarded;
  cancelled), called *before* the job is acknowledged, so a worker that dies in between runs the
  job again and reports again, which the fan-in counts once.  A job without ``meta.workflow``
  costs a dictionary look-up.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Final, Literal, NamedTuple, TypeVar

from amqp import Connection
from kombu.connection import Connection as KombuConnection

from ojs_kombu.amqp.connection import close_quietly
from ojs_kombu.amqp.fanin import FanIn, MemberReport, Pending, Ready
from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.amqp.workflowlog import WorkflowLog
from ojs_kombu.errors import OjsError, ResultTooLargeError, ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import SWEEP_JOB_TYPE
from ojs_kombu.model.timefmt import format_timestamp, utcnow
from ojs_kombu.model.workflow import (
    WORKFLOW_META_KEY,
    Batch,
    Group,
    Node,
    Workflow,
    WorkflowContext,
    check_result,
    workflow_from_dict,
    workflow_to_dict,
)
from ojs_kombu.policy.schedule import Cascade
from ojs_kombu.policy.workflow import (
    Enqueue,
    Finished,
    OpenFanIn,
    Report,
    WorkflowAction,
    advance_workflow,
    after_fan_in,
    callbacks_fan_in_id,
    start_workflow,
)
from ojs_kombu.wire.codec import OutgoingMessage, encode

logger = logging.getLogger(__name__)

T = TypeVar("T")

TerminalState = Literal["completed", "failed", "cancelled"]
"""How a job of a workflow ended, as the completion hook is told."""

_CANCELLED_ERROR: Final = {"code": "cancelled", "message": "the job was cancelled"}

DEFAULT_SWEEP_AFTER: Final = 24 * 3600.0
"""Seconds an ended workflow's record stream is kept (``Client.workflow(id)`` reads it) before its
sweep job deletes it: the ``sweep_after`` of :class:`WorkflowRunner` and :class:`WorkflowHook`."""


def check_retention(value: Any) -> float | None:
    """``value`` if it is a valid ``workflow_retention``: seconds (a positive number) or ``None`` (never swept).

    Parameters:
        value: the option as given.

    Returns:
        The seconds as a float, or None.

    Raises:
        ValidationError: ``field="workflow_retention"``: not a positive finite number nor None.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValidationError(
            f"workflow_retention must be a positive number of seconds or None, got {value!r}",
            field="workflow_retention",
        )
    return float(value)


def sweep_job(workflow_id: str, queue: str, after: float) -> Job:
    """The job that deletes an ended workflow's record stream and cancel marker ``after`` seconds from now.

    Type :data:`~ojs_kombu.model.naming.SWEEP_JOB_TYPE` (which ``Job.create`` refuses a producer),
    args ``[workflow_id]``; every consumer's triage (:meth:`Settler.triage
    <ojs_kombu.runtime.settle.Settler.triage>`) carries it out and acks it, no handler sees it.

    Parameters:
        workflow_id: the root workflow's id.
        queue: the OJS queue it goes to (the one of the job that ended the workflow).
        after: seconds from now.

    Returns:
        The job.
    """
    job = Job.create("ojs.workflow.swept", [workflow_id], queue=queue, scheduled_at=timedelta(seconds=after))
    return job.model_copy(update={"type": SWEEP_JOB_TYPE})  # the reserved type, set past the producer's check


class Ended(NamedTuple):
    """A job of a workflow that ended for good: the arguments of :meth:`WorkflowRunner.ended`."""

    job: Job
    context: WorkflowContext
    state: TerminalState
    result: Any = None
    error: Mapping[str, Any] | None = None


def workflow_job(job: Job, context: WorkflowContext) -> Job:
    """``job`` carrying ``context`` in ``meta.workflow``.

    Parameters:
        job: a job of the definition.
        context: its place in the workflow.

    Returns:
        A copy of ``job`` (the same id).
    """
    meta = {**(job.meta or {}), WORKFLOW_META_KEY: context.to_meta()}
    return job.model_copy(update={"meta": meta})


def fan_in_ids(workflow: Workflow) -> list[str]:
    """Every fan-in a workflow may open: each group's and batch's, and each batch's callbacks'.

    Parameters:
        workflow: the root definition.

    Returns:
        The fan-in ids.
    """
    found: list[str] = []

    def walk(node: Node) -> None:
        if isinstance(node, Job):
            return
        if isinstance(node, (Group, Batch)):
            found.append(node.id)
        if isinstance(node, Batch):
            found.append(callbacks_fan_in_id(node.id))
        for member in node.members:
            walk(member)

    walk(workflow)
    return found


class WorkflowRunner:
    """Performs workflow actions over one py-amqp connection (one thread).

    Parameters:
        connection: a connected py-amqp connection.
        topology: declares the job queues the workflow's jobs go to (and names every entity).
        app_id: ``app_id`` of the published jobs.
        sweep_after: seconds an ended workflow's record stream is kept before its sweep job deletes
            it (:data:`DEFAULT_SWEEP_AFTER`); ``None``: kept (until its clean-up by hand).
    """

    def __init__(
        self,
        connection: Connection,
        topology: Topology,
        *,
        app_id: str | None = "ojs",
        sweep_after: float | None = DEFAULT_SWEEP_AFTER,
    ):
        self.connection = connection
        self.topology = topology
        self.names = topology.names
        self.app_id = app_id
        self.sweep_after = sweep_after
        self.fan_in = FanIn(connection, names=self.names)
        self.log = WorkflowLog(connection, names=self.names)
        self._publisher = ConfirmedPublisher(connection)
        self.cascade = Cascade(self.names)
        self._cancelled_ids: set[str] = set()

    def start(self, workflow: Workflow, *, enqueue: bool = True) -> str:
        """Record ``workflow``'s definition, open its first fan-ins and publish its first jobs.

        Parameters:
            workflow: the definition.
            enqueue: False when the first jobs are published by their framework with their
                ``meta.workflow`` (a Celery chord's header tasks): only the fan-ins are opened.

        Returns:
            Its id.

        Raises:
            ValidationError: a job cannot be encoded (e.g. over 1 MiB with its continuation).
            PublishError: a record or a job was not confirmed.
        """
        self.log.open(workflow.id, {**workflow_to_dict(workflow)})
        self.log.append(workflow.id, {"kind": "enqueued", "at": _now()})
        actions = start_workflow(workflow)
        self.perform(actions if enqueue else [action for action in actions if isinstance(action, OpenFanIn)], new=True)
        return workflow.id

    def ended(
        self,
        job: Job,
        context: WorkflowContext,
        state: TerminalState,
        result: Any = None,
        error: Mapping[str, Any] | None = None,
    ) -> None:
        """A job of a workflow ended for good: record it, then perform what follows.

        A cancelled job counts as failed (``code: cancelled``): what depends on it does not run
        (§9.2), a batch's ``on_failure`` does.  A completed job's result over
        :data:`~ojs_kombu.model.workflow.MAX_RESULT_BYTES` (or not JSON) counts as failed with
        ``result_too_large`` (``invalid_result``).

        Parameters:
            job: the job as delivered.
            context: its ``meta.workflow``.
            state: how it ended.
            result: its handler's return value (completed).
            error: its OJS error object (failed).

        Raises:
            PublishError, NotFoundError: the broker refused a record or a publish.
        """
        self.ended_many([Ended(job, context, state, result, error)])

    def ended_many(self, ended: Sequence[Ended]) -> None:
        """:meth:`ended` for several jobs at once (a worker's jobs that ended together): their step
        records are published, then their fan-in reports
        (:meth:`FanIn.report_many <ojs_kombu.amqp.fanin.FanIn.report_many>`), and one wait takes
        the confirms of both; what else follows (a chain's next step, a fan-in's callbacks) is
        performed for each in turn.  Every record and report is confirmed when this returns.

        Parameters:
            ended: the jobs that ended, each with its context, state, result and error.

        Raises:
            PublishError, NotFoundError: the broker refused a record or a publish (of any of them).
        """
        steps = [self._step(item) for item in ended]
        records = self.log.publish_many(
            [(item.context.id, record) for item, (record, _) in zip(ended, steps, strict=True)]
        )
        reports: list[Report] = []
        queues: list[str] = []  # of the reports' jobs: where a workflow they end sends its sweep job
        others: list[tuple[Ended, list[WorkflowAction]]] = []
        for item, (_, actions) in zip(ended, steps, strict=True):
            if len(actions) == 1 and isinstance(actions[0], Report):
                reports.append(actions[0])
                queues.append(item.job.queue)
            else:
                others.append((item, actions))
        if others:  # a chain's next step goes out once the step before it is recorded
            self.log.settle(records)
            for item, actions in others:
                self.perform(actions, root=item.context.continuation, queue=item.job.queue)
        outcomes = (
            self.fan_in.report_many(
                [MemberReport(r.fan_in.id, r.fan_in.index, r.fan_in.count, r.state, r.result, r.error) for r in reports]
            )
            if reports
            else []
        )
        # The step records' confirms came in while the reports were confirmed (one connection): the
        # two are pipelined, and both are confirmed before any job is acknowledged.
        self.log.settle(records)
        for report, outcome, queue in zip(reports, outcomes, queues, strict=True):
            self._after_report(report, outcome, queue)

    def _step(self, ended: Ended) -> tuple[dict[str, Any], list[WorkflowAction]]:
        """The step record of a job that ended, and the planner's actions that follow."""
        job, context, state, result, error = ended
        step_state: Literal["completed", "failed"] = "completed" if state == "completed" else "failed"
        if state == "cancelled":
            error = error or _CANCELLED_ERROR
        if step_state == "completed":
            try:
                check_result(result)
            except ValidationError as exc:
                step_state, result = "failed", None
                code = "result_too_large" if isinstance(exc, ResultTooLargeError) else "invalid_result"
                error = {"code": code, "message": str(exc)}
        record: dict[str, Any] = {
            "kind": "step",
            "path": list(context.path),
            "job_id": job.id,
            "state": step_state,
            "attempt": (error or {}).get("attempt", job.attempt + 1),
            "at": _now(),
        }
        if step_state == "completed":
            record["result"] = result
        else:
            record["error"] = dict(error or {"code": "handler_error", "message": ""})
        return record, advance_workflow(context, step_state, result if step_state == "completed" else None, error)

    def perform(
        self,
        actions: list[WorkflowAction],
        ready: Ready | None = None,
        root: Mapping[str, Any] | None = None,
        *,
        new: bool = False,
        queue: str | None = None,
    ) -> None:
        """Carry out ``actions`` in order; the jobs they enqueue are published last, after every fan-in opened.

        Parameters:
            actions: from the planner.
            ready: the fan-in's ``Ready`` these actions follow (their jobs go out through
                :meth:`FanIn.fire`, which skips those an earlier run of this winner published).
            root: the root definition, when known: a ``Finished`` then deletes its fan-in streams.
            new: the workflow is being enqueued (it cannot have been cancelled: its cancel marker is not looked for).
            queue: the OJS queue of the job these actions follow: a ``Finished`` sends the workflow's
                sweep job there (``None``: no sweep job).

        A cancelled workflow's jobs (:meth:`WorkflowLog.cancelled <ojs_kombu.amqp.workflowlog.WorkflowLog.cancelled>`)
        are not published: each ends ``cancelled`` at once (:meth:`ended`).
        """
        jobs: list[tuple[str, OutgoingMessage]] = []
        enqueues: list[Enqueue] = []
        for action in actions:
            if isinstance(action, OpenFanIn):
                self.fan_in.open(action.id, action.count, action.continuation)
            elif isinstance(action, Enqueue):
                jobs.append(self.outgoing(workflow_job(action.job, action.context)))
                enqueues.append(action)
            elif isinstance(action, Report):
                self._report(action, queue)
            elif isinstance(action, Finished):
                self._finished(action, root, queue)
        if not jobs:
            return
        if not new and self._cancelled(enqueues[0].context.id):
            # Client.cancel_workflow: each job due now ends cancelled instead of running, so the
            # planner carries the workflow to its end (fan-ins cleaned up) as for a job cancelled.
            for enqueue in enqueues:
                self.ended(workflow_job(enqueue.job, enqueue.context), enqueue.context, "cancelled")
            return
        if ready is not None:
            self.fan_in.fire(ready, jobs)
            return
        tickets = [
            self._publisher.publish(
                message, exchange="", routing_key=queue, queue=queue, job_id=message.properties["message_id"]
            )
            for queue, message in jobs
        ]
        self._publisher.wait(tickets)
        for ticket in tickets:
            ticket.raise_for_error()

    def _cancelled(self, workflow_id: str) -> bool:
        """Whether the workflow was cancelled (remembered once seen: a cancel is never undone)."""
        if workflow_id in self._cancelled_ids:
            return True
        if self.log.cancelled(workflow_id):
            self._cancelled_ids.add(workflow_id)
            return True
        return False

    def outgoing(self, job: Job) -> tuple[str, OutgoingMessage]:
        """``job`` ready for :meth:`FanIn.fire <ojs_kombu.amqp.fanin.FanIn.fire>`: its job queue declared.

        Parameters:
            job: the job to publish.

        Returns:
            ``(AMQP job queue name, encoded job)``.

        Raises:
            ValidationError: the job cannot be encoded (over 1 MiB).
        """
        self.topology.ensure_queue(self.connection, job.queue)
        return self.names.job_queue(job.queue), encode(job, app_id=self.app_id)

    def _report(self, report: Report, queue: str | None) -> None:
        ref = report.fan_in
        outcome = self.fan_in.report(ref.id, ref.index, ref.count, report.state, report.result, report.error)
        self._after_report(report, outcome, queue)

    def _after_report(self, report: Report, outcome: Ready | Pending, queue: str | None) -> None:
        ref = report.fan_in
        if not isinstance(outcome, Ready):
            return
        if outcome.continuation is None:
            raise ValidationError(f"the fan-in {ref.id} holds no continuation", field="meta.workflow.fan_in")
        actions = after_fan_in(report, outcome.continuation, outcome.states, outcome.results)
        self.perform(actions, ready=outcome, root=outcome.continuation, queue=queue)

    def _finished(self, finished: Finished, root: Mapping[str, Any] | None, queue: str | None) -> None:
        self.log.append(
            finished.workflow_id,
            {"kind": "finished", "state": finished.state, "result": finished.result, "at": _now()},
        )
        logger.info("workflow %s %s", finished.workflow_id, finished.state)
        if root is not None:
            self.cleanup(workflow_from_dict(root))
        if queue is not None and self.sweep_after is not None:
            self._publish_sweep(finished.workflow_id, queue, self.sweep_after)

    def _publish_sweep(self, workflow_id: str, queue: str, after: float) -> None:
        """The workflow's sweep job into the scheduling cascade (confirmed), due ``after`` seconds from now.

        Published after the ``finished`` record: a runner run again (a redelivered last job) publishes a
        second one, which finds nothing left to delete.
        """
        job = sweep_job(workflow_id, queue, after)
        message, when = encode(job, app_id=self.app_id), job.scheduled_datetime or utcnow()
        ticket = self._publisher.publish_when_ready(
            lambda: self.cascade.destination(message, when, queue),
            queue=queue,
            prepare=lambda connection, _: self.topology.ensure_scheduling(connection, queue, self.cascade),
            job_id=job.id,
        )
        self._publisher.wait([ticket])
        ticket.raise_for_error()

    def cleanup(self, workflow: Workflow) -> None:
        """Delete the fan-in streams of a workflow that ended (its record stream stays).

        Parameters:
            workflow: the root definition.
        """
        for fan_id in fan_in_ids(workflow):
            self.fan_in.cleanup(fan_id)

    def close(self) -> None:
        """Close this object's channels (not the connection)."""
        self.fan_in.close()
        self.log.close()
        self._publisher.close()


MAX_BATCH: Final = 64
"""The most jobs :class:`WorkflowHook` reports together."""


class _Request:
    """A job waiting in :meth:`WorkflowHook.on_terminal` for its report."""

    __slots__ = ("done", "ended", "error")

    def __init__(self, ended: Ended):
        self.ended = ended
        self.done = False
        self.error: Exception | None = None


class WorkflowHook:
    """The worker's completion hook for jobs of workflows, on a connection of its own.

    One call at a time (a lock), and a :class:`FanIn` keeps one stream reader per workflow open
    between calls.  The jobs that end while a call holds the lock queue up, and the next call
    reports all of them together (:meth:`WorkflowRunner.ended_many`: one confirm wait for their
    step records, one for their fan-in reports), so each returns once its own report is confirmed
    but a busy worker pays two round trips per handful of jobs, not per job.  The connection is opened on first use and
    again after a connection error (one more attempt per call: every action is idempotent).

    Parameters:
        connect: makes a new kombu connection to the broker (connected here if it is not yet).
        topology: the worker's topology (names, job queue declarations).
        app_id: ``app_id`` of the jobs it publishes.
        sweep_after: seconds an ended workflow's record stream is kept (:class:`WorkflowRunner`).
    """

    def __init__(
        self,
        connect: Callable[[], KombuConnection],
        topology: Topology,
        *,
        app_id: str | None = "ojs",
        sweep_after: float | None = DEFAULT_SWEEP_AFTER,
    ):
        self._connect = connect
        self.topology = topology
        self.app_id = app_id
        self.sweep_after = sweep_after
        self._lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queue: list[_Request] = []  # jobs waiting for the lock, reported together by whoever takes it
        self._connection: KombuConnection | None = None
        self._runner: WorkflowRunner | None = None

    @staticmethod
    def concerns(job: Job) -> bool:
        """Whether ``job`` is part of a workflow (carries ``meta.workflow``).

        Parameters:
            job: a job.

        Returns:
            True for a job of a workflow.
        """
        meta = job.meta
        return meta is not None and WORKFLOW_META_KEY in meta

    def on_terminal(
        self, job: Job, state: TerminalState, result: Any = None, error: Mapping[str, Any] | None = None
    ) -> None:
        """``job`` reached a terminal state: if it is part of a workflow, advance the workflow.

        Call it before acknowledging the job.  A retry is no terminal state (§9.1).

        Parameters:
            job: the job as delivered.
            state: ``completed``, ``failed`` (dead-lettered or discarded) or ``cancelled``.
            result: the handler's return value (completed).
            error: the OJS error object (failed), ``{"code", "message", ...}``.

        Raises:
            ValidationError: a malformed ``meta.workflow``.
            OjsError: the broker refused a record or a publish, twice.
        """
        if not self.concerns(job):
            return
        context = WorkflowContext.from_meta(job.meta)
        if context is None:
            return
        request = _Request(Ended(job, context, state, result, error))
        with self._queue_lock:
            self._queue.append(request)
        with self._lock:
            while not request.done:  # else a call that held the lock meanwhile reported it
                with self._queue_lock:
                    taken, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                self._settle(taken)
        if request.error is not None:
            raise request.error

    def _settle(self, requests: list[_Request]) -> None:
        """Report ``requests`` together (:meth:`WorkflowRunner.ended_many`); if that fails, each on its own."""
        try:
            if len(requests) > 1:
                try:
                    self._run(lambda runner: runner.ended_many([r.ended for r in requests]))
                    for request in requests:
                        request.done = True
                    return
                except Exception as exc:  # noqa: BLE001 - each on its own: one bad job must not fail the others
                    logger.info("the workflow hook's %d reports failed together (%r); one by one", len(requests), exc)
                    if not isinstance(exc, ValidationError):
                        self._reset()
            for request in requests:
                try:
                    self._attempt(lambda runner: runner.ended_many([request.ended]), request.ended.job.id)  # noqa: B023
                except Exception as exc:  # noqa: BLE001 - raised in the thread of the job it concerns
                    request.error = exc
                request.done = True
        finally:
            for request in requests:
                if not request.done:
                    request.error = request.error or OjsError("the workflow hook was interrupted")
                    request.done = True

    def results(self, fan_in_id: str) -> dict[str, Any]:
        """Every job's ``parent_results`` entry of a group or batch, read from its fan-in (for a
        callback whose results were too big to carry: ``meta.workflow.results_from``).

        Parameters:
            fan_in_id: the group's or batch's id.

        Returns:
            The entries by index (``"0"``...).

        Raises:
            OjsError: the fan-in could not be read, twice (e.g. the workflow ended and it was deleted).
        """
        return self.run(lambda runner: runner.fan_in.results(fan_in_id), job_id=fan_in_id)

    def sweep(self, workflow_id: str) -> None:
        """Delete an ended workflow's record stream and cancel marker (the sweep job's work, for
        :meth:`Settler.triage <ojs_kombu.runtime.settle.Settler.triage>`).

        Parameters:
            workflow_id: the root workflow's id.

        Raises:
            OjsError: the broker refused a deletion, twice.
        """
        self.run(lambda runner: runner.log.sweep(workflow_id), job_id=workflow_id)

    def run(self, operation: Callable[[WorkflowRunner], T], *, job_id: str = "") -> T:
        """``operation(runner)`` on the hook's connection, one call at a time; after a broker error,
        once more on a new connection (so ``operation`` must be idempotent).

        Parameters:
            operation: what to do with the hook's :class:`WorkflowRunner`.
            job_id: the job it is done for (logged when the first try failed).

        Returns:
            What ``operation`` returned.

        Raises:
            ValidationError: as ``operation`` raised it (never tried again).
            OjsError: the broker refused a record or a publish, twice.
        """
        with self._lock:
            return self._attempt(operation, job_id)

    def _attempt(self, operation: Callable[[WorkflowRunner], T], job_id: str) -> T:
        try:
            return self._run(operation)
        except ValidationError:
            raise
        except Exception:  # a broker error: once more on a new connection
            logger.warning("the workflow hook failed for job %s; trying again", job_id, exc_info=True)
            self._reset()
            return self._run(operation)

    def _run(self, operation: Callable[[WorkflowRunner], T]) -> T:
        runner = self._runner
        if runner is None:
            connection = self._connect()
            if not connection.connected:
                connection.connect()
            self._connection = connection
            runner = self._runner = WorkflowRunner(
                connection.connection, self.topology, app_id=self.app_id, sweep_after=self.sweep_after
            )
        return operation(runner)

    def _reset(self) -> None:
        runner, connection = self._runner, self._connection
        self._runner = self._connection = None
        if runner is not None:
            try:
                runner.close()
            except Exception:  # noqa: BLE001 - the connection is going anyway
                pass
        if connection is not None:
            close_quietly(connection)

    def close(self) -> None:
        """Close the hook's connection (idempotent)."""
        with self._lock:
            self._reset()


def _now() -> str:
    return format_timestamp(utcnow())


__all__ = [
    "DEFAULT_SWEEP_AFTER",
    "MAX_BATCH",
    "Ended",
    "TerminalState",
    "WorkflowHook",
    "WorkflowRunner",
    "check_retention",
    "fan_in_ids",
    "sweep_job",
    "workflow_job",
]
