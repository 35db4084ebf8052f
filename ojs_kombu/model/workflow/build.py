"""Building workflows: :func:`chain`, :func:`group`, :func:`batch` and the spec's JSON form.

The builders take :class:`~ojs_kombu.model.job.Job`\\ s, job specs (the spec's
``{"type", "args", "options"}``) or nested workflows.  Checked when built (§11.1): at least one
step or job, a batch has at least one callback, callbacks are jobs, nesting follows §10.1 and is at
most :data:`~ojs_kombu.model.workflow.MAX_NESTING_DEPTH` workflow levels deep (§10.2).
:func:`workflow_to_dict` / :func:`workflow_from_dict` are the spec's JSON form, read through the
same builders.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeAlias, get_args

from ojs_kombu.errors import InvalidWorkflowError, ValidationError
from ojs_kombu.model.ids import JOB_ID_RE, new_job_id
from ojs_kombu.model.job import Job
from ojs_kombu.model.workflow.definitions import (
    CALLBACK_NAMES,
    Batch,
    Chain,
    Group,
    Node,
    Workflow,
    WorkflowType,
    check_depth,
)

_WORKFLOW_TYPES: Final = frozenset(get_args(WorkflowType))


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
