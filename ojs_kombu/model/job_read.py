"""The fast tolerant read of a common envelope: :meth:`Job.from_json(strict=False) <ojs_kombu.model.job.Job.from_json>` without pydantic.

It runs on every delivery.  Each plain field of the envelope (:data:`_FAST_KEYS`) is read
with the check its validator in :class:`~ojs_kombu.model.job.Job` applies; an envelope
with any other key, or a value this path does not accept as it stands, is left to the
model (:func:`read_common` returns None), which words any error itself.
``tests/unit/test_fast_read.py`` holds this path and the model together.
"""

from __future__ import annotations

import functools
from typing import Any

from ojs_kombu.errors import ValidationError
from ojs_kombu.model._problems import Problem as _Problem
from ojs_kombu.model.base import mode_context, shallow_copy
from ojs_kombu.model.fields import SPEC_VERSION
from ojs_kombu.model.ids import UUID_RE
from ojs_kombu.model.jsonvalue import MAX_SAFE_INTEGER, _walk
from ojs_kombu.model.naming import check_job_type, check_queue_name
from ojs_kombu.model.policies import RetryPolicy
from ojs_kombu.model.timefmt import _check_timestamp


def read_common(data: dict[str, Any], *, native: bool = False) -> dict[str, Any] | None:
    """The fields of a common envelope read tolerantly without pydantic, or None for the full validation.

    Only the plain fields (:data:`_FAST_KEYS`) are read here, each with the check its validator
    applies (a ``retry`` of scalars: the model's own reading, cached); an envelope with any other
    key (``unique``, ``error``, ``state``, an unknown field ...) or a value this path does not
    accept as it stands (a float ``attempt``, an id that is not a string ...) returns None, so
    the model decides.  ``null`` fields are left out (tolerant: absent).

    Parameters:
        data: the decoded envelope (not modified; ``args``/``meta`` are copied, as pydantic copies them).
        native: ``args``/``meta`` are JSON-native by construction (read by orjson, see
            :func:`~ojs_kombu.model.jsonvalue.loads_native`): their walk would find nothing, skip it.

    Returns:
        The job's field values (``specversion`` always among them), or None.
    """
    values: dict[str, Any] = {"specversion": SPEC_VERSION}
    checks = _NATIVE_FAST_KEYS if native else _FAST_KEYS
    try:
        for key, value in data.items():
            check = checks.get(key)
            if check is None:
                return None  # not a plain field: the model reads it
            if value is None:
                continue  # tolerant: null counts as absent
            values[key] = check(value)
    except _Problem:
        return None
    if not _REQUIRED.issubset(values):
        return None
    return values


def _fast_specversion(value: Any) -> str:
    if value != SPEC_VERSION or type(value) is not str:
        raise _Problem("not the plain specversion")
    return SPEC_VERSION


def _fast_id(value: Any) -> str:
    if type(value) is not str:
        raise _Problem("not a string")
    lowered: str = value.lower()  # Job._tolerant_fixups
    if UUID_RE.fullmatch(lowered) is None:
        raise _Problem("not a UUID")
    return lowered


def _fast_text(check: Any) -> Any:
    # A deployment has a few job types and queues: each name is checked once (a refused one
    # raises, and is not kept).  Exact strings only, so the memo's equality is str's.
    known = functools.lru_cache(maxsize=1024)(check)

    def read(value: Any) -> str:
        if type(value) is not str:
            raise _Problem("not a string")
        checked: str = known(value)
        return checked

    return read


def _native_list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise _Problem("not a list")
    return list(value)


def _native_dict(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise _Problem("not a dict")
    return dict(value)


def _fast_list(value: Any) -> list[Any]:
    copied = _native_list(value)
    _walk(copied, True, 0)
    return copied


def _fast_dict(value: Any) -> dict[str, Any]:
    copied = _native_dict(value)
    _walk(copied, True, 0)
    return copied


def _fast_int(minimum: int) -> Any:
    def read(value: Any) -> int:
        if type(value) is not int or not minimum <= value <= MAX_SAFE_INTEGER:
            raise _Problem("not an integer in range")
        return value

    return read


def _fast_timestamp(value: Any) -> str:
    if type(value) is not str:
        raise _Problem("not a string")
    checked: str = _check_timestamp(value)
    return checked


#: The JSON values a retry policy read by :func:`_fast_retry` may hold (immutable: a cached policy's copies share them).
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _fast_retry(value: Any) -> RetryPolicy:
    """A ``retry`` object of scalars: the model's own reading of it, remembered (adapters send the
    same few policies on every job: validating one costs more than the rest of the envelope)."""
    if type(value) is not dict:
        raise _Problem("not a dict of scalars")
    types = tuple(map(type, value.values()))
    if not _SCALARS.issuperset(types):
        raise _Problem("not a dict of scalars")
    # The types are part of the key: 1, 1.0 and True are equal (and hash alike) but read differently.
    return shallow_copy(_tolerant_retry(tuple(value.items()), types))


@functools.lru_cache(maxsize=256)
def _tolerant_retry(items: tuple[tuple[str, Any], ...], types: tuple[type, ...]) -> RetryPolicy:
    try:
        return RetryPolicy.model_validate(dict(items), context=mode_context(strict=False))
    except ValidationError:
        raise _Problem("the model words the error") from None


#: The fields :func:`read_common` reads, each with the check of its validator.
_FAST_KEYS: dict[str, Any] = {
    "specversion": _fast_specversion,
    "id": _fast_id,
    "type": _fast_text(check_job_type),
    "queue": _fast_text(check_queue_name),
    "args": _fast_list,
    "meta": _fast_dict,
    "priority": _fast_int(-MAX_SAFE_INTEGER),
    "timeout": _fast_int(0),
    "attempt": _fast_int(0),
    "retry": _fast_retry,
    **dict.fromkeys(
        ("scheduled_at", "expires_at", "created_at", "enqueued_at", "started_at", "completed_at"), _fast_timestamp
    ),
}
#: The same for an envelope read natively (``read_common(native=True)``): ``args``/``meta`` unwalked.
_NATIVE_FAST_KEYS: dict[str, Any] = {**_FAST_KEYS, "args": _native_list, "meta": _native_dict}
_REQUIRED = frozenset({"id", "type", "queue", "args"})


__all__ = ["read_common"]
