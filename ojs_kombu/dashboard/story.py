"""A job's story: the timeline of its job page, from its events, its dead letter and INFO.

What each source gives:

* the events stream (:class:`~ojs_kombu.dashboard.stats.EventHistory`): each attempt's start (which
  worker), failure (its error), retry, and the end (completed, dead-lettered, cancelled, expired); a
  ``started`` event also carries when the job was enqueued and the time it was scheduled for.  A
  replay is seen as a first attempt starting again after the job ended (the replay re-enqueues it).
* the dead letter: the final failure (:class:`~ojs_kombu.runtime.deadletter.DeadLetterEntry`), the
  job's ``errors[]`` with their backtraces (an event carries no backtrace), when it was replayed
  before (``meta["ojs.last_replayed_at"]``) and, when the workers emitted no events, its failures.
* INFO: the attempt a worker runs now, or its outcome, when no event says so.

Pure: tested without a broker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.timefmt import parse_timestamp
from ojs_kombu.runtime.deadletter import DeadLetterEntry
from ojs_kombu.wire.events import JobEventRecord

_ENDS = ("succeeded", "dead-lettered", "cancelled", "expired")
_TITLES = {
    "enqueued": "enqueued",
    "scheduled": "scheduled for",
    "replayed": "replayed",
    "started": "started",
    "failed": "failed",
    "retried": "retry scheduled",
    "succeeded": "completed",
    "dead-lettered": "dead-lettered",
    "cancelled": "cancelled",
    "expired": "expired",
    "discarded": "discarded",
    "completed": "completed",
    "active": "running",
}


@dataclass
class Step:
    """One entry of a job's timeline.

    Parameters:
        kind: ``enqueued``, ``scheduled``, ``replayed``, ``started``, ``failed``, ``retried``,
            ``succeeded``, ``dead-lettered``, ``cancelled``, ``expired`` (or an INFO state).
        at: when (None: unknown, listed last).
        attempt: the attempt it is about, when one.
        worker: the worker, when known.
        error: the failure (``code``/``type``/``message``), when one.
        backtrace: the failure's backtrace lines (from the dead letter's ``errors[]``).
        note: what else to say (a retry's delay, the source when not an event).
        source: ``event``, ``dead letter``, ``info`` or ``dashboard``.
    """

    kind: str
    at: datetime | None
    attempt: int | None = None
    worker: str | None = None
    error: Mapping[str, Any] | None = None
    backtrace: list[str] = field(default_factory=list)
    note: str = ""
    source: str = "event"

    @property
    def title(self) -> str:
        """What the timeline calls it."""
        return _TITLES.get(self.kind, self.kind)


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        return None
    try:
        return parse_timestamp(value)
    except ValidationError:
        return None


def _seconds(delta: float) -> str:
    return f"{delta:.1f} s" if delta < 120 else f"{delta / 60:.1f} min"


def _backtraces(letter: DeadLetterEntry | None) -> dict[int, list[str]]:
    """The backtrace of each attempt in the dead letter's ``errors[]`` (its last error's too)."""
    found: dict[int, list[str]] = {}
    job = letter.job if letter is not None else None
    if job is None:
        return found
    for error in job.errors or []:
        if isinstance(error, Mapping) and isinstance(error.get("attempt"), int):
            lines = error.get("backtrace") or (error.get("details") or {}).get("backtrace")
            if isinstance(lines, list):
                found[error["attempt"]] = [str(line) for line in lines]
    if job.error is not None and job.error.backtrace and letter is not None and letter.attempt:
        found.setdefault(letter.attempt, list(job.error.backtrace))
    return found


def timeline(
    events: Sequence[JobEventRecord],
    letter: DeadLetterEntry | None = None,
    info: JobInfo | None = None,
    replayed_here: datetime | None = None,
) -> list[Step]:
    """The steps of a job's story, oldest first (see the module docstring).

    Parameters:
        events: the job's events, oldest first.
        letter: its dead letter, when it is in a dead letter queue.
        info: the workers' INFO answer, or None.
        replayed_here: when this dashboard last replayed it, or None.

    Returns:
        The steps; an unknown time sorts last.
    """
    steps: list[Step] = []
    traces = _backtraces(letter)
    ended = False
    retried_at: datetime | None = None
    enqueued_seen: set[datetime] = set()
    for event in events:
        if event.event == "started":
            if event.enqueued_at is not None and event.enqueued_at not in enqueued_seen:
                enqueued_seen.add(event.enqueued_at)
                kind = "replayed" if ended and event.attempt == 1 else "enqueued"
                steps.append(Step(kind, event.enqueued_at, note="re-enqueued" if kind == "replayed" else ""))
            elif ended and event.attempt == 1:
                steps.append(Step("replayed", None, note="seen when it started again"))
            if event.scheduled_at is not None and (event.enqueued_at is None or event.scheduled_at > event.enqueued_at):
                steps.append(Step("scheduled", event.scheduled_at))
            note = ""
            if retried_at is not None and event.attempt > 1:
                note = f"{_seconds((event.at - retried_at).total_seconds())} after the retry was scheduled"
            steps.append(Step("started", event.at, event.attempt, event.worker_id, note=note))
            ended, retried_at = False, None
            continue
        error = event.error
        trace = traces.get(event.attempt, []) if event.event == "failed" else []
        steps.append(
            Step(
                event.event, event.at, event.attempt, event.worker_id, error if event.event == "failed" else None, trace
            )
        )
        if event.event == "retried":
            retried_at = event.at
        ended = ended or event.event in _ENDS
    kinds = {(s.kind, s.attempt) for s in steps}
    if letter is not None and letter.job is not None:
        job = letter.job
        enqueued = _time(job.enqueued_at)
        if not steps and enqueued is not None:
            steps.append(Step("enqueued", enqueued, source="dead letter"))
        replayed = _time((job.meta or {}).get("ojs.last_replayed_at"))
        if replayed is not None and not any(s.kind == "replayed" for s in steps):
            steps.append(Step("replayed", replayed, source="dead letter"))
        for error in job.errors or []:
            attempt = error.get("attempt") if isinstance(error, Mapping) else None
            if isinstance(attempt, int) and ("failed", attempt) not in kinds:
                trace = traces.get(attempt, [])
                at = _time(error.get("occurred_at"))
                steps.append(Step("failed", at, attempt, error=error, backtrace=trace, source="dead letter"))
        if ("dead-lettered", letter.attempt) not in kinds:
            final = {"code": letter.error_code or letter.error_type, "message": letter.error_message}
            known = final["code"] or final["message"]
            steps.append(
                Step("dead-lettered", letter.dead_at or letter.failed_at, letter.attempt, error=final if known else None,
                     note=f"reason: {letter.reason}" if letter.reason else "", source="dead letter")
            )  # fmt: skip
    if replayed_here is not None and not any(
        s.kind == "replayed" and (s.at is None or abs((s.at - replayed_here).total_seconds()) < 5) for s in steps
    ):
        steps.append(Step("replayed", replayed_here, source="dashboard"))
    if info is not None:
        if info.state == "active" and ("started", info.attempt) not in kinds:
            steps.append(Step("started", info.started_at, info.attempt, info.worker_id, source="info"))
        elif (
            info.finished
            and info.finished_at is not None
            and not any(s.kind in _ENDS + ("failed", "retried") and s.attempt == info.attempt for s in steps)
        ):
            steps.append(Step(info.state, info.finished_at, info.attempt, info.worker_id, info.error, source="info"))
    order = {id(s): i for i, s in enumerate(steps)}
    return sorted(steps, key=lambda s: (s.at is None, s.at or datetime.min, order[id(s)]))


__all__ = ["Step", "timeline"]
