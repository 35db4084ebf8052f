"""The workflow state machine: :func:`evaluate` and the transitions of §8.2 and §4.4.

:func:`evaluate` takes the outcomes recorded so far (path → :class:`Outcome`) and returns the
:class:`Status`: the workflow's state (§8), every job's step state (§4.4), and the jobs to enqueue
now (:class:`Runnable`, each with its ``parent_results``, §7).  Failure propagation is §9: a chain
stops at a failed step and cancels the steps after it; a group waits for every job and then fails;
a batch fires its callbacks (``on_complete`` always, ``on_success`` with no failure,
``on_failure`` with one) and fails only when a callback fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ojs_kombu.errors import WorkflowStateError
from ojs_kombu.model.job import Job
from ojs_kombu.model.workflow.definitions import Batch, Chain, Group, Node, Path, Workflow, node_at

WorkflowState = Literal["pending", "running", "completed", "failed", "cancelled"]
"""A workflow's lifecycle state (§8.1)."""

StepState = Literal["waiting", "pending", "active", "completed", "failed", "cancelled"]
"""A step's (or a group/batch job's) state (§4.4)."""


_TERMINAL_STEP: Final[frozenset[str]] = frozenset({"completed", "failed", "cancelled"})
_STARTED: Final[frozenset[str]] = frozenset({"active", "completed", "failed"})

#: §8.2: the only workflow state transitions; anything else is refused.
WORKFLOW_TRANSITIONS: Final[Mapping[WorkflowState, frozenset[WorkflowState]]] = {
    "pending": frozenset({"running", "cancelled"}),
    "running": frozenset({"completed", "failed", "cancelled"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}

#: §4.4 step states; ``active`` → ``pending`` is a retry (a retryable job is no failure, §9.1).
STEP_TRANSITIONS: Final[Mapping[StepState, frozenset[StepState]]] = {
    "waiting": frozenset({"pending", "cancelled"}),
    "pending": frozenset({"active", "cancelled"}),
    "active": frozenset({"completed", "failed", "pending"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}


def check_transition(current: WorkflowState, requested: WorkflowState) -> WorkflowState:
    """Allow a workflow state transition of §8.2, refuse every other.

    Parameters:
        current: the workflow's state.
        requested: the state it moves to.

    Returns:
        ``requested``.

    Raises:
        WorkflowStateError: the transition is not listed (a terminal state never changes).
    """
    if requested not in WORKFLOW_TRANSITIONS[current]:
        raise WorkflowStateError(
            f"a workflow cannot go from {current!r} to {requested!r}", current=current, requested=requested
        )
    return requested


def check_step_transition(current: StepState, requested: StepState) -> StepState:
    """Allow a step state transition of :data:`STEP_TRANSITIONS`, refuse every other.

    Parameters:
        current: the step's state.
        requested: the state it moves to.

    Returns:
        ``requested``.

    Raises:
        WorkflowStateError: the transition is not listed.
    """
    if requested not in STEP_TRANSITIONS[current]:
        raise WorkflowStateError(
            f"a step cannot go from {current!r} to {requested!r}", current=current, requested=requested
        )
    return requested


@dataclass(frozen=True, slots=True)
class Outcome:
    """What is known of one job of a workflow.

    ``state`` is ``pending`` (enqueued), ``active``, ``completed`` or ``failed`` (retries exhausted:
    a job being retried is ``active`` or ``pending``, never ``failed``, §9.1).  ``result`` is the
    handler's return value (completed), ``error`` the OJS error object (failed), e.g.
    ``{"code": "handler_error", "message": "..."}``.
    """

    state: StepState
    result: Any = None
    error: Mapping[str, Any] | None = None

    def entry(self) -> Any:
        """This job's entry in ``parent_results``: its result, or ``{"error": error}`` when it failed."""
        return {"error": dict(self.error or {})} if self.state == "failed" else self.result


@dataclass(frozen=True, slots=True)
class Runnable:
    """A job whose turn has come: enqueue it (as ``pending``) with this ``parent_results``."""

    path: Path
    job: Job
    parent_results: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Status:
    """A workflow's state computed from its jobs' outcomes (:func:`evaluate`).

    Attributes:
        state: the workflow's state (§8.1).
        steps: every job's and callback's state by path (§4.4); a callback not triggered is ``cancelled``.
        runnable: the jobs to enqueue now, in path order.
        job_count: jobs in the workflow (nested included, callbacks not; §3.3).
        completed_count: of those, completed.
        failed_count: of those, failed.
        failed_paths: the paths of the failed jobs and callbacks (§9.6).
        result: the workflow's result: a chain's last step's, a group's or batch's jobs' by index (str).
    """

    state: WorkflowState
    steps: dict[Path, StepState]
    runnable: tuple[Runnable, ...]
    job_count: int
    completed_count: int
    failed_count: int
    failed_paths: tuple[Path, ...]
    result: Any = None


@dataclass(slots=True)
class _Node:
    state: StepState
    result: Any = None


@dataclass(slots=True)
class _Walk:
    outcomes: Mapping[Path, Outcome]
    cancelled: bool
    steps: dict[Path, StepState] = field(default_factory=dict)
    runnable: list[Runnable] = field(default_factory=list)
    failed: list[Path] = field(default_factory=list)


def evaluate(workflow: Workflow, outcomes: Mapping[Path, Outcome], *, cancelled: bool = False) -> Status:
    """The workflow's state from its jobs' outcomes, and what to enqueue next (a pure state machine).

    A job without an outcome is ``waiting``; it is runnable when its turn has come: every job of
    a group or batch at once, a chain's step when the one before completed, a batch's callbacks
    (those that apply, §6.4) when every job ended.  The caller enqueues the runnable jobs and
    records them ``pending``.  After ``cancelled`` nothing is runnable and every job not started
    is ``cancelled`` (§11.3: active jobs finish).

    Parameters:
        workflow: the root definition.
        outcomes: what is known, by path.
        cancelled: the workflow was cancelled.

    Returns:
        The :class:`Status`.

    Raises:
        ValidationError: an outcome's path names no job of the workflow.
    """
    for path in outcomes:
        node_at(workflow, path)
    walk = _Walk(outcomes, cancelled)
    root = _eval(workflow, (), walk, active=True, context={}, cancel=cancelled)
    jobs = [(path, state) for path, state in walk.steps.items() if not isinstance(path[-1], str)]
    if root.state in ("completed", "failed"):
        state: WorkflowState = root.state
    elif cancelled:
        state = "cancelled"
    elif any(step in _STARTED for step in walk.steps.values()):
        state = "running"
    else:
        state = "pending"
    return Status(
        state=state,
        steps=walk.steps,
        runnable=tuple(walk.runnable),
        job_count=len(jobs),
        completed_count=sum(1 for _, step in jobs if step == "completed"),
        failed_count=sum(1 for _, step in jobs if step == "failed"),
        failed_paths=tuple(walk.failed),
        result=root.result,
    )


def _eval(node: Node, path: Path, walk: _Walk, *, active: bool, context: dict[str, Any], cancel: bool) -> _Node:
    if isinstance(node, Job):
        return _eval_job(node, path, walk, active=active, context=context, cancel=cancel)
    if isinstance(node, Chain):
        return _eval_chain(node, path, walk, active=active, context=context, cancel=cancel)
    return _eval_parallel(node, path, walk, active=active, context=context, cancel=cancel)


def _eval_job(job: Job, path: Path, walk: _Walk, *, active: bool, context: dict[str, Any], cancel: bool) -> _Node:
    outcome = walk.outcomes.get(path)
    if outcome is not None:
        state = outcome.state
        if cancel and state == "pending":
            state = "cancelled"  # §11.3: pending jobs MUST be cancelled
    elif cancel:
        state = "cancelled"
    else:
        state = "waiting"
        if active:
            walk.runnable.append(Runnable(path, job, dict(context)))
    walk.steps[path] = state
    if state == "failed":
        walk.failed.append(path)
    return _Node(state, outcome.entry() if outcome is not None and state in ("completed", "failed") else None)


def _eval_chain(node: Chain, path: Path, walk: _Walk, *, active: bool, context: dict[str, Any], cancel: bool) -> _Node:
    results: dict[str, Any] = {}
    states: list[StepState] = []
    result: Any = None
    blocked = not active
    stop = cancel
    for index, step in enumerate(node.steps):
        child = _eval(
            step,
            (*path, index),
            walk,
            active=not blocked and not stop,
            context=results if index else context,
            cancel=stop,
        )
        states.append(child.state)
        if child.state == "completed":
            results = {**results, str(index): child.result}
            result = child.result
            continue
        if child.state == "failed":
            stop = True  # §9.2: the steps after a failed one are cancelled
        blocked = True
    if states[-1] == "completed":
        return _Node("completed", result)
    if "failed" in states:
        return _Node("failed")
    return _Node(_progress(states))


def _eval_parallel(
    node: Group | Batch, path: Path, walk: _Walk, *, active: bool, context: dict[str, Any], cancel: bool
) -> _Node:
    children = [
        _eval(member, (*path, index), walk, active=active, context=context, cancel=cancel)
        for index, member in enumerate(node.jobs)
    ]
    states = [child.state for child in children]
    results = {str(index): child.result for index, child in enumerate(children)}
    ended = all(state in _TERMINAL_STEP for state in states)
    failed = "failed" in states
    if isinstance(node, Group):
        if ended:
            if failed:
                return _Node("failed", results)
            return _Node("completed" if all(s == "completed" for s in states) else "cancelled", results)
        return _Node(_progress(states))
    # Batch: once every job ended, the callbacks that apply run (§6.4); it fails only if one of them fails (§9.4).
    fires = {"on_complete": True, "on_success": not failed, "on_failure": failed}
    triggered: list[StepState] = []
    for name, callback in node.callbacks.items():
        cb_path = (*path, name)
        if ended and not fires[name]:
            walk.steps[cb_path] = "cancelled"
            continue
        child = _eval_job(callback, cb_path, walk, active=ended and active, context=results, cancel=cancel)
        if ended:
            triggered.append(child.state)
    if not ended:
        return _Node(_progress(states))
    if "failed" in triggered:
        return _Node("failed", results)
    if all(state == "completed" for state in triggered):
        return _Node("completed", results)
    if all(state in _TERMINAL_STEP for state in triggered):
        return _Node("cancelled", results)
    return _Node("active")


def _progress(states: Sequence[StepState]) -> StepState:
    """The state of a node not ended yet, from its children's."""
    if any(state in _STARTED for state in states):
        return "active"
    if "pending" in states:
        return "pending"
    if states and all(state == "cancelled" for state in states):
        return "cancelled"
    return "waiting"
