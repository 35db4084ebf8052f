"""Timestamps and durations as the OJS envelope writes them.

Timestamps are RFC 3339 strings in UTC with milliseconds and ``Z``
(``2026-02-15T10:30:00.000Z``); a timestamp or datetime without a timezone is
refused, its instant is unknown.  Durations are the ISO 8601 forms the schema
allows, without years and months (``PT1.5S``, ``PT5M``, ``P1DT2H``, ``P2W``).
Bad input raises :class:`ojs_kombu.errors.ValidationError`.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from ojs_kombu.errors import ValidationError
from ojs_kombu.model._problems import Problem, public_error

_RFC3339_RE = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_NO_TZ_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?")
# The schema's duration pattern, with groups.  Fullmatch only: `$` would accept a trailing newline.
_DURATION_RE = re.compile(
    r"P(?:([0-9]+)Y)?(?:([0-9]+)M)?(?:([0-9]+)W)?(?:([0-9]+)D)?"
    r"(?:T(?:([0-9]+)H)?(?:([0-9]+)M)?(?:([0-9]+(?:\.[0-9]+)?)S)?)?"
)


def utcnow() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(UTC)


def _format_ts(dt: datetime) -> str:
    if dt.tzinfo is not UTC:
        dt = dt.astimezone(UTC)
    return dt.isoformat(timespec="milliseconds")[:-6] + "Z"


def _aware(value: Any) -> datetime:
    if not isinstance(value, datetime):
        raise Problem(f"expected a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise Problem(
            f"naive datetime {value.isoformat()} has no timezone; pass an aware datetime "
            "such as datetime.now(timezone.utc)"
        )
    return value


def format_timestamp(dt: datetime) -> str:
    """Format an aware datetime as OJS emits it: RFC 3339, UTC, milliseconds, ``Z``.

    ``format_timestamp(datetime(2026, 2, 15, 10, 30, tzinfo=timezone.utc))`` is
    ``"2026-02-15T10:30:00.000Z"``.  Sub-millisecond digits are truncated.  A naive
    datetime raises :class:`ValidationError`: its instant is unknown.
    """
    try:
        return _format_ts(_aware(dt))
    except Problem as problem:
        raise public_error(problem, None) from None


def _timestamp(value: Any) -> datetime:
    if type(value) is str:  # a subclass may redefine equality: never looked up in the memo
        return _parsed(value)
    if not isinstance(value, str):
        raise Problem(f"expected an RFC 3339 timestamp string, got {type(value).__name__}")
    return _parse(value)


def _parse(value: str) -> datetime:
    if _RFC3339_RE.fullmatch(value) is None:
        if _NO_TZ_RE.fullmatch(value):
            raise Problem(f"timestamp {value!r} has no timezone; OJS requires one (e.g. '2026-02-15T10:30:00Z')")
        raise Problem(f"{value!r} is not an RFC 3339 timestamp (e.g. '2026-02-15T10:30:00.000Z')")
    try:
        return datetime.fromisoformat(value.upper())
    except ValueError as exc:
        raise Problem(f"{value!r} is not a valid date and time: {exc}") from None


#: Valid timestamps already parsed (a refused one raises, and is not kept).  A consumer reads
#: each job's ``created_at``, its ``enqueued_at`` (the same text, for a job of ``Job.create``)
#: and the same ``enqueued_at`` again for the job metrics; the jobs of one producer's
#: millisecond share them all.  Datetimes are immutable, so sharing one is safe.
_parsed = functools.lru_cache(maxsize=1024)(_parse)


def parse_timestamp(s: str) -> datetime:
    """Parse an RFC 3339 timestamp into an aware datetime.

    A timestamp without a timezone (``"2026-02-15T10:30:00"``) is refused with
    :class:`ValidationError`, as ojs-json-format requires.
    """
    try:
        return _timestamp(s)
    except Problem as problem:
        raise public_error(problem, None) from None


def _check_timestamp(value: Any) -> Any:
    _timestamp(value)
    return value


# -- durations ------------------------------------------------------------------------------------


def _duration_groups(value: Any) -> tuple[str | None, ...]:
    if not isinstance(value, str):
        raise Problem(
            f"expected an ISO 8601 duration string such as 'PT30S' or a timedelta, got {type(value).__name__}"
        )
    match = _DURATION_RE.fullmatch(value)
    # The schema pattern also admits "P", "PT" and "P1DT"; ISO 8601 does not.
    if match is None or value[-1] in "PT":
        raise Problem(f"{value!r} is not an ISO 8601 duration (e.g. 'PT1S', 'PT1.5S', 'PT5M', 'P1DT2H')")
    return match.groups()


def _duration(value: Any) -> timedelta:
    years, months, weeks, days, hours, minutes, seconds = _duration_groups(value)
    if (years and int(years)) or (months and int(months)):
        raise Problem(
            f"duration {value!r} uses years or months, which have no fixed length; "
            "use weeks, days, hours, minutes or seconds (e.g. 'P30D')"
        )
    try:
        return timedelta(
            weeks=int(weeks or 0),
            days=int(days or 0),
            hours=int(hours or 0),
            minutes=int(minutes or 0),
            seconds=float(seconds) if seconds else 0,
        )
    except OverflowError:
        raise Problem(f"duration {value!r} is too long") from None


def parse_duration(s: str) -> timedelta:
    """Parse an ISO 8601 duration of the forms the schema allows into a timedelta.

    Weeks, days, hours, minutes and (fractional) seconds are supported:
    ``"PT1.5S"``, ``"PT5M"``, ``"P1DT2H"``, ``"P2W"``.  Years and months are
    refused (they have no fixed length), as are ``"P"``/``"PT"`` with no component.
    """
    try:
        return _duration(s)
    except Problem as problem:
        raise public_error(problem, None) from None


def _format_duration(td: timedelta) -> str:
    if td < timedelta(0):
        raise Problem(f"duration must not be negative, got {td!r}")
    micros = (td.days * 86_400 + td.seconds) * 1_000_000 + td.microseconds
    days, micros = divmod(micros, 86_400_000_000)
    hours, micros = divmod(micros, 3_600_000_000)
    minutes, micros = divmod(micros, 60_000_000)
    seconds, micros = divmod(micros, 1_000_000)
    time_part = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if micros:
        time_part += f"{seconds}.{micros:06d}".rstrip("0") + "S"
    elif seconds:
        time_part += f"{seconds}S"
    text = "P" + (f"{days}D" if days else "") + (f"T{time_part}" if time_part else "")
    return text if text != "P" else "PT0S"


def format_duration(td: timedelta) -> str:
    """Format a non-negative timedelta as an ISO 8601 duration.

    ``PT1S``, ``PT1.5S``, ``PT5M``, ``P1DT2H``; zero is ``PT0S``.  Days are never
    folded into weeks.
    """
    if not isinstance(td, timedelta):
        raise ValidationError(f"expected a timedelta, got {type(td).__name__}")
    try:
        return _format_duration(td)
    except Problem as problem:
        raise public_error(problem, None) from None


def _duration_input(value: Any) -> Any:
    """Before-validator of duration fields: a timedelta becomes its ISO string."""
    if isinstance(value, timedelta):
        return _format_duration(value)
    if value is not None and not isinstance(value, str):
        _duration_groups(value)  # raises, naming the accepted forms
    return value


__all__ = ["format_duration", "format_timestamp", "parse_duration", "parse_timestamp", "utcnow"]
