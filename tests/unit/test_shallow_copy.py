"""``model.base.shallow_copy`` is ``model_copy()``: equal state, nothing mutable shared but the values."""

from __future__ import annotations

from typing import Any

from pydantic import PrivateAttr

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
