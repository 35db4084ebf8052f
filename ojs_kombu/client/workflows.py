"""The workflows service: ``enqueue_workflow``, ``workflow`` and ``cancel_workflow`` (ojs-workflows.md §11.1–§11.3).

A workflow's state lives on RabbitMQ alone, in its record stream ``ojs.workflow.{id}.log``
(:mod:`ojs_kombu.amqp.workflowlog`): the definition, recorded when it is enqueued, then one
record per job that ended and one when the workflow ended, appended by the workers' completion
hook (:mod:`ojs_kombu.runtime.workflow`).  :meth:`Workflows.workflow` reads it and folds it
(:func:`~ojs_kombu.model.workflow_info.workflow_info`).

:meth:`Workflows.cancel` declares the workflow's cancel marker (which the workers look for before
enqueueing its next jobs: those end ``cancelled`` instead), records ``cancelled``, then sends the
normal CANCEL (:meth:`ojs_kombu.Client.cancel`) to every job enqueued that has not ended: one not
yet run is dropped when delivered, a running one has ``current_job().cancelled`` set.  A worker that
looked for the marker just before it was declared had recorded its job's end before looking, so the
read that follows the marker sees that end and the jobs it enqueued, and cancels them too.
"""

from __future__ import annotations

from kombu.connection import Connection

from ojs_kombu.amqp.workflowlog import WorkflowLog
from ojs_kombu.client.control import Control
from ojs_kombu.client.session import Service
from ojs_kombu.errors import ValidationError, WorkflowStateError
from ojs_kombu.model.job import Job
from ojs_kombu.model.timefmt import format_timestamp, utcnow
from ojs_kombu.model.workflow import Batch, Chain, Group, Workflow, check_depth, node_at
from ojs_kombu.model.workflow_info import WorkflowInfo, workflow_info
from ojs_kombu.runtime.workflow import WorkflowRunner


class Workflows(Service):
    """Enqueues workflows and reads their state through the client's session."""

    def enqueue(self, workflow: Workflow) -> str:
        """Enqueue a workflow (``ojs_kombu.chain``, ``group`` or ``batch``): its first jobs now, the rest as they become due.

        Serves :meth:`ojs_kombu.Client.enqueue_workflow`.  Records the definition in the
        workflow's record stream, opens the fan-in of each group or batch about to run, then
        publishes the first jobs, each carrying its place in ``meta.workflow``.  Workers advance
        it from there (``docs/workflows.md``).

        Parameters:
            workflow: the definition (checked when it was built).

        Returns:
            The workflow's id.

        Raises:
            ValidationError: not a workflow, or a job that cannot be encoded (nothing runs).
            PublishError, BrokerConnectionError, BrokerRefusedError: as for :meth:`ojs_kombu.Client.enqueue`.
        """
        if not isinstance(workflow, (Chain, Group, Batch)):
            raise ValidationError(
                f"expected a workflow (ojs_kombu.chain, group or batch), got {type(workflow).__name__}",
                field="workflow",
            )
        check_depth(workflow)

        def start(conn: Connection) -> str:
            runner = WorkflowRunner(conn.connection, self.session.topology, app_id=self.session.app_id or "ojs")
            try:
                return runner.start(workflow)
            finally:
                runner.close()

        return self.session.run(start)

    def workflow(self, workflow_id: str) -> WorkflowInfo:
        """The state of a workflow (ojs-workflows.md §11.2): its state, every job's, the counters.

        Serves :meth:`ojs_kombu.Client.workflow`.

        Parameters:
            workflow_id: what :meth:`enqueue` returned.

        Returns:
            Its :class:`~ojs_kombu.model.workflow_info.WorkflowInfo` (``.state == "completed"`` once done;
            ``.to_dict()`` is the spec's JSON).

        Raises:
            NotFoundError: no such workflow (or its record is older than its 7-day retention).
            BrokerConnectionError, BrokerRefusedError: as for :meth:`ojs_kombu.Client.enqueue`.
        """
        _check_id(workflow_id)

        def read(conn: Connection) -> WorkflowInfo:
            log = WorkflowLog(conn.connection, names=self.session.names)
            try:
                return workflow_info(log.read(workflow_id))
            finally:
                log.close()

        return self.session.run(read)

    def cancel(self, workflow_id: str) -> WorkflowInfo:
        """Cancel a workflow (:meth:`ojs_kombu.Client.cancel_workflow`, ojs-workflows.md §11.3).

        Its jobs not yet enqueued never run, those enqueued get the normal :meth:`ojs_kombu.Client.cancel` (dropped if not yet run; a running one has
        ``current_job().cancelled`` set, and ends as its handler lets it), and its state is ``cancelled``.

        Parameters:
            workflow_id: what :meth:`ojs_kombu.Client.enqueue_workflow` returned.

        Returns:
            Its :class:`~ojs_kombu.model.workflow_info.WorkflowInfo`, ``.state == "cancelled"``: every
            job that had not ended reads ``cancelled`` (``.to_dict()["metadata"]["cancelled_at"]`` says when).

        Raises:
            WorkflowStateError: it already ended (completed, failed or cancelled: the spec's 409).
            NotFoundError: no such workflow.
            PublishError, BrokerConnectionError, BrokerRefusedError: as for :meth:`ojs_kombu.Client.cancel`.
        """
        _check_id(workflow_id)

        def mark(conn: Connection) -> tuple[WorkflowInfo, list[tuple[str, str]]]:
            log = WorkflowLog(conn.connection, names=self.session.names)
            try:
                _refuse_ended(workflow_info(log.read(workflow_id)))
                log.mark_cancelled(workflow_id)
                log.append(workflow_id, {"kind": "cancelled", "at": format_timestamp(utcnow())})
                records = log.read(workflow_id)
            finally:
                log.close()
            # Which jobs are enqueued and not ended: the records without the cancel (which shows them cancelled).
            before = workflow_info([r for r in records if r.get("kind") != "cancelled"])
            return workflow_info(records), [
                (s.job_id, _queue(before, s.path)) for s in before.steps if s.state == "pending"
            ]

        info, enqueued = self.session.run(mark)
        if info.state != "cancelled":
            _refuse_ended(info)  # it ended between the first read and the cancel record
        control = Control(self.session)
        for job_id, queue in enqueued:
            control.cancel(job_id, queue)
        return info


def _check_id(workflow_id: object) -> None:
    if not isinstance(workflow_id, str) or not workflow_id:
        raise ValidationError("a workflow id is a non-empty string", field="workflow_id")


def _refuse_ended(info: WorkflowInfo) -> None:
    if info.state in ("completed", "failed", "cancelled"):
        raise WorkflowStateError(
            f"workflow {info.id} is already in terminal state {info.state!r}", current=info.state, requested="cancelled"
        )


def _queue(info: WorkflowInfo, path: tuple[int | str, ...]) -> str:
    job = node_at(info.definition, path) if info.definition is not None else None
    if not isinstance(job, Job):
        raise ValidationError(f"no job at path {list(path)} of workflow {info.id}", field="path")
    return job.queue


__all__ = ["Workflows"]
