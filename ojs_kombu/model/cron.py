"""Cron job definitions and cron expressions (``ojs-cron.md`` §2–5; DESIGN §20).

Pure data and validation, no broker and no clock: :class:`CronJob` is the spec's
registration (``name``, ``cron``, ``type``, ``args``, ``timezone``, ``options``,
``overlap_policy``, ``enabled``, ``description``), :class:`CronExpression` a parsed
``cron`` field, :func:`parse_timezone` the spec's time zone rule.  When a
definition fires is :mod:`ojs_kombu.policy.cron`'s business.

Expressions (spec §3–4): 5 fields, or 6 with seconds first, told apart by the
number of whitespace-separated tokens; ``*`` ``,`` ``-`` ``/`` in every field;
month and weekday names in any case; 0 and 7 are Sunday; ``L`` (day of month and
``5L`` in day of week), ``LW`` and ``#`` (``FRI#3``); the field grammar comes from
`cronsim`_, which matches Debian's cron.  The nearest-weekday form ``15W`` (Quartz's,
which cronsim lacks) is added here: one day of month followed by ``W``, with ``*`` as the
day of week, as Quartz requires.  The macros ``@yearly``,
``@annually``, ``@monthly``, ``@weekly``, ``@daily``, ``@midnight``, ``@hourly``
and ``@every <duration>`` (Go's units ``ms``, ``s``, ``m``, ``h``, combined:
``@every 1h30m``).

.. _cronsim: https://pypi.org/project/cronsim/

>>> CronExpression.parse("@daily").fields
'0 0 * * *'
>>> CronExpression.parse("@every 1h30m").interval
datetime.timedelta(seconds=5400)
"""

from __future__ import annotations

import calendar
import functools
import hashlib
import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, cast, get_args

from cronsim import CronSim, CronSimError

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.ids import uuid7
from ojs_kombu.model.job import Job
from ojs_kombu.model.jsonvalue import ensure_json_native
from ojs_kombu.model.naming import validate_job_type, validate_queue_name
from ojs_kombu.model.policies import RetryPolicy
from ojs_kombu.model.ratelimit import MAX_RATE_LIMIT_KEY_LENGTH, RateLimitPolicy

OverlapPolicy = Literal["skip", "allow", "cancel_previous", "enqueue"]
"""What a tick does while the previous run is still active (spec §6)."""

OVERLAP_POLICIES: tuple[str, ...] = get_args(OverlapPolicy)

CRON_NAME_PATTERN = r"^[a-z0-9][a-z0-9\-\.]*$"
"""A cron job's ``name`` (spec §2.2, CRON-02); at most :data:`MAX_CRON_NAME_LENGTH`."""
MAX_CRON_NAME_LENGTH = 255
CRON_NAME_RE = re.compile(CRON_NAME_PATTERN)

DEFAULT_TIMEZONE = "UTC"
"""The time zone of a definition that names none (spec §5.1, CRON-15)."""

ENQUEUE_LIMIT_PREFIX = "cron:"
"""The rate limit key of an ``enqueue`` cron job's occurrences starts with this, then its name."""

#: The spec's macros (§4) and the expressions they stand for.
MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

#: Fields the implementation maintains (spec §2.2): ignored when a client sends them (CRON-06).
SYSTEM_FIELDS = frozenset({"last_run_at", "next_run_at", "run_count", "created_at"})

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}
_FIELD_NAMES = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")
_FIELD_RANGES = ("0-59", "0-59", "0-23", "1-31", "1-12 or JAN-DEC", "0-7 or SUN-SAT")
_FIELD_EXTRAS = {"day-of-month": ", L, LW and 15W", "day-of-week": ", 5L and FRI#3"}
_NEAREST_WEEKDAY = re.compile(r"([0-9]{1,2})W", re.IGNORECASE)
# Days of month that some months lack: accepted, with a note (spec §3.5).
_SOMETIMES_MISSING_DAYS = re.compile(r"(?<![0-9#/-])(29|30|31)(?![0-9])")


def _parse_every(text: str) -> timedelta:
    """The interval of ``@every <duration>`` (``1h30m``, ``45s``, ``500ms``)."""
    pos, total_ms = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total_ms += float(match[1]) * _UNIT_MS[match[2]]
        pos = match.end()
    if not text or pos != len(text):
        raise ValidationError(
            f"cron: {'@every ' + text!r} is not a duration: use numbers with the units ms, s, m and h, "
            "combined without spaces (e.g. '@every 1h30m', '@every 45s')",
            field="cron",
        )
    if total_ms < 1:
        raise ValidationError(f"cron: '@every {text}' must be at least 1ms", field="cron")
    return timedelta(milliseconds=round(total_ms))


def _field_error(fields: list[str], problem: str) -> ValidationError:
    """Name the field cronsim refused (``Bad day-of-month``) with its allowed values."""
    names = _FIELD_NAMES if len(fields) == 6 else _FIELD_NAMES[1:]
    ranges = _FIELD_RANGES if len(fields) == 6 else _FIELD_RANGES[1:]
    for name, allowed, value in zip(names, ranges, fields, strict=True):
        if problem == f"Bad {name}":
            return ValidationError(
                f"cron: the {name} field {value!r} is invalid (allowed: {allowed} with * , - /"
                f"{_FIELD_EXTRAS.get(name, '')}; no step of 0)",
                field="cron",
            )
    return ValidationError(f"cron: {' '.join(fields)!r} is invalid: {problem}", field="cron")


@dataclass(frozen=True)
class CronExpression:
    """A valid ``cron`` field: either calendar ``fields`` (5 or 6) or an ``@every`` ``interval``.

    Build it with :meth:`parse`.  ``text`` is the expression as given; ``fields`` the
    calendar expression it stands for (a macro expanded, whitespace collapsed), or
    ``None`` for ``@every``; ``interval`` the ``@every`` period, else ``None``.
    ``warnings`` holds notes that do not make the expression invalid (spec §3.5: a
    day of month that some months lack).
    """

    text: str
    fields: str | None
    interval: timedelta | None
    warnings: tuple[str, ...] = field(default=(), compare=False)
    nearest_weekday: int | None = None
    """``N`` of a ``NW`` day of month (the weekday nearest to the Nth), else ``None``."""

    @property
    def has_seconds(self) -> bool:
        """Whether the expression has the sixth (seconds) field."""
        return self.fields is not None and len(self.fields.split()) == 6

    @property
    def matcher_fields(self) -> str | None:
        """:attr:`fields` as cronsim reads them: a ``NW`` day of month becomes the days it can fall on.

        The nearest weekday to the Nth is within two days of it; the caller keeps the one day
        :func:`nearest_weekday` names.
        """
        if self.fields is None or self.nearest_weekday is None:
            return self.fields
        parts = self.fields.split()
        day = self.nearest_weekday
        parts[-3] = f"{max(1, day - 2)}-{min(31, day + 2)}"
        return " ".join(parts)

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        """Validate a ``cron`` field (spec §3.5, CRON-03, CRON-08 to CRON-12).

        Parameters:
            text: a 5- or 6-field expression, a macro (``@daily``) or ``@every <duration>``.

        Returns:
            The parsed expression.

        Raises:
            ValidationError: ``field="cron"``: not a string, empty, a value out of range,
                a malformed range or step, a step of 0, a day of month no month has, an
                unknown macro or duration.
        """
        if not isinstance(text, str):
            raise ValidationError(f"cron must be a string, got {type(text).__name__}", field="cron")
        stripped = text.strip()
        if not stripped:
            raise ValidationError("cron: the expression is empty", field="cron")
        if stripped.startswith("@"):
            head, _, rest = stripped.partition(" ")
            lowered = head.lower()
            if lowered == "@every":
                return cls(text, None, _parse_every(rest.strip()))
            if lowered in MACROS and not rest.strip():
                return cls(text, MACROS[lowered], None)
            raise ValidationError(
                f"cron: unknown special expression {stripped!r}; known: {', '.join(MACROS)}, @every <duration>",
                field="cron",
            )
        fields = stripped.split()
        if len(fields) not in (5, 6):
            raise ValidationError(
                f"cron: {stripped!r} has {len(fields)} fields; use 5 (minute hour day-of-month month "
                "day-of-week) or 6 (second first)",
                field="cron",
            )
        normalized = " ".join(fields)
        nearest = _parse_nearest_weekday(fields)
        expression = cls(text, normalized, None, nearest_weekday=nearest)
        try:
            CronSim(expression.matcher_fields or normalized, datetime(2000, 1, 1))
        except CronSimError as exc:
            raise _field_error(fields, str(exc)) from None
        except (ValueError, IndexError) as exc:  # a malformed term cronsim does not diagnose itself
            raise ValidationError(f"cron: {normalized!r} is malformed ({exc})", field="cron") from None
        day_of_month = fields[-3]
        warnings: tuple[str, ...] = ()
        if _SOMETIMES_MISSING_DAYS.search(day_of_month):
            warnings = (f"day of month {day_of_month!r}: the job does not fire in months without that day",)
        return cls(text, normalized, None, warnings, nearest)


def _parse_nearest_weekday(fields: list[str]) -> int | None:
    """``N`` of a ``NW`` day-of-month field; None for any other field.

    Raises:
        ValidationError: ``W`` anywhere but alone after one day (``1-5W``, ``1,15W``), a day out of
            1–31, or a day of week other than ``*`` with it.
    """
    day_of_month = fields[-3]
    if "W" not in day_of_month.upper() or day_of_month.upper() == "LW":
        return None
    match = _NEAREST_WEEKDAY.fullmatch(day_of_month)
    if match is None or not 1 <= int(match[1]) <= 31:
        raise ValidationError(
            f"cron: the day-of-month field {day_of_month!r} is invalid: W follows a single day of month "
            "(15W: the weekday nearest to the 15th), or L (LW: the last weekday)",
            field="cron",
        )
    if fields[-1] != "*":
        raise ValidationError(f"cron: {day_of_month!r} needs '*' as the day of week (got {fields[-1]!r})", field="cron")
    return int(match[1])


def nearest_weekday(year: int, month: int, day: int) -> int | None:
    """The day of ``month`` that ``dayW`` means (Quartz): the weekday nearest to ``day``, in the same month.

    A Saturday moves to the Friday before, a Sunday to the Monday after, but never into another
    month: ``1W`` on a Saturday is Monday the 3rd, ``31W`` on a Sunday is Friday the 29th.

    Parameters:
        year, month: the month.
        day: the ``N`` of ``NW``.

    Returns:
        The day of month, or ``None`` when the month has no such day (``31W`` in April).
    """
    last = calendar.monthrange(year, month)[1]
    if day > last:
        return None
    weekday = calendar.weekday(year, month, day)  # Monday 0 ... Sunday 6
    if weekday == 5:  # Saturday
        return day - 1 if day > 1 else day + 2
    if weekday == 6:  # Sunday
        return day + 1 if day < last else day - 2
    return day


@functools.cache
def _iana_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def parse_timezone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone ``name`` (spec §5.1, CRON-13, CRON-14).

    Accepted: ``UTC`` and ``Area/Location`` names of the tz database (``America/New_York``,
    links such as ``US/Eastern`` too).  Refused: fixed offsets (``+05:00``, ``UTC+5``,
    ``Etc/GMT+5``), abbreviations (``EST``, ``PST``, ``CET``), POSIX rules (``EST5EDT``)
    and unknown names.

    Parameters:
        name: the ``timezone`` field.

    Returns:
        The zone.

    Raises:
        ValidationError: ``field="timezone"``.
    """
    if not isinstance(name, str):
        raise ValidationError(f"timezone must be a string, got {type(name).__name__}", field="timezone")
    iana_location = "/" in name and not name.startswith("Etc/") or name in ("UTC", "Etc/UTC")
    if not iana_location or name not in _iana_names() and name != "UTC":
        raise ValidationError(
            f"timezone {name!r} is not an IANA time zone name: use a name such as 'America/New_York' or "
            "'UTC'; fixed offsets and abbreviations (EST, +05:00) do not follow daylight saving time",
            field="timezone",
        )
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValidationError(f"timezone {name!r} is not in this machine's tz database", field="timezone") from None


def _check_options(options: Any) -> dict[str, Any]:
    if not isinstance(options, Mapping):
        raise ValidationError(f"options must be an object, got {type(options).__name__}", field="options")
    result = dict(options)
    ensure_json_native(result, "options")
    if "queue" in result:
        try:
            validate_queue_name(result["queue"])
        except ValidationError as exc:
            raise ValidationError(f"options.{exc}", field="options.queue") from None
    timeout = result.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0):
        raise ValidationError(
            f"options.timeout must be a positive integer of seconds, got {timeout!r}", field="options.timeout"
        )
    tags = result.get("tags")
    if tags is not None and (not isinstance(tags, list) or not all(isinstance(t, str) for t in tags)):
        raise ValidationError("options.tags must be an array of strings", field="options.tags")
    meta = result.get("meta")
    if meta is not None and not isinstance(meta, Mapping):
        raise ValidationError("options.meta must be an object", field="options.meta")
    if "retry" in result:
        try:
            RetryPolicy.model_validate(result["retry"])
        except ValidationError as exc:
            path = f"options.retry.{exc.field}" if exc.field else "options.retry"
            raise ValidationError(f"options.retry: {exc}", field=path) from None
    if "rate_limit" in result:
        try:
            RateLimitPolicy.model_validate(result["rate_limit"])
        except ValidationError as exc:
            path = f"options.rate_limit.{exc.field}" if exc.field else "options.rate_limit"
            raise ValidationError(f"options.rate_limit: {exc}", field=path) from None
    return result


def enqueue_limit_key(name: str) -> str:
    """The rate limit key that keeps the occurrences of the ``enqueue`` cron job ``name`` one at a time.

    ``cron:{name}``; a name too long for a key (over 155 characters) is cut and ends with a
    digest of the whole name, so two long names never share a key.

    Parameters:
        name: the cron job's name (valid, CRON-02).

    Returns:
        A key matching :data:`~ojs_kombu.model.ratelimit.RATE_LIMIT_KEY_PATTERN`.
    """
    key = ENQUEUE_LIMIT_PREFIX + name
    if len(key) <= MAX_RATE_LIMIT_KEY_LENGTH:
        return key
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]
    return f"{key[: MAX_RATE_LIMIT_KEY_LENGTH - len(digest) - 1]}:{digest}"


@dataclass(frozen=True)
class CronJob:
    """A cron job registration (spec §2): what to enqueue, and when.

    Parameters:
        name: unique key, ``[a-z0-9][a-z0-9\\-.]*``, at most 255 characters (CRON-02).
        cron: the expression (a 5- or 6-field expression, a macro or ``@every``).
        type: the OJS job type each occurrence enqueues (CRON-04).
        args: the job's arguments, JSON-native (CRON-05); a tuple is kept as a list.
        timezone: IANA name the expression is read in (default ``"UTC"``).
        options: the job's options (``queue``, ``timeout``, ``retry``, ``tags``, ``meta``,
            ``rate_limit``: a :class:`~ojs_kombu.model.ratelimit.RateLimitPolicy` object).
        overlap_policy: ``skip`` (default), ``allow``, ``cancel_previous`` or ``enqueue`` (its
            occurrences run one at a time: see :attr:`rate_limit`).
        enabled: a disabled job stays registered and does not fire.
        description: free text, or ``None``.

    Raises:
        ValidationError: naming the field (``name``, ``cron``, ``type``, ``args``,
            ``timezone``, ``options…``, ``overlap_policy``, ``enabled``, ``description``).
    """

    name: str
    cron: str
    type: str
    args: list[Any] = field(default_factory=list)
    timezone: str = DEFAULT_TIMEZONE
    options: dict[str, Any] = field(default_factory=dict)
    overlap_policy: OverlapPolicy = "skip"
    enabled: bool = True
    description: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ValidationError(f"name must be a string, got {type(self.name).__name__}", field="name")
        if len(self.name) > MAX_CRON_NAME_LENGTH or CRON_NAME_RE.fullmatch(self.name) is None:
            raise ValidationError(
                f"name {self.name[:80]!r} is invalid: use lowercase letters, digits, '-' and '.', starting with a "
                f"letter or digit (e.g. 'daily-report'), at most {MAX_CRON_NAME_LENGTH} characters",
                field="name",
            )
        CronExpression.parse(self.cron)
        validate_job_type(self.type)
        if isinstance(self.args, tuple):
            object.__setattr__(self, "args", list(self.args))
        if not isinstance(self.args, list):
            raise ValidationError(f"args must be a JSON array, got {type(self.args).__name__}", field="args")
        ensure_json_native(self.args, "args")
        parse_timezone(self.timezone)
        object.__setattr__(self, "options", _check_options(self.options))
        if self.overlap_policy not in OVERLAP_POLICIES:
            raise ValidationError(
                f"overlap_policy {self.overlap_policy!r} is unknown; use one of {', '.join(OVERLAP_POLICIES)}",
                field="overlap_policy",
            )
        own = self.options.get("rate_limit")
        if self.overlap_policy == "enqueue" and own is not None:
            policy = RateLimitPolicy.model_validate(own)
            if policy.concurrency != 1 or policy.lossy:
                raise ValidationError(
                    "overlap_policy 'enqueue' runs one occurrence at a time, so options.rate_limit must have "
                    f"concurrency 1 and on_limit 'wait' or 'reschedule' (got concurrency {policy.concurrency!r}, "
                    f"on_limit {policy.action!r}); leave it out to limit the occurrences by the cron job's name",
                    field="options.rate_limit",
                )
        if not isinstance(self.enabled, bool):
            raise ValidationError(f"enabled must be true or false, got {self.enabled!r}", field="enabled")
        if self.description is not None and not isinstance(self.description, str):
            raise ValidationError("description must be a string or null", field="description")

    @property
    def expression(self) -> CronExpression:
        """The parsed :attr:`cron`."""
        return CronExpression.parse(self.cron)

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        """The parsed :attr:`timezone`."""
        return parse_timezone(self.timezone)

    @property
    def queue(self) -> str:
        """The queue each occurrence goes to: ``options["queue"]``, default ``"default"`` (spec §2.2)."""
        return cast(str, self.options.get("queue", "default"))

    @property
    def rate_limit(self) -> RateLimitPolicy | None:
        """The ``rate_limit`` of each occurrence's job: ``options["rate_limit"]`` when set, else for
        ``enqueue`` a concurrency of 1 keyed :func:`enqueue_limit_key` (on_limit ``wait``), else ``None``.

        A job carries one policy.  For ``enqueue``, a policy of the options must have concurrency 1
        (checked at registration), so it keeps the occurrences one at a time too, and it wins: its
        key may deliberately be shared with other jobs (e.g. one migration at a time, whichever cron
        job or client enqueued it).
        """
        own = self.options.get("rate_limit")
        if own is not None:
            return RateLimitPolicy.model_validate(own)
        if self.overlap_policy == "enqueue":
            return RateLimitPolicy(key=enqueue_limit_key(self.name), concurrency=1, on_limit="wait")
        return None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CronJob:
        """A definition from its JSON object (spec §2.1); system-managed fields are ignored (CRON-06).

        Parameters:
            data: the object, as a registration request or a stored record carries it.

        Returns:
            The definition.

        Raises:
            ValidationError: not an object, a required field missing, an unknown field, or
                any field invalid (see the class).
        """
        if not isinstance(data, Mapping):
            raise ValidationError(f"a cron job must be an object, got {type(data).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known - SYSTEM_FIELDS)
        if unknown:
            raise ValidationError(f"unknown cron job field(s): {', '.join(unknown)}", field=unknown[0])
        for required in ("name", "cron", "type"):
            if required not in data:
                raise ValidationError(f"{required} is required", field=required)
        values = {k: v for k, v in data.items() if k in known}
        if values.get("timezone") is None:
            values.pop("timezone", None)
        if values.get("options") is None:
            values.pop("options", None)
        if values.get("args") is None:
            values.pop("args", None)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of spec §2.1 (without the system-managed fields)."""
        return {
            "name": self.name,
            "cron": self.cron,
            "timezone": self.timezone,
            "type": self.type,
            "args": list(self.args),
            "options": dict(self.options),
            "overlap_policy": self.overlap_policy,
            "enabled": self.enabled,
            "description": self.description,
        }


def tick_job_id(name: str, scheduled_time: datetime) -> str:
    """The job id of one occurrence of a cron job: the same for every scheduler (DESIGN §20).

    A UUIDv7 (the id format OJS requires) whose 48-bit timestamp is ``scheduled_time`` in
    milliseconds since the epoch and whose 74 "random" bits (``rand_a``, ``rand_b``) are the
    first bits of SHA-256 of ``name``.  Two leaders overlapping for a moment publish the same
    id for the same tick, so a unique lock or a deduplicating worker drops the second; ids of
    one cron job sort by their scheduled time, as UUIDv7 ids do.

    Parameters:
        name: the cron job's name.
        scheduled_time: the occurrence's scheduled time (aware).

    Returns:
        A lowercase UUIDv7.

    Raises:
        ValidationError: a naive ``scheduled_time`` or one before 1970.

    >>> tick_job_id("daily-report", datetime(2026, 2, 12, 14, tzinfo=zoneinfo.ZoneInfo("UTC")))
    '019c5226-cb00-746f-b0bd-726d98dcd7d4'
    """
    if not isinstance(scheduled_time, datetime) or scheduled_time.utcoffset() is None:
        raise ValidationError(
            f"scheduled_time must be an aware datetime, got {scheduled_time!r}", field="scheduled_time"
        )
    unix_ms = (scheduled_time - datetime(1970, 1, 1, tzinfo=zoneinfo.ZoneInfo("UTC"))) // timedelta(milliseconds=1)
    if unix_ms < 0:
        raise ValidationError("scheduled_time must not be before 1970", field="scheduled_time")
    digest = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:10], "big")  # 80 bits, 74 used
    return uuid7(unix_ms, digest >> 62, digest)


def job_options(job: Job) -> dict[str, Any]:
    """The cron ``options`` whose ticks are copies of ``job``: its queue, ``meta``, retry policy, timeout and tags.

    How a framework adapter turns one of its task messages into a cron template: it builds the
    job it would publish (``type`` and ``args`` go to the definition's own fields), and each
    tick is that job with a derived id and ``meta.cron_name`` / ``meta.cron_triggered_at``
    added.  Envelope fields a cron's ``options`` do not carry (``priority``, ``scheduled_at``,
    ``expires_at``) are left out: the caller decides whether to refuse them.

    Parameters:
        job: the job each tick should be.

    Returns:
        The ``options`` object (``queue`` always; ``meta``, ``retry``, ``timeout``, ``tags`` when set).
    """
    options: dict[str, Any] = {"queue": job.queue}
    meta = {k: v for k, v in (job.meta or {}).items() if k != "tags"}
    if meta:
        options["meta"] = meta
    if job.retry is not None:
        options["retry"] = job.retry.model_dump(mode="json", exclude_none=True)
    if job.timeout is not None:
        options["timeout"] = job.timeout
    tags = (job.meta or {}).get("tags")
    if tags:
        options["tags"] = list(tags)
    return options


__all__ = [
    "CRON_NAME_PATTERN",
    "DEFAULT_TIMEZONE",
    "ENQUEUE_LIMIT_PREFIX",
    "MACROS",
    "MAX_CRON_NAME_LENGTH",
    "OVERLAP_POLICIES",
    "SYSTEM_FIELDS",
    "CronExpression",
    "CronJob",
    "OverlapPolicy",
    "enqueue_limit_key",
    "job_options",
    "nearest_weekday",
    "parse_timezone",
    "tick_job_id",
]
