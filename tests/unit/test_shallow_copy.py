"""``model.base.shallow_copy`` is ``model_copy()``: equal state, nothing mutable shared but the values;
``Job.create``'s shared fields set (``SharedFieldsSet``) is copied on write."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from pydantic import PrivateAttr

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.base import OjsModel, mode_context, shallow_copy
from ojs_kombu.model.job import Job
from ojs_kombu.model.policies import RetryPolicy


class Private(OjsModel):
    name: str = "x"
    _note: str = PrivateAttr(default="n")
    _unset: Any = PrivateAttr()


def state(model: OjsModel) -> tuple[Any, ...]:
    return (
        type(model),
        model.__dict__,
        list(model.__dict__),
        model.__pydantic_fields_set__,
        model.__pydantic_extra__,
        model.__pydantic_private__,
    )


def test_a_shallow_copy_is_model_copy() -> None:
    models: list[OjsModel] = [
        RetryPolicy(max_attempts=4),
        RetryPolicy.model_validate({"max_attempts": 3, "x-extension": "kept"}, context=mode_context(strict=False)),
        Job.create("a.b", [1], meta={"k": [1]}, retry={"max_attempts": 2}),
        Job.from_json({**Job.create("a.b").to_dict(), "x-custom": {"a": 1}}, strict=False),
        Private(name="y"),
    ]
    for model in models:
        copied, expected = shallow_copy(model), model.model_copy()
        assert state(copied) == state(expected)
        assert copied == model
        for name in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"):
            original = getattr(model, name)
            assert original is None or getattr(copied, name) is not original  # its own container


def test_changing_a_copy_leaves_the_original() -> None:
    policy = RetryPolicy(max_attempts=4)
    copied = shallow_copy(policy)
    copied.max_attempts = 9
    assert policy.max_attempts == 4 and policy.model_fields_set == {"max_attempts"}
    copied.initial_interval = "PT2S"
    assert "initial_interval" not in policy.model_fields_set


def test_jobs_created_alike_share_a_fields_set_until_one_is_changed() -> None:
    first, second = Job.create("a.b", [1]), Job.create("a.b", [2])
    shared = first.model_fields_set
    assert second.model_fields_set is shared  # one tracked container less per job (Job.create is hot)
    with pytest.raises(TypeError, match="shared"):
        shared.add("priority")
    first.priority = 3
    assert "priority" in first.model_fields_set and "priority" not in second.model_fields_set
    with pytest.raises(ValidationError, match="priority"):
        second.priority = "high"  # type: ignore[assignment]
    updated = second.model_copy(update={"timeout": 5})
    assert "timeout" in updated.model_fields_set and "timeout" not in shared
    assert type(updated.model_fields_set) is set
    for copied in (copy.deepcopy(second), pickle.loads(pickle.dumps(second)), shallow_copy(second)):
        assert type(copied.model_fields_set) is set and copied == second
    given = Job.create("a.b", meta={"k": 1}), Job.create("a.b", priority=1), Job.create("a.b", tags=["t"], timeout=2)
    assert [job.model_fields_set - shared for job in given] == [{"meta"}, {"priority"}, {"meta", "timeout"}]
    assert shared == {"specversion", "id", "type", "queue", "args", "attempt", "created_at", "enqueued_at"}
