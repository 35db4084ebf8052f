"""What ``Client.workflow(id)`` returns: a workflow's state (ojs-workflows.md §11.2) from its records.

Pure: :func:`workflow_info` folds the records of a workflow's record stream
(:mod:`ojs_kombu.amqp.workflowlog`: its definition, one ``step`` record per job that ended,
a ``finished`` record) into a :class:`WorkflowInfo` through :func:`~ojs_kombu.model.workflow.evaluate`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.workflow import (
    Outcome,
    Path,
    StepState,
    Workflow,
    WorkflowState,
    WorkflowType,
    evaluate,
    node_at,
    workflow_from_dict,
)


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One job (or batch callback) of a workflow (§4.4, §11.2).

    Attributes:
        path: its address from the root (``(1, 2)``; a callback ends with its name).
        type: the job type.
        job_id: the job's id (fixed in the definition).
        state: ``waiting``, ``pending`` (enqueued), ``completed``, ``failed`` or ``cancelled``.
        result: its result, once completed.
        error: its OJS error object, once failed.
        attempt: the attempt it ended on, once ended.
        completed_at: when it ended (RFC 3339), once ended.
    """

    path: Path
    type: str
    job_id: str
    state: StepState
    result: Any = None
    error: dict[str, Any] | None = None
    attempt: int | None = None
    completed_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The spec's step object (§11.2), with ``path`` and ``index`` (the path's last part).

        Returns:
            A new dict.
        """
        data: dict[str, Any] = {
            "index": self.path[-1] if self.path else 0,
            "path": list(self.path),
            "type": self.type,
            "state": self.state,
            "job_id": self.job_id,
        }
        if self.state == "completed":
            data["result"] = self.result
        if self.error is not None:
            data["error"] = self.error
        if self.completed_at is not None:
            data["completed_at"] = self.completed_at
        return data


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """A workflow's state and every job's (ojs-workflows.md §11.2, §3.3, §9.6).

    Attributes:
        id: the workflow's id.
        type: ``chain``, ``group`` or ``batch``.
        name: its name, if any.
        state: ``pending`` (no job ended yet), ``running``, ``completed`` or ``failed`` (§8.1).
        steps: every job and callback, in path order.
        result: the workflow's result once it ended (a chain's last step's; a group's or batch's
            jobs' by index).
        job_count: jobs in the workflow, nested included, callbacks not.
        completed_count: of those, completed.
        failed_count: of those, failed.
        created_at: when it was enqueued.
        completed_at: when it reached a terminal state (was cancelled: ``cancelled_at`` in :meth:`to_dict`).
        errors: the failed jobs' errors (§9.6): ``job_id``, ``code``, ``message``, ``attempt``, and a
            failed callback's ``callback`` (``on_complete``, ``on_success``, ``on_failure``: §9.4).
        failed_step_index: a chain's step that failed (§9.6), the first one; None for a group or batch.
        definition: the definition it was enqueued with (its shape: what the dashboard draws).
    """

    id: str
    type: WorkflowType
    name: str | None
    state: WorkflowState
    steps: tuple[StepInfo, ...]
    result: Any = None
    job_count: int = 0
    completed_count: int = 0
    failed_count: int = 0
    created_at: str | None = None
    completed_at: str | None = None
    errors: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    failed_step_index: int | None = None
    definition: Workflow | None = field(default=None, repr=False, compare=False)

    def step(self, *path: int | str) -> StepInfo:
        """The step at ``path``.

        Parameters:
            path: its address, e.g. ``step(1, 2)``.

        Returns:
            The step.

        Raises:
            KeyError: no job at ``path``.
        """
        for step in self.steps:
            if step.path == path:
                return step
        raise KeyError(path)

    def to_dict(self) -> dict[str, Any]:
        """The spec's response body (§11.2) without its ``{"workflow": ...}`` wrapper.

        Returns:
            A new dict.
        """
        metadata: dict[str, Any] = {
            "job_count": self.job_count,
            "completed_count": self.completed_count,
            "failed_count": self.failed_count,
        }
        if self.created_at is not None:
            metadata["created_at"] = self.created_at
        if self.completed_at is not None:
            metadata["cancelled_at" if self.state == "cancelled" else "completed_at"] = self.completed_at
        data: dict[str, Any] = {
            "id": self.id,
            "type": self.type,
            "name": self.name,
            "state": self.state,
            "steps": [step.to_dict() for step in self.steps],
            "metadata": metadata,
        }
        if self.state in ("completed", "failed"):
            data["result"] = self.result
        if self.failed_step_index is not None:
            data["failed_step_index"] = self.failed_step_index
        if self.errors:
            data["failed_job_ids"] = [error["job_id"] for error in self.errors]
            data["errors"] = list(self.errors)
        return data


def workflow_info(records: Iterable[Mapping[str, Any]]) -> WorkflowInfo:
    """Fold a workflow's records into its state.

    Records: ``{"kind": "definition", "workflow": ..., "at": ...}`` first (or without ``at``, then
    ``{"kind": "enqueued", "at": ...}``); ``{"kind": "step",
    "path", "state", "result", "error", "attempt", "at"}`` per job that ended (the first of a path
    wins: a job run again after a crash records again); ``{"kind": "finished", "state", "at"}``, or
    ``{"kind": "cancelled", "at"}`` (``Client.cancel_workflow``; the first of the two is the workflow's
    end: then every job that had not ended, and every job that ended cancelled, is ``cancelled``).
    Others are ignored.

    Parameters:
        records: the records, oldest first.

    Returns:
        The state.

    Raises:
        ValidationError: no definition record.
    """
    records_read = _fold(records)
    definition, created_at, outcomes = records_read.definition, records_read.created_at, records_read.outcomes
    steps_meta, finished = records_read.steps_meta, records_read.finished
    if not isinstance(definition, Mapping):
        raise ValidationError("the workflow's records hold no definition", field="workflow")
    root = workflow_from_dict(definition)
    known = {path: outcome for path, outcome in outcomes.items() if _exists(root, path)}
    status = evaluate(root, known)
    runnable = {item.path for item in status.runnable}
    cancelled = finished is not None and finished.get("kind") == "cancelled"
    uncounted = 0  # jobs counted failed by evaluate that the workflow's cancel ended
    steps: list[StepInfo] = []
    errors: list[dict[str, Any]] = []
    failed_step: int | None = None  # the root chain's step the first failed job is in
    for path, step_state in status.steps.items():
        job = node_at(root, path)
        assert isinstance(job, Job)
        meta = steps_meta.get(path, {})
        outcome = known.get(path)
        if step_state == "waiting" and path in runnable:
            step_state = "pending"  # its turn came: it was enqueued
        error = dict(outcome.error or {}) if outcome is not None and outcome.state == "failed" else None
        if cancelled and (step_state in _UNENDED or (error is not None and error.get("code") == "cancelled")):
            if step_state == "failed" and not isinstance(path[-1], str):
                uncounted += 1
            step_state, error = "cancelled", None  # §11.3: pending and waiting jobs are cancelled
        attempt = meta.get("attempt")
        steps.append(
            StepInfo(
                path=path,
                type=job.type,
                job_id=job.id,
                state=step_state,
                result=outcome.result if outcome is not None and outcome.state == "completed" else None,
                error=error,
                attempt=attempt if isinstance(attempt, int) else None,
                completed_at=meta.get("at"),
            )
        )
        if error is not None:
            entry = {
                "job_id": job.id,
                "code": error.get("code", "handler_error"),
                "message": error.get("message", ""),
                "attempt": attempt if isinstance(attempt, int) else None,
            }
            if isinstance(path[-1], str):
                entry["callback"] = path[-1]  # §9.4: a batch's failure names its callback
            errors.append(entry)
            if failed_step is None and isinstance(path[0], int):
                failed_step = path[0]
    state: WorkflowState = status.state
    completed_at = None
    if cancelled:
        state, completed_at = "cancelled", finished.get("at") if finished is not None else None
    elif finished is not None and finished.get("state") in ("completed", "failed"):
        state = finished["state"]
        completed_at = finished.get("at")
    return WorkflowInfo(
        id=root.id,
        type=root.type,
        name=root.name,
        state=state,
        steps=tuple(steps),
        result=status.result if state in ("completed", "failed") else None,
        job_count=status.job_count,
        completed_count=status.completed_count,
        failed_count=status.failed_count - uncounted,
        created_at=created_at,
        completed_at=completed_at,
        errors=tuple(errors),
        failed_step_index=failed_step if root.type == "chain" else None,
        definition=root,
    )


@dataclass
class _Records:
    """A workflow's records read once: what :func:`workflow_info` builds its state from."""

    definition: Mapping[str, Any] | None = None
    created_at: str | None = None
    outcomes: dict[Path, Outcome] = field(default_factory=dict)
    steps_meta: dict[Path, Mapping[str, Any]] = field(default_factory=dict)
    finished: Mapping[str, Any] | None = None


def _fold(records: Iterable[Mapping[str, Any]]) -> _Records:
    read = _Records()
    for record in records:
        kind = record.get("kind")
        if kind == "definition" and read.definition is None:
            read.definition = record.get("workflow")
            read.created_at = record.get("at")
        elif kind == "enqueued" and read.created_at is None:
            read.created_at = record.get("at")  # what WorkflowRunner.start records after the definition
        elif kind == "step":
            path = tuple(record.get("path") or ())
            if path and path not in read.outcomes and record.get("state") in ("completed", "failed"):
                read.outcomes[path] = Outcome(record["state"], record.get("result"), record.get("error"))
                read.steps_meta[path] = record
        elif kind in ("finished", "cancelled") and read.finished is None:
            read.finished = record  # the first end recorded is the workflow's
    return read


_UNENDED = frozenset({"waiting", "pending", "active"})


def _exists(root: Any, path: Path) -> bool:
    try:
        return isinstance(node_at(root, path), Job)
    except ValidationError:
        return False


__all__ = ["StepInfo", "WorkflowInfo", "workflow_info"]
