"""The wire form of a workflow's job: :class:`WorkflowContext`, under ``meta.workflow``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.workflow.definitions import CALLBACK_NAMES, Path

WORKFLOW_META_KEY: Final = "workflow"
"""The key of :class:`WorkflowContext` in a job's ``meta``."""


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
