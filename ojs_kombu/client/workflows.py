"""The workflows service: ``enqueue_workflow`` and ``workflow`` (ojs-workflows.md §11.1, §11.2).

A workflow's state lives on RabbitMQ alone, in its record stream ``ojs.workflow.{id}.log``
(:mod:`ojs_kombu.amqp.workflowlog`): the definition, recorded when it is enqueued, then one
record per job that ended and one when the workflow ended, appended by the workers' completion
hook (:mod:`ojs_kombu.runtime.workflow`).  :meth:`Workflows.workflow` reads it and folds it
(:func:`~ojs_kombu.model.workflow_info.workflow_info`).
"""

from __future__ import annotations

from kombu.connection import Connection

from ojs_kombu.amqp.workflowlog import WorkflowLog
from ojs_kombu.client.session import Service
from ojs_kombu.errors import ValidationError
from ojs_kombu.model.workflow import Batch, Chain, Group, Workflow, check_depth
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
        if not isinstance(workflow_id, str) or not workflow_id:
            raise ValidationError("a workflow id is a non-empty string", field="workflow_id")

        def read(conn: Connection) -> WorkflowInfo:
            log = WorkflowLog(conn.connection, names=self.session.names)
            try:
                return workflow_info(log.read(workflow_id))
            finally:
                log.close()

        return self.session.run(read)


__all__ = ["Workflows"]
