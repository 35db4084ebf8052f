"""Workflows (ojs-workflows.md): chain, group and batch definitions, their states, results and wire form.

Pure: no I/O.  The broker side (fan-in counting, exactly-once callbacks) is
:mod:`ojs_kombu.amqp.fanin`; enqueueing and advancing a workflow are the client's and the worker's.

* **Definitions**: :func:`chain`, :func:`group`, :func:`batch` build frozen :class:`Chain`,
  :class:`Group` and :class:`Batch` objects whose members are :class:`~ojs_kombu.model.job.Job`\\ s,
  job specs (the spec's ``{"type", "args", "options"}``) or nested workflows.  Checked when built
  (§11.1): at least one step or job, a batch has at least one callback, callbacks are jobs, nesting
  follows §10.1 and is at most :data:`MAX_NESTING_DEPTH` workflow levels deep (§10.2).
  :func:`workflow_to_dict` / :func:`workflow_from_dict` are the spec's JSON form.
* **Addresses**: every job of a workflow has a *path* from the root: the index of each step or
  job on the way (``(1, 2)``: job 2 of the group that is step 1), a callback ends with its name
  (``(1, "on_failure")``).  On the wire a path is a JSON array.
* **State machine**: :func:`evaluate` takes the outcomes recorded so far (path →
  :class:`Outcome`) and returns the :class:`Status`: the workflow's state (§8), every job's step
  state (§4.4), and the jobs to enqueue now (:class:`Runnable`, each with its
  ``parent_results``, §7).  Failure propagation is §9: a chain stops at a failed step and cancels
  the steps after it; a group waits for every job and then fails; a batch fires its callbacks
  (``on_complete`` always, ``on_success`` with no failure, ``on_failure`` with one) and fails only
  when a callback fails.
* **Results** (§7.5): a job's result carried by a workflow is at most :data:`MAX_RESULT_BYTES`;
  the results carried inline in one envelope at most :data:`MAX_INLINE_RESULTS_BYTES`.
* **Wire form**: :class:`WorkflowContext`, under ``meta.workflow`` of each job of a workflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal, TypeAlias, get_args

from ojs_kombu.errors import InvalidWorkflowError, ResultTooLargeError, ValidationError, WorkflowStateError
from ojs_kombu.model.ids import JOB_ID_RE, new_job_id
from ojs_kombu.model.job import Job
from ojs_kombu.model.jsonvalue import dumps, ensure_json_native

WorkflowType = Literal["chain", "group", "batch"]
"""The three primitives (§1.1)."""

WorkflowState = Literal["pending", "running", "completed", "failed", "cancelled"]
"""A workflow's lifecycle state (§8.1)."""

StepState = Literal["waiting", "pending", "active", "completed", "failed", "cancelled"]
"""A step's (or a group/batch job's) state (§4.4)."""

CallbackName = Literal["on_complete", "on_success", "on_failure"]
"""A batch callback (§6.3)."""

CALLBACK_NAMES: Final[tuple[CallbackName, ...]] = get_args(CallbackName)

Path: TypeAlias = tuple[int | str, ...]
"""A job's address in a workflow: the index of each step/job from the root; a callback ends with its name."""

MAX_NESTING_DEPTH: Final = 3
"""Most workflow levels a definition may have (§10.2: at least 3 SHOULD be supported): a chain of
groups of chains.  Deeper definitions are refused when built (:class:`InvalidWorkflowError`)."""

MAX_RESULT_BYTES: Final = 64 * 1024
"""Largest result (compact JSON, UTF-8) a job of a workflow may return: 64 KiB, the spec's floor
(§7.5: no limit below 64 KB).  Not more, because results travel inside envelopes of at most 1 MiB
(``MAX_ENVELOPE_BYTES``) and a chain carries every earlier step's result: 64 KiB leaves room for
a dozen steps' results inline.  Above it the job fails with ``result_too_large`` (not retried:
the same handler returns the same result); store the data elsewhere and return a reference
(``{"result_ref": "s3://...", "result_size_bytes": ...}``)."""

MAX_INLINE_RESULTS_BYTES: Final = 512 * 1024
"""Most ``parent_results`` bytes carried inline in one envelope (half of ``MAX_ENVELOPE_BYTES``,
the rest for the job's own arguments and the continuation).  Above it a chain step carries the
most recent results that fit (always the immediately preceding one, §7.2 MUST); a group's or
batch's results are read from its fan-in record instead (:attr:`WorkflowContext.results_from`)."""

WORKFLOW_META_KEY: Final = "workflow"
"""The key of :class:`WorkflowContext` in a job's ``meta``."""

_WORKFLOW_TYPES: Final = frozenset(get_args(WorkflowType))
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


# --------------------------------------------------------------------------- definitions


@dataclass(frozen=True, slots=True)
class Chain:
    """Sequential steps (§4): step N+1 is enqueued when step N completed, with its result."""

    steps: tuple[Node, ...]
    id: str
    name: str | None = None
    type: ClassVar[WorkflowType] = "chain"

    @property
    def members(self) -> tuple[Node, ...]:
        """The steps."""
        return self.steps


@dataclass(frozen=True, slots=True)
class Group:
    """Parallel jobs (§5): all enqueued at once; completed when all completed, failed when all ended and one failed."""

    jobs: tuple[Node, ...]
    id: str
    name: str | None = None
    type: ClassVar[WorkflowType] = "group"

    @property
    def members(self) -> tuple[Node, ...]:
        """The jobs."""
        return self.jobs


@dataclass(frozen=True, slots=True)
class Batch:
    """Parallel jobs with callbacks (§6), fired once every job ended: ``on_complete`` always,
    ``on_success`` when none failed, ``on_failure`` when one did."""

    jobs: tuple[Node, ...]
    id: str
    on_complete: Job | None = None
    on_success: Job | None = None
    on_failure: Job | None = None
    name: str | None = None
    type: ClassVar[WorkflowType] = "batch"

    @property
    def members(self) -> tuple[Node, ...]:
        """The jobs."""
        return self.jobs

    @property
    def callbacks(self) -> dict[CallbackName, Job]:
        """The callbacks defined, by name, in the order of :data:`CALLBACK_NAMES`."""
        found = {name: getattr(self, name) for name in CALLBACK_NAMES}
        return {name: job for name, job in found.items() if job is not None}


Workflow: TypeAlias = Chain | Group | Batch
Node: TypeAlias = Job | Chain | Group | Batch
"""What a step, or a group's or batch's job, may be."""

MemberLike: TypeAlias = Job | Chain | Group | Batch | Mapping[str, Any]
"""What the builders take as a member: a job, a nested workflow, or a spec dict (a job spec or a workflow)."""

# §10.1: the compositions the spec lists (outer, inner).
_ALLOWED_NESTING: Final = frozenset(
    {
        ("chain", "group"),
        ("chain", "batch"),
        ("group", "chain"),
        ("group", "batch"),
        ("batch", "chain"),
        ("batch", "group"),
    }
)


def chain(*steps: MemberLike, name: str | None = None, id: str | None = None) -> Chain:
    """Build a chain (§4): the steps run one after another, each receiving the earlier results.

    Parameters:
        steps: the steps, in order: jobs, job specs (``{"type": ..., "args": [...], "options": {...}}``)
            or nested groups/batches.
        name: a display name.
        id: the workflow id (a lowercase UUIDv7); a new one when omitted.

    Returns:
        The chain.

    Raises:
        InvalidWorkflowError: no step, a step of the wrong kind, nesting deeper than :data:`MAX_NESTING_DEPTH`.
    """
    built = Chain(_members(steps, "steps", "chain"), _workflow_id(id), _name(name))
    check_depth(built)
    return built


def group(jobs: Iterable[MemberLike], *, name: str | None = None, id: str | None = None) -> Group:
    """Build a group (§5): the jobs run in parallel, independently.

    Parameters:
        jobs: the jobs (jobs, job specs, nested chains/batches).
        name: a display name.
        id: the workflow id (a lowercase UUIDv7); a new one when omitted.

    Returns:
        The group.

    Raises:
        InvalidWorkflowError: no job, a job of the wrong kind, nesting too deep.
    """
    built = Group(_members(_listed(jobs, "jobs"), "jobs", "group"), _workflow_id(id), _name(name))
    check_depth(built)
    return built


def batch(
    jobs: Iterable[MemberLike],
    *,
    on_complete: Job | Mapping[str, Any] | None = None,
    on_success: Job | Mapping[str, Any] | None = None,
    on_failure: Job | Mapping[str, Any] | None = None,
    name: str | None = None,
    id: str | None = None,
) -> Batch:
    """Build a batch (§6): the jobs run in parallel; once all ended, the callbacks that apply are enqueued once.

    Parameters:
        jobs: the jobs (jobs, job specs, nested chains/groups).
        on_complete: enqueued when every job ended, whatever their outcome.
        on_success: enqueued when every job completed.
        on_failure: enqueued when one job or more failed.
        name: a display name.
        id: the workflow id (a lowercase UUIDv7); a new one when omitted.

    Returns:
        The batch.

    Raises:
        InvalidWorkflowError: no job, no callback, a callback that is not a job, nesting too deep.
    """
    members = _members(_listed(jobs, "jobs"), "jobs", "batch")
    callbacks = {
        cb_name: _callback(value, f"callbacks.{cb_name}")
        for cb_name, value in (("on_complete", on_complete), ("on_success", on_success), ("on_failure", on_failure))
    }
    if all(value is None for value in callbacks.values()):
        raise InvalidWorkflowError(
            "a batch needs at least one callback (on_complete, on_success or on_failure); without one use group()",
            field="callbacks",
        )
    built = Batch(members, _workflow_id(id), name=_name(name), **callbacks)
    check_depth(built)
    return built


def depth(node: Node) -> int:
    """How many workflow levels ``node`` has: 0 for a job, 1 for a workflow of jobs.

    Parameters:
        node: a job or a workflow.

    Returns:
        The nesting depth.
    """
    if isinstance(node, Job):
        return 0
    return 1 + max(depth(member) for member in node.members)


def check_depth(workflow: Workflow) -> None:
    """Refuse a workflow deeper than :data:`MAX_NESTING_DEPTH` (§10.2: at creation, with a clear error).

    Parameters:
        workflow: the definition.

    Raises:
        InvalidWorkflowError: it is too deep.
    """
    levels = depth(workflow)
    if levels > MAX_NESTING_DEPTH:
        raise InvalidWorkflowError(
            f"workflow {workflow.id} nests {levels} workflow levels; at most {MAX_NESTING_DEPTH} are supported",
            field="$",
        )


def job_count(node: Node) -> int:
    """The jobs of a workflow, nested ones included, callbacks not (§3.3 ``job_count``).

    Parameters:
        node: a job or a workflow.

    Returns:
        The count.
    """
    if isinstance(node, Job):
        return 1
    return sum(job_count(member) for member in node.members)


def node_at(workflow: Workflow, path: Path) -> Node:
    """The step, job or callback at ``path``.

    Parameters:
        workflow: the root definition.
        path: an address in it.

    Returns:
        The node.

    Raises:
        ValidationError: no node has that address.
    """
    node: Node = workflow
    for depth_index, part in enumerate(path):
        where = list(path[: depth_index + 1])
        if isinstance(node, Job):
            raise ValidationError(
                f"no workflow node at path {where}: {list(path[:depth_index])} is a job", field="path"
            )
        if isinstance(part, str):
            callback = node.callbacks.get(part) if isinstance(node, Batch) else None  # type: ignore[call-overload]
            if callback is None:
                raise ValidationError(f"no callback at path {where}", field="path")
            node = callback
        elif isinstance(part, int) and not isinstance(part, bool) and 0 <= part < len(node.members):
            node = node.members[part]
        else:
            raise ValidationError(f"no workflow node at path {where}", field="path")
    return node


# --------------------------------------------------------------------------- the spec's JSON form


def workflow_to_dict(workflow: Workflow) -> dict[str, Any]:
    """The spec's JSON form (§3, Appendix A); each job is its full envelope (ids kept).

    Parameters:
        workflow: the definition.

    Returns:
        A JSON-ready dict.
    """
    data: dict[str, Any] = {"type": workflow.type, "id": workflow.id}
    if workflow.name is not None:
        data["name"] = workflow.name
    members = [_node_to_dict(member) for member in workflow.members]
    if isinstance(workflow, Chain):
        data["steps"] = members
    else:
        data["jobs"] = members
    if isinstance(workflow, Batch):
        data["callbacks"] = {name: job.to_dict() for name, job in workflow.callbacks.items()}
    return data


def workflow_from_dict(data: Mapping[str, Any]) -> Workflow:
    """Read the spec's JSON form: job specs (``type``, ``args``, ``options``) or full job envelopes.

    A workflow without ``id`` gets a new one (the create request of §11.1 has none).

    Parameters:
        data: the definition.

    Returns:
        The workflow.

    Raises:
        InvalidWorkflowError: it is not a valid definition; ``field`` is the JSON path.
    """
    return _workflow_from_dict(data, "$")


def _node_to_dict(node: Node) -> dict[str, Any]:
    if isinstance(node, Job):
        return node.to_dict()
    # workflow.schema.json requires "args" on every step, a nested workflow too (the spec's own
    # §10.3 example has none and fails it): an empty one keeps the form valid; reading ignores it.
    return {**workflow_to_dict(node), "args": []}


def _workflow_from_dict(data: Mapping[str, Any], where: str) -> Workflow:
    if not isinstance(data, Mapping):
        raise InvalidWorkflowError(f"{where}: a workflow must be an object, got {type(data).__name__}", field=where)
    kind = data.get("type")
    if kind not in _WORKFLOW_TYPES:
        raise InvalidWorkflowError(
            f"{where}.type: must be one of chain, group, batch, got {kind!r}", field=f"{where}.type"
        )
    key = "steps" if kind == "chain" else "jobs"
    if key not in data:
        raise InvalidWorkflowError(f"{where}.{key}: is required for a {kind}", field=f"{where}.{key}")
    members = data[key]
    if not isinstance(members, list):
        raise InvalidWorkflowError(f"{where}.{key}: must be an array", field=f"{where}.{key}")
    common = {"name": data.get("name"), "id": data.get("id")}
    members = [_member_from_dict(item, f"{where}.{key}[{index}]") for index, item in enumerate(members)]
    try:
        if kind == "chain":
            return chain(*members, **common)
        if kind == "group":
            return group(members, **common)
        callbacks = data.get("callbacks")
        if not isinstance(callbacks, Mapping):
            raise InvalidWorkflowError(
                f"{where}.callbacks: a batch needs a callbacks object", field=f"{where}.callbacks"
            )
        unknown = sorted(set(callbacks) - set(CALLBACK_NAMES))
        if unknown:
            raise InvalidWorkflowError(
                f"{where}.callbacks: unknown callback {unknown[0]!r}", field=f"{where}.callbacks"
            )
        built = {
            name: _job_from_dict(callbacks[name], f"{where}.callbacks.{name}") if name in callbacks else None
            for name in CALLBACK_NAMES
        }
        return batch(
            members,
            on_complete=built["on_complete"],
            on_success=built["on_success"],
            on_failure=built["on_failure"],
            name=common["name"],
            id=common["id"],
        )
    except InvalidWorkflowError as exc:
        if exc.field and not exc.field.startswith("$"):
            raise InvalidWorkflowError(f"{where}.{exc}", field=f"{where}.{exc.field}") from None
        raise


def _is_workflow_dict(data: Mapping[str, Any]) -> bool:
    return data.get("type") in _WORKFLOW_TYPES and ("steps" in data or "jobs" in data)


def _member_from_dict(data: Any, where: str) -> Node:
    if isinstance(data, Mapping) and _is_workflow_dict(data):
        return _workflow_from_dict(data, where)
    return _job_from_dict(data, where)


_OPTION_KEYS: Final = frozenset(
    {"queue", "priority", "timeout_ms", "delay_until", "expires_at", "retry", "tags", "unique", "visibility_timeout_ms"}
)
_UNSUPPORTED_OPTIONS: Final = frozenset({"unique", "visibility_timeout_ms"})


def _job_from_dict(data: Any, where: str) -> Job:
    """A job envelope (it has ``specversion`` or ``id``) or a job spec ``{type, args, options}``."""
    if isinstance(data, Job):
        return data
    if not isinstance(data, Mapping):
        raise InvalidWorkflowError(f"{where}: a job must be an object, got {type(data).__name__}", field=where)
    try:
        if "specversion" in data or "id" in data:
            return Job.from_json(dict(data))
        return _job_from_spec(data, where)
    except InvalidWorkflowError:
        raise
    except ValidationError as exc:
        sub = f"{where}.{exc.field}" if exc.field else where
        raise InvalidWorkflowError(f"{sub}: {exc}", field=sub) from None


def _job_from_spec(data: Mapping[str, Any], where: str) -> Job:
    unknown = sorted(set(data) - {"type", "args", "options"})
    if unknown:
        raise InvalidWorkflowError(
            f"{where}.{unknown[0]}: not a field of a job spec (type, args, options)", field=f"{where}.{unknown[0]}"
        )
    if "type" not in data or "args" not in data:
        missing = "type" if "type" not in data else "args"
        raise InvalidWorkflowError(f"{where}.{missing}: is required", field=f"{where}.{missing}")
    options = data.get("options") or {}
    if not isinstance(options, Mapping):
        raise InvalidWorkflowError(f"{where}.options: must be an object", field=f"{where}.options")
    bad = sorted(set(options) - _OPTION_KEYS)
    if bad:
        raise InvalidWorkflowError(f"{where}.options.{bad[0]}: not a job option", field=f"{where}.options.{bad[0]}")
    unsupported = sorted(set(options) & _UNSUPPORTED_OPTIONS)
    if unsupported:
        raise InvalidWorkflowError(
            f"{where}.options.{unsupported[0]}: not supported inside a workflow",
            field=f"{where}.options.{unsupported[0]}",
        )
    timeout_ms = options.get("timeout_ms")
    timeout = None
    if timeout_ms is not None:
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise InvalidWorkflowError(
                f"{where}.options.timeout_ms: must be an integer >= 0", field=f"{where}.options.timeout_ms"
            )
        timeout = -(-timeout_ms // 1000)  # the envelope's timeout is in seconds: round up, never shorter
    return Job.create(
        data["type"],
        data["args"],
        queue=options.get("queue", "default"),
        priority=options.get("priority"),
        retry=options.get("retry"),
        timeout=timeout,
        scheduled_at=options.get("delay_until"),
        expires_at=options.get("expires_at"),
        tags=options.get("tags"),
    )


def _listed(items: Iterable[MemberLike], where: str) -> tuple[MemberLike, ...]:
    if isinstance(items, (Job, Chain, Group, Batch, Mapping, str, bytes)):
        raise InvalidWorkflowError(f"{where} must be a list of jobs, got {type(items).__name__}", field=where)
    try:
        return tuple(items)
    except TypeError:
        raise InvalidWorkflowError(f"{where} must be a list of jobs, got {type(items).__name__}", field=where) from None


def _members(items: Sequence[MemberLike], where: str, outer: WorkflowType) -> tuple[Node, ...]:
    if not items:
        raise InvalidWorkflowError(f"{where}: a {outer} must contain at least one {where[:-1]}", field=where)
    members: list[Node] = []
    for index, item in enumerate(items):
        spot = f"{where}[{index}]"
        node = _member_from_dict(item, spot) if isinstance(item, Mapping) else item
        if isinstance(node, (Chain, Group, Batch)):
            if (outer, node.type) not in _ALLOWED_NESTING:
                raise InvalidWorkflowError(
                    f"{spot}: a {node.type} inside a {outer} is not a composition of the spec (§10.1); "
                    f"put its {'steps' if node.type == 'chain' else 'jobs'} in the outer {outer}",
                    field=spot,
                )
        elif not isinstance(node, Job):
            raise InvalidWorkflowError(
                f"{spot}: expected a Job, a job spec dict or a workflow, got {type(node).__name__}", field=spot
            )
        members.append(node)
    return tuple(members)


def _callback(value: Job | Mapping[str, Any] | None, where: str) -> Job | None:
    if value is None:
        return None
    if isinstance(value, (Chain, Group, Batch)) or (isinstance(value, Mapping) and _is_workflow_dict(value)):
        raise InvalidWorkflowError(f"{where}: a callback is a job, not a workflow", field=where)
    return _job_from_dict(value, where)


def _workflow_id(value: str | None) -> str:
    if value is None:
        return new_job_id()
    if not isinstance(value, str) or JOB_ID_RE.fullmatch(value) is None:
        raise InvalidWorkflowError(f"id: a workflow id must be a lowercase UUIDv7, got {value!r}", field="id")
    return value


def _name(value: str | None) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidWorkflowError(f"name: must be a string, got {type(value).__name__}", field="name")
    return value


# --------------------------------------------------------------------------- states


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


# --------------------------------------------------------------------------- results (§7.5)


def result_size(result: Any) -> int:
    """The size of a result as carried: UTF-8 bytes of its compact JSON.

    Parameters:
        result: a handler's return value.

    Returns:
        The size in bytes.

    Raises:
        ValidationError: the result is not a JSON value.
    """
    ensure_json_native(result, "result")
    return len(dumps(result).encode("utf-8"))


def check_result(result: Any, *, limit: int = MAX_RESULT_BYTES) -> int:
    """Refuse a result a workflow cannot carry (over :data:`MAX_RESULT_BYTES`).

    Parameters:
        result: a handler's return value.
        limit: the limit in bytes.

    Returns:
        Its size in bytes.

    Raises:
        ResultTooLargeError: it is bigger (the job fails with ``result_too_large``, not retried).
        ValidationError: it is not a JSON value.
    """
    size = result_size(result)
    if size > limit:
        raise ResultTooLargeError(
            f"the result is {size} bytes, over the {limit}-byte limit of a workflow's results; store it elsewhere "
            'and return a reference, e.g. {"result_ref": "s3://bucket/key", "result_size_bytes": ...}',
            size=size,
            limit=limit,
        )
    return size


def fit_parent_results(
    parent_results: Mapping[str, Any], *, limit: int = MAX_INLINE_RESULTS_BYTES
) -> dict[str, Any] | None:
    """The ``parent_results`` to carry inline: all of them, or the most recent that fit.

    Keys are step indexes (``"0"``, ``"1"`` ...); the oldest steps are dropped first and the
    newest (the immediately preceding step, §7.2 MUST) never.

    Parameters:
        parent_results: every earlier result, keyed by index.
        limit: the inline budget in bytes.

    Returns:
        The results to carry, or None when even the newest alone is over ``limit`` (then read it
        from the fan-in record: :attr:`WorkflowContext.results_from`).
    """
    if not parent_results:
        return {}
    keys = sorted(parent_results, key=_index_key)
    sizes = {key: len(dumps(parent_results[key]).encode("utf-8")) + len(key) + 4 for key in keys}
    if sizes[keys[-1]] > limit:
        return None
    kept: list[str] = []
    total = 2
    for key in reversed(keys):
        if total + sizes[key] > limit:
            break
        kept.append(key)
        total += sizes[key]
    return {key: parent_results[key] for key in sorted(kept, key=_index_key)}


def _index_key(key: str) -> tuple[int, str]:
    return (int(key), key) if key.isdigit() else (1 << 62, key)


# --------------------------------------------------------------------------- the wire form


@dataclass(frozen=True, slots=True)
class FanInRef:
    """Where a group's or batch's job reports its outcome: the fan-in of workflow ``id``, ``index`` of ``count``."""

    id: str
    index: int
    count: int


@dataclass(frozen=True, slots=True)
class WorkflowContext:
    """What a job of a workflow carries in ``meta.workflow``.

    Attributes:
        id: the root workflow's id.
        path: the job's address in the root workflow.
        parent_results: what the handler sees as ``current_job().parent_results`` (§7), inline.
        results_from: instead of inline results: the fan-in (workflow id) whose record holds them
            (a group's or batch's results over :data:`MAX_INLINE_RESULTS_BYTES`).
        fan_in: set on a group's or batch's job: where its outcome is counted.
        continuation: the root definition (:func:`workflow_to_dict`) on a chain's steps: what to
            enqueue when this step ends, with no datastore (DESIGN §21).  Not on a group's jobs:
            their fan-in record holds it once, instead of once per job.
        scopes: the results so far of every chain enclosing this job, by the chain's path
            (dotted, ``""`` for the root): what a chain continues with once a nested group or
            chain ended (:mod:`ojs_kombu.policy.workflow`).
    """

    id: str
    path: Path
    parent_results: dict[str, Any] = field(default_factory=dict)
    results_from: str | None = None
    fan_in: FanInRef | None = None
    continuation: dict[str, Any] | None = None
    scopes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_meta(self) -> dict[str, Any]:
        """The JSON object for ``meta.workflow``.

        Returns:
            A new dict.
        """
        data: dict[str, Any] = {"id": self.id, "path": list(self.path), "parent_results": self.parent_results}
        if self.results_from is not None:
            data["results_from"] = self.results_from
        if self.fan_in is not None:
            data["fan_in"] = {"id": self.fan_in.id, "index": self.fan_in.index, "count": self.fan_in.count}
        if self.continuation is not None:
            data["continuation"] = self.continuation
        if self.scopes:
            data["scopes"] = self.scopes
        return data

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any] | None) -> WorkflowContext | None:
        """Read ``meta.workflow`` of a received job.

        Parameters:
            meta: the job's ``meta`` (or None).

        Returns:
            The context, or None when the job is not part of a workflow.

        Raises:
            ValidationError: ``meta.workflow`` is there but malformed (``field`` names the part).
        """
        data = (meta or {}).get(WORKFLOW_META_KEY)
        if data is None:
            return None
        where = f"meta.{WORKFLOW_META_KEY}"
        if not isinstance(data, Mapping):
            raise ValidationError(f"{where} must be an object", field=where)
        workflow_id = data.get("id")
        if not isinstance(workflow_id, str) or not workflow_id:
            raise ValidationError(f"{where}.id must be a non-empty string", field=f"{where}.id")
        path = data.get("path")
        if not isinstance(path, list) or not all(_path_part(part) for part in path):
            raise ValidationError(f"{where}.path must be an array of indexes and callback names", field=f"{where}.path")
        parent_results = data.get("parent_results", {})
        if not isinstance(parent_results, dict):
            raise ValidationError(f"{where}.parent_results must be an object", field=f"{where}.parent_results")
        results_from = data.get("results_from")
        if results_from is not None and not isinstance(results_from, str):
            raise ValidationError(f"{where}.results_from must be a string", field=f"{where}.results_from")
        fan_in = data.get("fan_in")
        ref = None
        if fan_in is not None:
            ref = _fan_in_ref(fan_in, f"{where}.fan_in")
        continuation = data.get("continuation")
        if continuation is not None and not isinstance(continuation, dict):
            raise ValidationError(f"{where}.continuation must be an object", field=f"{where}.continuation")
        scopes = data.get("scopes", {})
        if not isinstance(scopes, dict) or not all(isinstance(value, dict) for value in scopes.values()):
            raise ValidationError(f"{where}.scopes must be an object of objects", field=f"{where}.scopes")
        return cls(workflow_id, tuple(path), parent_results, results_from, ref, continuation, scopes)


def _path_part(part: Any) -> bool:
    if isinstance(part, bool):
        return False
    return (isinstance(part, int) and part >= 0) or part in CALLBACK_NAMES


def _fan_in_ref(data: Any, where: str) -> FanInRef:
    if not isinstance(data, Mapping):
        raise ValidationError(f"{where} must be an object", field=where)
    fan_id, index, count = data.get("id"), data.get("index"), data.get("count")
    if not isinstance(fan_id, str) or not fan_id:
        raise ValidationError(f"{where}.id must be a non-empty string", field=f"{where}.id")
    for name, value in (("index", index), ("count", count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValidationError(f"{where}.{name} must be an integer >= 0", field=f"{where}.{name}")
    assert isinstance(index, int) and isinstance(count, int)
    if not index < count:
        raise ValidationError(f"{where}.index must be below count ({index} of {count})", field=f"{where}.index")
    return FanInRef(fan_id, index, count)


__all__ = [
    "CALLBACK_NAMES",
    "MAX_INLINE_RESULTS_BYTES",
    "MAX_NESTING_DEPTH",
    "MAX_RESULT_BYTES",
    "STEP_TRANSITIONS",
    "WORKFLOW_META_KEY",
    "WORKFLOW_TRANSITIONS",
    "Batch",
    "CallbackName",
    "Chain",
    "FanInRef",
    "Group",
    "MemberLike",
    "Node",
    "Outcome",
    "Path",
    "Runnable",
    "Status",
    "StepState",
    "Workflow",
    "WorkflowContext",
    "WorkflowState",
    "WorkflowType",
    "batch",
    "chain",
    "check_depth",
    "check_result",
    "check_step_transition",
    "check_transition",
    "depth",
    "evaluate",
    "fit_parent_results",
    "group",
    "job_count",
    "node_at",
    "result_size",
    "workflow_from_dict",
    "workflow_to_dict",
]
