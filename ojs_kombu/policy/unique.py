"""Unique jobs without I/O: a :class:`~ojs_kombu.model.UniquePolicy`'s effective values, its key and its period.

The key is the spec's (ojs-unique-jobs.md §4): the chosen dimensions (``type`` always, plus
``queue``, ``args``, ``meta`` as ``keys`` says) as one JSON object, canonicalised as RFC 8785
(JCS: keys sorted at every level, no whitespace, ECMAScript number forms) after NFC-normalising
every string, hashed with SHA-256, as lowercase hex.

OJS ``args`` is a list.  ``args_keys`` names keyword arguments: the keys of the one object of
``args`` when ``args`` is ``[{...}]`` (the spec's own examples), else the keys of
``meta["kwargs"]`` (where :meth:`~ojs_kombu.Job.create` puts a Python call's keywords), else a
position of ``args`` written in decimal (``"0"``).  A name found nowhere is refused (spec §2.2).
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from calendar import monthrange
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from ojs_kombu.errors import ValidationError
from ojs_kombu.model import Job, JobState, UniquePolicy
from ojs_kombu.model.timefmt import _duration_groups

DEFAULT_KEYS: Final[tuple[str, ...]] = ("type",)
"""``keys`` of a policy that does not say (spec §2.1)."""

DEFAULT_STATES: Final[tuple[JobState, ...]] = ("available", "active", "scheduled", "retryable", "pending")
"""``states`` of a policy that does not say: the five non-terminal states (spec §6.1)."""

DEFAULT_ON_CONFLICT: Final = "reject"
"""``on_conflict`` of a policy that does not say (spec §2.1)."""


def effective_keys(policy: UniquePolicy) -> tuple[str, ...]:
    """The dimensions of the key, ``type`` always first (spec §2.2), in the order ``type, queue, args, meta``.

    Parameters:
        policy: the unique policy.

    Returns:
        The dimension names.
    """
    chosen = set(policy.keys if policy.keys is not None else DEFAULT_KEYS) | {"type"}
    return tuple(dim for dim in ("type", "queue", "args", "meta") if dim in chosen)


def effective_states(policy: UniquePolicy) -> tuple[JobState, ...]:
    """The states in which an existing job counts as a duplicate (spec §6).

    Parameters:
        policy: the unique policy.

    Returns:
        ``policy.states``, or :data:`DEFAULT_STATES`.
    """
    return tuple(policy.states) if policy.states is not None else DEFAULT_STATES


def effective_on_conflict(policy: UniquePolicy) -> str:
    """``policy.on_conflict``, or ``"reject"`` (spec §2.1).

    Parameters:
        policy: the unique policy.

    Returns:
        One of ``reject``, ``replace``, ``replace_except_schedule``, ``ignore``.
    """
    return policy.on_conflict or DEFAULT_ON_CONFLICT


def period_end(policy: UniquePolicy, created_at: datetime) -> datetime | None:
    """When the policy's window closes for a job created at ``created_at`` (spec §7), or None without a period.

    Years and months are calendar ones (``P1M`` from 31 January ends on the last day of
    February), so every duration the schema allows has an end.

    Parameters:
        policy: the unique policy.
        created_at: the job's ``created_at`` (timezone-aware).

    Returns:
        ``created_at + period``, or None when the policy has no period.

    Raises:
        ValidationError: ``unique.period`` is too long to add to ``created_at``.
    """
    if policy.period is None:
        return None
    years, months, weeks, days, hours, minutes, seconds = _duration_groups(policy.period)
    try:
        end = _add_months(created_at, 12 * int(years or 0) + int(months or 0))
        return end + timedelta(
            weeks=int(weeks or 0),
            days=int(days or 0),
            hours=int(hours or 0),
            minutes=int(minutes or 0),
            seconds=float(seconds) if seconds else 0.0,
        )
    except OverflowError:
        raise ValidationError(f"unique.period: {policy.period!r} is too long", field="unique.period") from None


def _add_months(when: datetime, months: int) -> datetime:
    if not months:
        return when
    index = when.year * 12 + when.month - 1 + months
    year, month = divmod(index, 12)
    if not 1 <= year <= 9999:
        raise OverflowError
    return when.replace(year=year, month=month + 1, day=min(when.day, monthrange(year, month + 1)[1]))


def unique_key(
    policy: UniquePolicy,
    *,
    type: str,
    queue: str,
    args: Sequence[Any] | Mapping[str, Any],
    meta: Mapping[str, Any] | None = None,
) -> str:
    """The uniqueness key of a job (spec §4): SHA-256 of the canonical JSON of its dimensions, lowercase hex.

    Parameters:
        policy: the unique policy.
        type: the job type.
        queue: the job's queue.
        args: the job's ``args`` (an OJS list; an object is accepted as the spec's examples write it).
        meta: the job's ``meta``.

    Returns:
        64 lowercase hex digits.

    Raises:
        ValidationError: ``args_keys`` or ``meta_keys`` name a key the job does not have
            (``field`` is ``"unique.args_keys"`` / ``"unique.meta_keys"``), or ``keys`` has
            ``"meta"`` without ``meta_keys``.
    """
    return hashlib.sha256(canonical_json(dimensions(policy, type=type, queue=queue, args=args, meta=meta))).hexdigest()


def job_unique_key(job: Job, policy: UniquePolicy | None = None) -> str:
    """The uniqueness key of ``job`` under ``policy`` (default: ``job.unique``).

    Parameters:
        job: the job.
        policy: the policy; ``job.unique`` when not given.

    Returns:
        As :func:`unique_key`.

    Raises:
        ValidationError: as :func:`unique_key`; also when there is no policy at all.
    """
    policy = policy if policy is not None else job.unique
    if policy is None:
        raise ValidationError("the job has no unique policy", field="unique")
    return unique_key(policy, type=job.type, queue=job.queue, args=job.args, meta=job.meta)


def dimensions(
    policy: UniquePolicy,
    *,
    type: str,
    queue: str,
    args: Sequence[Any] | Mapping[str, Any],
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The object that is hashed (spec §4.1 step 1): dimension name -> value.

    Parameters:
        policy, type, queue, args, meta: as :func:`unique_key`.

    Returns:
        ``{"type": ..., "queue": ..., "args": ..., "meta": ...}`` with the chosen dimensions only.

    Raises:
        ValidationError: as :func:`unique_key`.
    """
    out: dict[str, Any] = {}
    for dim in effective_keys(policy):
        if dim == "type":
            out["type"] = type
        elif dim == "queue":
            out["queue"] = queue
        elif dim == "args":
            out["args"] = args if policy.args_keys is None else _select_args(args, meta, policy.args_keys)
        else:
            if not policy.meta_keys:
                raise ValidationError(
                    'unique.meta_keys: is required when keys contains "meta"', field="unique.meta_keys"
                )
            out["meta"] = _select(meta or {}, policy.meta_keys, "meta_keys", "meta")
    return out


def _select(source: Mapping[str, Any], names: Sequence[str], field: str, where: str) -> dict[str, Any]:
    missing = [name for name in names if name not in source]
    if missing:
        raise ValidationError(
            f"unique.{field}: {', '.join(map(repr, missing))} not in the job's {where}", field=f"unique.{field}"
        )
    return {name: source[name] for name in names}


def _select_args(
    args: Sequence[Any] | Mapping[str, Any], meta: Mapping[str, Any] | None, names: Sequence[str]
) -> dict[str, Any]:
    if isinstance(args, Mapping):
        return _select(args, names, "args_keys", "args")
    if len(args) == 1 and isinstance(args[0], Mapping):
        return _select(args[0], names, "args_keys", "args")
    kwargs = (meta or {}).get("kwargs")
    keywords: dict[str, Any] = dict(kwargs) if isinstance(kwargs, Mapping) else {}
    for position, value in enumerate(args):
        keywords.setdefault(str(position), value)
    return _select(keywords, names, "args_keys", "args (its one object, meta.kwargs or a position)")


def canonical_json(value: Any) -> bytes:
    """``value`` as RFC 8785 canonical JSON (UTF-8), every string NFC-normalised first (spec §4.2).

    Parameters:
        value: a JSON-native value (dict with string keys, list/tuple, str, int, float, bool, None).

    Returns:
        The canonical UTF-8 bytes.

    Raises:
        ValidationError: a value is not JSON (NaN, infinity, a set, a non-string key ...).
    """
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts).encode("utf-8")


def _write(value: Any, out: list[str]) -> None:
    if value is None or value is True or value is False:
        out.append("null" if value is None else "true" if value else "false")
    elif isinstance(value, str):
        out.append(json.dumps(unicodedata.normalize("NFC", value), ensure_ascii=False))
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_number(value))
    elif isinstance(value, Mapping):
        items: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationError(f"unique key: object keys must be strings, got {key!r}", field="unique")
            items[unicodedata.normalize("NFC", key)] = item
        out.append("{")
        # RFC 8785 sorts by UTF-16 code units.
        for index, key in enumerate(sorted(items, key=lambda k: k.encode("utf-16-be"))):
            if index:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _write(items[key], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise ValidationError(f"unique key: {type(value).__name__} is not a JSON value", field="unique")


def _number(value: float) -> str:
    """ECMAScript's Number.prototype.toString (RFC 8785 §3.2.2.3)."""
    if not math.isfinite(value):
        raise ValidationError(f"unique key: {value!r} is not a JSON number", field="unique")
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    # repr is the shortest round-trip form: take its digits and place the decimal point anew.
    digits, _, exponent_text = repr(abs(value)).partition("e")
    whole, _, fraction = digits.partition(".")
    all_digits = whole + fraction
    mantissa = all_digits.lstrip("0")
    n = len(whole) - (len(all_digits) - len(mantissa)) + int(exponent_text or 0)  # the point follows n digits
    mantissa = mantissa.rstrip("0") or "0"
    k = len(mantissa)
    sign = "-" if value < 0 else ""
    if k <= n <= 21:
        text = mantissa + "0" * (n - k)
    elif 0 < n <= 21:
        text = mantissa[:n] + "." + mantissa[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + mantissa
    else:
        exponent = n - 1
        text = (
            mantissa[0]
            + ("." + mantissa[1:] if k > 1 else "")
            + "e"
            + ("+" if exponent > 0 else "-")
            + str(abs(exponent))
        )
    return sign + text


__all__ = [
    "DEFAULT_KEYS",
    "DEFAULT_ON_CONFLICT",
    "DEFAULT_STATES",
    "canonical_json",
    "dimensions",
    "effective_keys",
    "effective_on_conflict",
    "effective_states",
    "job_unique_key",
    "period_end",
    "unique_key",
]
