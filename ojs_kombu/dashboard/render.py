"""How the dashboard's pages show values: what a user reads, never a Python ``repr``.

* :func:`show`: None is "–" (as in the CLI), a boolean "yes" / "no", a time as :func:`when`, a dict its ``key: value`` pairs.
* :func:`when`: a time as the CLI prints it (RFC 3339 UTC with ``Z``,
  :func:`~ojs_kombu.model.timefmt.format_timestamp`) with its relative age ("3 min ago", "in 20 s").
* :func:`error_runs`: a job's ``errors[]`` split at its last replay, so that the errors from before
  the replay say so.

Pure functions (no Starlette): the Jinja filters of :mod:`ojs_kombu.dashboard.app`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from markupsafe import Markup, escape

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.timefmt import format_timestamp, parse_timestamp, utcnow

#: What a page shows for an absent or unknown value (the CLI's ``cli.common.MISSING``).
NONE = "–"

_UNITS = ((86_400, "d"), (3_600, "h"), (60, "min"), (1, "s"))


def age(then: datetime, now: datetime | None = None) -> str:
    """How long ago ``then`` was, in its largest whole unit: "just now", "42 s ago", "3 min ago",
    "2 h ago", "5 d ago"; a future time reads "in 3 min".

    Parameters:
        then: an aware datetime.
        now: the present (default: now).

    Returns:
        The relative age.
    """
    seconds = ((now or utcnow()) - then).total_seconds()
    ahead, seconds = seconds < 0, abs(seconds)
    if seconds < 1:
        return "just now"
    for size, unit in _UNITS:
        if seconds >= size:
            text = f"{int(seconds // size)} {unit}"
            return f"in {text}" if ahead else f"{text} ago"
    raise AssertionError("unreachable: every duration of 1 s or more has a unit")


def _instant(value: datetime | str) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.utcoffset() is not None else None
    try:
        return parse_timestamp(value)
    except ValidationError:
        return None


def when(value: datetime | str | None, now: datetime | None = None) -> Markup:
    """A time as the CLI prints it, with its age: ``<time datetime="…Z">…Z</time> <span class="age">3 min
    ago</span>``; None (or a text that is no RFC 3339 time) as :data:`NONE` (or the text).

    Parameters:
        value: an aware datetime, an RFC 3339 string, or None.
        now: the present the age is counted from (default: now).

    Returns:
        Safe markup.
    """
    if value is None:
        return Markup(NONE)
    instant = _instant(value)
    if instant is None:
        return escape(str(value))
    stamp = format_timestamp(instant)
    return Markup('<time datetime="{0}">{0}</time> <span class="age">{1}</span>').format(stamp, age(instant, now))


def show(value: Any, now: datetime | None = None) -> Markup:
    """Any value of a page as a user reads it (see the module docstring); lists joined with ", ",
    dicts as ``key: value`` pairs, anything else its ``str``.

    Parameters:
        value: the value.
        now: the present for the age of a time.

    Returns:
        Safe markup.
    """
    if value is None:
        return Markup(NONE)
    if isinstance(value, bool):
        return Markup("yes" if value else "no")
    if isinstance(value, datetime):
        return when(value, now)
    if isinstance(value, Mapping):
        return Markup(" · ").join(Markup("{}: {}").format(k, show(v, now)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return Markup(", ").join(show(v, now) for v in value) if value else Markup(NONE)
    return escape(str(value))


def queue_state(paused: bool | None) -> str:
    """A queue's pause state: "paused", "running", or :data:`NONE` when unknown.

    Parameters:
        paused: whether its workers are paused (None: unknown).

    Returns:
        The text.
    """
    return NONE if paused is None else "paused" if paused else "running"


def describe_error(error: Any) -> Markup:
    """An error object (INFO's ``error``, an ``errors[]`` item, any dict) as "code: message", its other
    fields after it (``attempt``, ``occurred_at`` as a time, the rest as JSON); anything else via :func:`show`.

    Parameters:
        error: the error.

    Returns:
        Safe markup.
    """
    if not isinstance(error, Mapping):
        return show(error)
    rest = dict(error)
    code, message = rest.pop("code", None) or rest.pop("type", None), rest.pop("message", None)
    head = Markup(": ").join(escape(str(p)) for p in (code, message) if p not in (None, ""))
    parts = [Markup('<span class="error-text">{}</span>').format(head)] if head else []
    if "attempt" in rest:
        parts.append(Markup("attempt {}").format(rest.pop("attempt")))
    if "occurred_at" in rest:
        parts.append(when(rest.pop("occurred_at")))
    parts += [Markup("{}: {}").format(k, v if isinstance(v, str) else json.dumps(v)) for k, v in rest.items()]
    return Markup(" · ").join(parts) if parts else Markup(NONE)


@dataclass
class ErrorRun:
    """The errors of one run of a job: before its last replay (``replayed_at`` set) or since."""

    errors: list[Any] = field(default_factory=list)
    replayed_at: datetime | None = None


def error_runs(errors: Sequence[Any] | None, meta: Mapping[str, Any] | None) -> list[ErrorRun]:
    """``errors`` (a job's ``errors[]``) split at its last replay (``meta["ojs.last_replayed_at"]``, set by
    :func:`~ojs_kombu.runtime.deadletter.replayable`): first the errors that occurred before it (their
    run's ``replayed_at`` is the replay's time), then the ones since.  Without a replay time, or for an
    error without a readable ``occurred_at`` after one, the errors are kept in order in one run.

    Parameters:
        errors: the job's ``errors[]`` (None: none).
        meta: the job's ``meta`` (None: none).

    Returns:
        The non-empty runs, oldest first.
    """
    errors = list(errors or ())
    raw = (meta or {}).get("ojs.last_replayed_at")
    replayed = _instant(raw) if isinstance(raw, str | datetime) else None
    if replayed is None:
        return [ErrorRun(errors)] if errors else []
    before, since = ErrorRun(replayed_at=replayed), ErrorRun()
    for error in errors:
        at = error.get("occurred_at") if isinstance(error, Mapping) else None
        instant = _instant(at) if isinstance(at, str | datetime) else None
        (before if instant is not None and instant < replayed and not since.errors else since).errors.append(error)
    return [run for run in (before, since) if run.errors]


__all__ = ["NONE", "ErrorRun", "age", "describe_error", "error_runs", "queue_state", "show", "when"]
