"""Field types of the envelope's models: JSON integers, durations, timestamps, string lists, job states, the spec version.

Each checks what pydantic's own types do not: JSON Schema's idea of an integer
(``5.0`` is one), ISO 8601 durations given as a string or a ``timedelta``, lists
whose items must be unique.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BeforeValidator, Field

from ojs_kombu.model._problems import Problem
from ojs_kombu.model.jsonvalue import MAX_SAFE_INTEGER
from ojs_kombu.model.timefmt import _duration_input

SPEC_VERSION = "1.0"
"""The only ``specversion`` this library reads and writes."""

JobState = Literal["scheduled", "available", "pending", "active", "completed", "retryable", "cancelled", "discarded"]
"""The eight OJS lifecycle states."""

_Item = TypeVar("_Item")


def json_int(value: Any) -> Any:
    """Before-validator of integer fields: JSON Schema counts ``5.0`` as an integer."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


def unique_items(value: list[_Item] | None) -> list[_Item] | None:
    """Return ``value`` if no item appears twice (None passes).

    Raises:
        Problem: naming the first item seen a second time.
    """
    if value is not None and len(set(value)) != len(value):
        seen: set[_Item] = set()
        for item in value:
            if item in seen:
                raise Problem(f"{item!r} appears more than once; items must be unique")
            seen.add(item)
    return value


def tuple_to_list(value: Any) -> Any:
    """Before-validator of list fields: a tuple becomes a list (as JSON would make it)."""
    return list(value) if isinstance(value, tuple) else value


def int_field(default: int | None, *, ge: int = -MAX_SAFE_INTEGER) -> Any:
    """A strict integer field within ``[ge, MAX_SAFE_INTEGER]``, defaulting to ``default``."""
    return Field(default, strict=True, ge=ge, le=MAX_SAFE_INTEGER)


Int = Annotated[int, BeforeValidator(json_int)]
NonEmptyStr = Annotated[str, Field(strict=True, min_length=1)]
Duration = Annotated[str, BeforeValidator(_duration_input), Field(strict=True)]
"""An ISO 8601 duration, given as the string or a ``timedelta`` (stored as the string)."""
Timestamp = Annotated[str, Field(strict=True)]
StrList = Annotated[list[NonEmptyStr], BeforeValidator(tuple_to_list)]

__all__ = ["SPEC_VERSION", "JobState"]
