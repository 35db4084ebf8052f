"""What a workflow is: :class:`Chain`, :class:`Group` and :class:`Batch`, the addresses of their jobs.

Every job of a workflow has a *path* from the root: the index of each step or job on the way
(``(1, 2)``: job 2 of the group that is step 1), a callback ends with its name
(``(1, "on_failure")``).  On the wire a path is a JSON array.  The objects are frozen and built
checked by :mod:`ojs_kombu.model.workflow.build`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final, Literal, TypeAlias, get_args

from ojs_kombu.errors import InvalidWorkflowError, ValidationError
from ojs_kombu.model.job import Job

WorkflowType = Literal["chain", "group", "batch"]
"""The three primitives (§1.1)."""


CallbackName = Literal["on_complete", "on_success", "on_failure"]
"""A batch callback (§6.3)."""

CALLBACK_NAMES: Final[tuple[CallbackName, ...]] = get_args(CallbackName)

Path: TypeAlias = tuple[int | str, ...]
"""A job's address in a workflow: the index of each step/job from the root; a callback ends with its name."""

MAX_NESTING_DEPTH: Final = 3
"""Most workflow levels a definition may have (§10.2: at least 3 SHOULD be supported): a chain of
groups of chains.  Deeper definitions are refused when built (:class:`InvalidWorkflowError`)."""


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
