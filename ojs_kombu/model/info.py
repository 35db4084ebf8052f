"""What a worker knows about one job: the answer to INFO (binding §5.8, AMQP-021; DESIGN §14).

A :class:`JobInfo` is the JSON body of an INFO reply::

    {"job_id": "…", "queue": "email", "type": "email.send", "state": "active",
     "worker_id": "host.4242.a1b2c3", "attempt": 1,
     "started_at": "2026-11-24T14:00:00.000Z", "finished_at": null, "error": null}

``state`` is one of :data:`JobState`:

=============  =======================================================================
state          meaning (as seen by the answering worker)
=============  =======================================================================
``active``     a handler is running it now (``finished_at`` is null)
``completed``  the handler returned; the job was acked
``retryable``  the attempt failed and the job waits in a retry queue for its next one
``discarded``  the attempt failed for good (dead letter queue, or dropped), or the job
               expired before it ran
``cancelled``  cancelled (``Client.cancel``): dropped on delivery or stopped while running
=============  =======================================================================

``attempt`` is the 1-based execution the state is about; ``started_at`` is null
for a job this worker never started (cancelled or expired on delivery, or a
redelivery counted as a lost attempt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.timefmt import format_timestamp, parse_timestamp

JobState = Literal["active", "completed", "retryable", "discarded", "cancelled"]
"""The state of a job in an INFO reply."""

JOB_STATES: tuple[str, ...] = get_args(JobState)

_STRINGS = ("job_id", "queue", "type", "worker_id")


@dataclass(frozen=True, slots=True)
class JobInfo:
    """One worker's knowledge of one job (the body of an INFO reply).

    Parameters:
        job_id: the job's id (lowercase).
        queue: its OJS queue.
        type: its job type.
        state: see :data:`JobState`.
        worker_id: the worker that answered.
        attempt: the 1-based execution the state is about.
        started_at: when that execution started (aware UTC), or None if this worker never started it.
        finished_at: when it ended; None while ``active``.
        error: for a failed attempt, ``{"code", "type", "message"}``.

    Raises:
        ValidationError: a field has the wrong type, or ``state`` is unknown.
    """

    job_id: str
    queue: str
    type: str
    state: JobState
    worker_id: str
    attempt: int
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in _STRINGS:
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValidationError(f"{name} must be a non-empty string, got {value!r}", field=name)
        if self.state not in JOB_STATES:
            raise ValidationError(f"state must be one of {', '.join(JOB_STATES)}, got {self.state!r}", field="state")
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or self.attempt < 0:
            raise ValidationError(f"attempt must be an integer >= 0, got {self.attempt!r}", field="attempt")
        for name in ("started_at", "finished_at"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
                raise ValidationError(f"{name} must be an aware datetime or None, got {value!r}", field=name)
        if self.error is not None and not isinstance(self.error, dict):
            raise ValidationError(f"error must be an object or None, got {self.error!r}", field="error")

    @property
    def finished(self) -> bool:
        """Whether the job is no longer running here."""
        return self.state != "active"

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this info (timestamps as RFC 3339 UTC strings, absent ones as null)."""
        return {
            "job_id": self.job_id,
            "queue": self.queue,
            "type": self.type,
            "state": self.state,
            "worker_id": self.worker_id,
            "attempt": self.attempt,
            "started_at": format_timestamp(self.started_at) if self.started_at is not None else None,
            "finished_at": format_timestamp(self.finished_at) if self.finished_at is not None else None,
            "error": self.error,
        }

    def to_json(self) -> str:
        """This info as compact JSON."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: Any) -> JobInfo:
        """Read the JSON object of an info; unknown keys are ignored (newer workers may add some).

        Raises:
            ValidationError: ``data`` is not an object, or a field is missing or malformed.
        """
        if not isinstance(data, dict):
            raise ValidationError(f"a job info must be a JSON object, got {type(data).__name__}")
        missing = [name for name in (*_STRINGS, "state", "attempt") if name not in data]
        if missing:
            raise ValidationError(f"a job info needs {', '.join(missing)}", field=missing[0])
        times: dict[str, datetime | None] = {}
        for name in ("started_at", "finished_at"):
            value = data.get(name)
            if value is not None and not isinstance(value, str):
                raise ValidationError(f"{name} must be an RFC 3339 string or null, got {value!r}", field=name)
            times[name] = parse_timestamp(value) if value is not None else None
        return cls(
            job_id=data["job_id"],
            queue=data["queue"],
            type=data["type"],
            state=data["state"],
            worker_id=data["worker_id"],
            attempt=data["attempt"],
            started_at=times["started_at"],
            finished_at=times["finished_at"],
            error=data.get("error"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> JobInfo:
        """Read an info from JSON.

        Raises:
            ValidationError: not JSON, or not a valid info (see :meth:`from_dict`).
        """
        try:
            data = json.loads(text)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ValidationError(f"a job info is not JSON: {exc}") from None
        return cls.from_dict(data)


__all__ = ["JOB_STATES", "JobInfo", "JobState"]
