"""What to do when a job of a workflow ends: the continuation carried by the jobs, turned into actions.

Pure: a worker's completion hook (and ``Client.enqueue_workflow``) performs the actions; no
datastore is read, every input is in the job's ``meta.workflow``
(:class:`~ojs_kombu.model.workflow.WorkflowContext`) or in its fan-in's :class:`Ready`.

* :func:`start_workflow` — the actions that begin a workflow: open a fan-in for every group and batch
  about to run (before their jobs are published), and enqueue the first jobs.
* :func:`advance_workflow` — a job ended for good (completed, or failed with no retry left): a chain's
  step enqueues the next step with every earlier result, or ends its chain; a group's or batch's
  job (or a batch's callback) reports to its fan-in.
* :func:`after_fan_in` — the one reporter that got ``Ready``: a group ends (and its chain goes
  on with the group's results), a batch enqueues the callbacks that apply, or, once those
  ended, ends.

Failure propagation is the spec's (§9): a failed step ends its chain as failed and nothing after
it is enqueued; a group fails once all its jobs ended; a batch fires ``on_failure`` and fails only
when a callback fails.  Every job keeps the id it has in the definition, so a repeated action (a
step run twice after a crash) publishes the same job id again, which ``Worker(deduplicate=True)``
runs once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.workflow import (
    Batch,
    Chain,
    FanInRef,
    Group,
    Node,
    Path,
    StepState,
    Workflow,
    WorkflowContext,
    WorkflowState,
    fit_parent_results,
    node_at,
    workflow_from_dict,
    workflow_to_dict,
)


@dataclass(frozen=True, slots=True)
class OpenFanIn:
    """Create the fan-in ``id`` of ``count`` jobs (``FanIn.open``) before any of them is published."""

    id: str
    count: int
    continuation: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Publish ``job`` with ``meta.workflow`` = ``context.to_meta()``."""

    path: Path
    job: Job
    context: WorkflowContext


@dataclass(frozen=True, slots=True)
class Report:
    """Report the end of the member at ``path`` to its fan-in (``FanIn.report``); on ``Ready``
    pass this report to :func:`after_fan_in`.

    The member is the job that ended, or the nested chain, group or batch whose end it completed
    (the last step of a chain inside a group reports the chain's end).  ``scopes`` are the
    enclosing chains' results at that level; ``parent_results`` what the member was started
    with (a batch's callbacks: every job's result, the batch's own result).
    """

    fan_in: FanInRef
    path: Path
    state: StepState
    result: Any = None
    error: Mapping[str, Any] | None = None
    scopes: dict[str, dict[str, Any]] = field(default_factory=dict)
    parent_results: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Finished:
    """The workflow ended: ``completed`` or ``failed``, with the root's result."""

    workflow_id: str
    state: WorkflowState
    result: Any = None


WorkflowAction = OpenFanIn | Enqueue | Report | Finished
"""What a step of the planner asks its caller to do."""


def callbacks_fan_in_id(batch_id: str) -> str:
    """The fan-in counting a batch's triggered callbacks: ``{batch_id}.callbacks``.

    Parameters:
        batch_id: the batch's id.

    Returns:
        The fan-in id.
    """
    return f"{batch_id}.callbacks"


def start_workflow(workflow: Workflow) -> list[WorkflowAction]:
    """The actions that begin ``workflow``, in order (open every fan-in before its jobs).

    Parameters:
        workflow: the definition.

    Returns:
        The actions.
    """
    return _Plan(workflow).start(workflow, (), {}, {})


def advance_workflow(
    context: WorkflowContext, state: StepState, result: Any = None, error: Mapping[str, Any] | None = None
) -> list[WorkflowAction]:
    """A job of a workflow ended for good: what follows.

    Parameters:
        context: the job's ``meta.workflow``.
        state: ``completed``, or ``failed`` once its retries are exhausted (a retry is no end, §9.1).
        result: its result (completed).
        error: its OJS error object (failed).

    Returns:
        The actions: a :class:`Report` for a group's or batch's job or a callback; for a chain's
        step, the next step's :class:`Enqueue` (and :class:`OpenFanIn` when it is a group or
        batch), or what the chain's end leads to.

    Raises:
        ValidationError: ``state`` is not terminal, or the context does not fit its definition.
    """
    if state not in ("completed", "failed"):
        raise ValidationError(f"a job ends completed or failed, got {state!r}", field="state")
    if context.fan_in is not None:
        return [Report(context.fan_in, context.path, state, result, error, context.scopes, context.parent_results)]
    if context.continuation is None:
        raise ValidationError(
            "a chain step's meta.workflow carries no continuation", field="meta.workflow.continuation"
        )
    root = workflow_from_dict(context.continuation)
    return _Plan(root).ended(context.path, state, result, context.scopes, error)


def after_fan_in(
    report: Report,
    continuation: Mapping[str, Any],
    states: Mapping[int, StepState],
    results: Mapping[str, Any],
) -> list[WorkflowAction]:
    """The reporter that got ``Ready`` from its fan-in: what follows the group, batch or callbacks.

    Parameters:
        report: the :class:`Report` that got ``Ready``.
        continuation: the root definition (``Ready.continuation``, given to ``FanIn.open``).
        states: every member's end, by index (``Ready.states``).
        results: every member's ``parent_results`` entry, by index (``Ready.results``).

    Returns:
        The actions.

    Raises:
        ValidationError: the report does not fit the definition.
    """
    if not report.path:
        raise ValidationError("only a group's or batch's member reports to a fan-in", field="meta.workflow.path")
    root = workflow_from_dict(continuation)
    plan = _Plan(root)
    container_path = report.path[:-1]
    container = node_at(root, container_path)
    failed = any(state == "failed" for state in states.values())
    if isinstance(report.path[-1], str):  # the batch's callbacks ended: so did the batch (§9.4)
        outcome: StepState = "failed" if failed else "completed"
        return plan.ended(container_path, outcome, report.parent_results, report.scopes)
    if isinstance(container, Group):
        return plan.ended(container_path, "failed" if failed else "completed", dict(results), report.scopes)
    if not isinstance(container, Batch):
        raise ValidationError(f"no group or batch at path {list(container_path)}", field="meta.workflow.path")
    fires = {"on_complete": True, "on_success": not failed, "on_failure": failed}
    triggered = [(name, job) for name, job in container.callbacks.items() if fires[name]]
    if not triggered:  # e.g. only on_success, and a job failed: nothing to run, the batch ended
        return plan.ended(container_path, "completed", dict(results), report.scopes)
    # Over the inline budget the callbacks carry no results: they read them from the batch's fan-in
    # (§7.5), which is kept until the workflow ends.
    inline: dict[str, Any] = dict(results)
    results_from: str | None = None
    if fit_parent_results(results) != inline:
        inline, results_from = {}, container.id
    fan_id = callbacks_fan_in_id(container.id)
    actions: list[WorkflowAction] = [OpenFanIn(fan_id, len(triggered), plan.definition)]
    for position, (name, job) in enumerate(triggered):
        path = (*container_path, name)
        ref = FanInRef(fan_id, position, len(triggered))
        context = WorkflowContext(root.id, path, inline, results_from, fan_in=ref, scopes=report.scopes)
        actions.append(Enqueue(path, job, context))
    return actions


class _Plan:
    def __init__(self, root: Workflow):
        self.root = root
        self.definition = workflow_to_dict(root)

    def start(
        self, node: Node, path: Path, parent_results: dict[str, Any], scopes: dict[str, dict[str, Any]]
    ) -> list[WorkflowAction]:
        if isinstance(node, Job):
            return [self._enqueue(node, path, parent_results, scopes)]
        if isinstance(node, Chain):
            inner = {**scopes, _key(path): {}}
            return self.start(node.steps[0], (*path, 0), parent_results, inner)
        actions: list[WorkflowAction] = [OpenFanIn(node.id, len(node.jobs), self.definition)]
        for index, member in enumerate(node.jobs):
            actions += self.start(member, (*path, index), parent_results, scopes)
        return actions

    def ended(
        self,
        path: Path,
        state: StepState,
        result: Any,
        scopes: Mapping[str, dict[str, Any]],
        error: Mapping[str, Any] | None = None,
    ) -> list[WorkflowAction]:
        if not path:
            return [Finished(self.root.id, "completed" if state == "completed" else "failed", result)]
        parent_path, last = path[:-1], path[-1]
        parent = node_at(self.root, parent_path)
        if isinstance(parent, Chain) and isinstance(last, int):
            key = _key(parent_path)
            outer = {k: v for k, v in scopes.items() if k != key}
            if state != "completed":
                return self.ended(parent_path, "failed", None, outer, error)  # §9.2: nothing after a failed step
            if last + 1 == len(parent.steps):
                return self.ended(parent_path, "completed", result, outer)  # a chain's result: its last step's
            results = {**scopes.get(key, {}), str(last): result}
            return self.start(parent.steps[last + 1], (*parent_path, last + 1), results, {**scopes, key: results})
        if isinstance(parent, (Group, Batch)) and isinstance(last, int):
            completed = state == "completed"
            ref = FanInRef(parent.id, last, len(parent.jobs))
            return [Report(ref, path, state, result if completed else None, error, dict(scopes))]
        raise ValidationError(f"no step or job at path {list(path)}", field="meta.workflow.path")

    def _enqueue(
        self, job: Job, path: Path, parent_results: dict[str, Any], scopes: dict[str, dict[str, Any]]
    ) -> Enqueue:
        parent = node_at(self.root, path[:-1])
        last = path[-1]
        if isinstance(parent, (Group, Batch)) and isinstance(last, int):
            ref = FanInRef(parent.id, last, len(parent.jobs))
            return Enqueue(path, job, WorkflowContext(self.root.id, path, parent_results, fan_in=ref, scopes=scopes))
        return Enqueue(
            path, job, WorkflowContext(self.root.id, path, parent_results, continuation=self.definition, scopes=scopes)
        )


def _key(path: Path) -> str:
    return ".".join(str(part) for part in path)


__all__ = [
    "WorkflowAction",
    "Enqueue",
    "Finished",
    "OpenFanIn",
    "Report",
    "advance_workflow",
    "after_fan_in",
    "callbacks_fan_in_id",
    "start_workflow",
]
