"""The argument checks of :meth:`Job.create <ojs_kombu.model.job.Job.create>`, a producer's hot path.

Each check raises :class:`~ojs_kombu.model._problems.Problem` (``create`` reports it under the
argument's name) and costs as little as it can: ``create`` runs once per enqueued job, so the
job types and queue names found valid are remembered and ``created_at`` is formatted once per
millisecond.  Nothing here builds a :class:`~ojs_kombu.model.job.Job`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pydantic import ValidationError as _PydanticValidationError

from ojs_kombu.model._problems import Problem as _Problem
from ojs_kombu.model._problems import convert_pydantic_error as _convert
from ojs_kombu.model._problems import short_repr as _short
from ojs_kombu.model.jsonvalue import MAX_SAFE_INTEGER, _walk
from ojs_kombu.model.policies import RetryPolicy, UniquePolicy
from ojs_kombu.model.ratelimit import RateLimitPolicy
from ojs_kombu.model.timefmt import _aware, _format_ts, _timestamp

# Job types and queue names Job.create found valid: a program uses a few, each is checked once.
# Exact strings only (their equality is str's); bounded, starting over when full.
_GOOD_TYPES: set[str] = set()
_GOOD_QUEUES: set[str] = set()
_GOOD_NAMES_LIMIT = 1024


def _remember_name(names: set[str], name: str) -> None:
    if name.__class__ is str:
        if len(names) >= _GOOD_NAMES_LIMIT:
            names.clear()
        names.add(name)


class _Stamps:
    """The current time as an OJS timestamp, formatted once per millisecond (``Job.create`` is hot)."""

    def __init__(self) -> None:
        self._last: tuple[int, str] = (-1, "")  # one tuple, replaced whole: safe across threads

    def now(self) -> str:
        """``_format_ts(datetime.now(UTC))``: UTC, milliseconds, ``Z``."""
        ms = time.time_ns() // 1_000_000
        last_ms, stamp = self._last
        if ms != last_ms:
            seconds, millis = divmod(ms, 1000)
            stamp = _format_ts(datetime.fromtimestamp(seconds, UTC).replace(microsecond=millis * 1000))
            self._last = (ms, stamp)
        return stamp


_STAMPS = _Stamps()


def _type_name(value: Any) -> str:
    return type(value).__name__


def _checked_int(value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Problem(f"must be an integer, got {type(value).__name__} {_short(value)}")
    if not minimum <= value <= MAX_SAFE_INTEGER:
        raise _Problem(f"must be between {minimum} and {MAX_SAFE_INTEGER}, got {value}")
    return int(value)


def _moment(value: Any, now: datetime, *, round_up: bool) -> str:
    """A scheduled_at/expires_at argument as an OJS timestamp."""
    if isinstance(value, timedelta):
        try:
            moment = now + value
        except OverflowError:
            raise _Problem(f"now + {value!r} is outside the supported dates") from None
    elif isinstance(value, datetime):
        moment = _aware(value)
    elif isinstance(value, str):
        moment = _timestamp(value)
    else:
        raise _Problem(
            f"expected an aware datetime, an RFC 3339 string or a timedelta from now, got {type(value).__name__}"
        )
    try:
        if round_up and moment.microsecond % 1000:
            moment += timedelta(microseconds=1000 - moment.microsecond % 1000)
        return _format_ts(moment)
    except OverflowError:
        raise _Problem(f"{moment!r} is outside the supported dates") from None


def _tags(tags: Any) -> list[str]:
    if not isinstance(tags, (list, tuple)):
        raise _Problem(f"must be a list of strings, got {type(tags).__name__}")
    for index, tag in enumerate(tags):
        if not isinstance(tag, str):
            raise _Problem(f"each tag must be a string, got {type(tag).__name__}", f"[{index}]")
    return list(tags)


_Policy = TypeVar("_Policy", RetryPolicy, UniquePolicy, RateLimitPolicy)


def _policy_argument(value: Any, model: type[_Policy], field: str) -> _Policy:
    """``retry=`` / ``unique=`` / ``rate_limit=``: the policy itself, or a dict validated into one (errors under ``field``)."""
    if isinstance(value, model):
        return value
    if not isinstance(value, Mapping):
        raise _Problem(f"must be a {model.__name__} or a dict, got {type(value).__name__}")
    try:
        policy: _Policy = model.__pydantic_validator__.validate_python(dict(value))
    except _PydanticValidationError as exc:
        raise _convert(exc, field) from None
    return policy


def _meta_argument(meta: Any, kwargs: Any, tags: Any) -> tuple[dict[str, Any], int]:
    """``meta`` (a copy) with ``kwargs`` and ``tags`` folded in (each omitted when empty), checked.

    Returns:
        The job's ``meta`` (empty when there is none) and the walked size of what it holds.

    Raises:
        Problem: under ``meta``, ``kwargs`` or ``tags``, the argument at fault.
    """
    field = "meta"
    try:
        if meta is None:
            meta, size = {}, 0
        elif isinstance(meta, dict):
            size = _walk(meta, False, 0)
            meta = dict(meta)
        else:
            raise _Problem(f"must be a dict, got {_type_name(meta)}")
        if kwargs is not None:
            field = "kwargs"
            if not isinstance(kwargs, dict):
                raise _Problem(f"must be a dict of keyword arguments, got {_type_name(kwargs)}")
            if kwargs:
                if "kwargs" in meta:
                    raise _Problem("given both kwargs= and meta['kwargs']; pass one of them")
                size += _walk(kwargs, False, 1)
                meta["kwargs"] = dict(kwargs)
        if tags is not None:
            field = "tags"
            tags = _tags(tags)
            if tags:
                if "tags" in meta:
                    raise _Problem("given both tags= and meta['tags']; pass one of them")
                size += _walk(tags, False, 1)
                meta["tags"] = tags
    except _Problem as problem:
        raise problem.under(field) from None
    return meta, size


def _option_fields(
    state: dict[str, Any],
    given: set[str],
    now: datetime | None,
    priority: Any,
    timeout: Any,
    scheduled_at: Any,
    expires_at: Any,
    retry: Any,
    unique: Any,
    rate_limit: Any = None,
) -> None:
    """Check the options given (not None) and set them in the job's ``state`` and ``given`` fields.

    ``now`` is the job's ``created_at`` moment, which a ``timedelta`` counts from (taken
    whenever ``scheduled_at`` or ``expires_at`` is given).

    Raises:
        Problem: under the option at fault.
        ValidationError: a ``retry``, ``unique`` or ``rate_limit`` dict the policy model refuses.
    """
    field = "priority"
    try:
        if priority is not None:
            state["priority"] = _checked_int(priority, -MAX_SAFE_INTEGER)
            given.add("priority")
        if timeout is not None:
            field = "timeout"
            state["timeout"] = _checked_int(timeout, 0)
            given.add("timeout")
        if scheduled_at is not None or expires_at is not None:
            assert now is not None  # Job.create takes it whenever either is given
            if scheduled_at is not None:
                field = "scheduled_at"
                state["scheduled_at"] = _moment(scheduled_at, now, round_up=True)
                given.add("scheduled_at")
            if expires_at is not None:
                field = "expires_at"
                state["expires_at"] = _moment(expires_at, now, round_up=False)
                given.add("expires_at")
        if retry is not None:
            field = "retry"
            state["retry"] = _policy_argument(retry, RetryPolicy, "retry")
            given.add("retry")
        if unique is not None:
            field = "unique"
            state["unique"] = _policy_argument(unique, UniquePolicy, "unique")
            given.add("unique")
        if rate_limit is not None:
            field = "rate_limit"
            state["rate_limit"] = _policy_argument(rate_limit, RateLimitPolicy, "rate_limit")
            given.add("rate_limit")
    except _Problem as problem:
        raise problem.under(field) from None
