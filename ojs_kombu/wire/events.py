"""The events stream's messages: worker presence and job lifecycle events (DESIGN §14).

Both go to the topic exchange ``ojs.exchange.events`` and land in the stream
``ojs.stream.events`` (bound with ``#``):

=========================  ==========================  =========================================
message                    ``type`` property           routing key
=========================  ==========================  =========================================
worker presence            ``ojs.event.worker``        ``worker.{worker_id}``
job lifecycle event        ``ojs.event.job.{event}``   ``job.{event}.{queue}``
cron event (``ojs-cron``)  ``ojs.event.cron.{event}``  ``cron.{event}.{name}``
a reader's catch-up mark   ``ojs.event.marker``        ``marker``
=========================  ==========================  =========================================

Properties: ``content_type=application/json``, a unique ``message_id``,
``timestamp`` (epoch seconds), ``app_id=ojs``.  Times in the bodies are RFC 3339
UTC strings.  A presence body::

    {"worker_id": "host.4242.a1b2c3", "host": "host", "pid": 4242, "queues": ["email"],
     "concurrency": 10, "state": "online", "version": "0.1.0",
     "started_at": "…Z", "sent_at": "…Z",
     "active": [{"job_id": "…", "queue": "email", "type": "email.send", "attempt": 1,
                 "started_at": "…Z"}]}

``state`` is ``offline`` in the last presence of a worker that stopped
gracefully.  A job event body::

    {"event": "failed", "job_id": "…", "type": "email.send", "queue": "email",
     "attempt": 2, "worker_id": "…", "at": "…Z", "error": {"code": …, "type": …, "message": …}}

(``error`` only on ``failed``).  A cron event (ojs-cron.md §9, :class:`CronEvent`) has the spec's
body, ``{"event": "cron.triggered", "timestamp": "…Z", "data": {"cron_name": …, …}}``;
:func:`decode_event` skips it (it is not a job event), :func:`decode_cron_event` reads it.  :class:`JobEvent` is the one definition of a job event's
fields: what a worker's :class:`~ojs_kombu.runtime.lifecycle.Lifecycle` emits, what the
per job type metrics read (:mod:`ojs_kombu.observability.job_metrics`) and what a reader
decodes from the stream (:class:`JobEventRecord`, the same fields).  Decoders ignore unknown fields and unknown
``ojs.event.*`` types (a newer producer), and raise
:class:`~ojs_kombu.errors.DecodeError` on anything else unreadable.

Pure: :mod:`ojs_kombu.runtime.presence` publishes these messages,
:meth:`ojs_kombu.client.Client.workers` and :meth:`ojs_kombu.client.Client.events` read them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal, NamedTuple, get_args

from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.naming import (
    EVENT_TYPE_CRON_PREFIX,
    EVENT_TYPE_JOB_PREFIX,
    EVENT_TYPE_RATE_LIMIT_PREFIX,
    EVENT_TYPE_WORKER,
)
from ojs_kombu.model.timefmt import format_timestamp, parse_timestamp, utcnow
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.control import ControlOptions, json_message

EVENTS_CONTENT_TYPE = "application/json"
#: A reader's own catch-up marker: published by a reader, it tells it that everything
#: before it has been read.  Every reader ignores other readers' markers.
EVENT_TYPE_MARKER = "ojs.event.marker"
MARKER_ROUTING_KEY = "marker"
#: A body larger than this is not an event (a presence with 100 active jobs is ~15 KB).
MAX_EVENT_BYTES = 1024 * 1024

PresenceState = Literal["online", "offline"]

JobEventName = Literal["started", "succeeded", "failed", "retried", "dead-lettered", "cancelled", "expired"]
"""The lifecycle events of a job (the routing key of an events-stream message is ``job.{event}.{queue}``)."""

JOB_EVENT_NAMES: tuple[str, ...] = get_args(JobEventName)

CronEventName = Literal["triggered", "skipped"]
"""The cron events (ojs-cron.md §9): ``cron.triggered`` and ``cron.skipped``."""

CronSkipReason = Literal["overlap_skip", "disabled", "dst_skip"]
"""Why an occurrence did not enqueue a job (ojs-cron.md §9.2)."""


def library_version() -> str:
    """The installed version of the ``ojs-amqp`` distribution (``"unknown"`` when not installed)."""
    try:
        return version("ojs-amqp")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class EventsOptions(ControlOptions):
    """Retention of the events stream ``ojs.stream.events`` (DESIGN §14).

    The same three arguments as :class:`~ojs_kombu.wire.control.ControlOptions`,
    with a short age: presence and job events are for the live view (CLI, dashboard),
    not a history.  RabbitMQ trims whole segments, so the small segment size is
    what lets the age and size limits bite; a presence record is ~400 bytes.

    Parameters:
        max_age: ``x-max-age`` (RabbitMQ units ``Y M D h m s``), default one hour.
        max_length_bytes: ``x-max-length-bytes``: the stream's size cap.
        max_segment_size_bytes: ``x-stream-max-segment-size-bytes``.

    Raises:
        ValidationError: an option is malformed.
    """

    max_age: str = "1h"
    max_length_bytes: int = 100_000_000
    max_segment_size_bytes: int = 1_000_000


@dataclass(frozen=True)
class ActiveJob:
    """A job a worker is running, as its presence lists it.

    Parameters:
        job_id, queue, job_type: the job.
        attempt: the 1-based execution running.
        started_at: when the handler started it (UTC).
    """

    job_id: str
    queue: str
    job_type: str
    attempt: int
    started_at: datetime

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this job in a presence body."""
        return {
            "job_id": self.job_id,
            "queue": self.queue,
            "type": self.job_type,
            "attempt": self.attempt,
            "started_at": format_timestamp(self.started_at),
        }


@dataclass(frozen=True)
class WorkerPresence:
    """One worker's presence on the events stream (BEAT, DESIGN §14).

    Parameters:
        worker_id: the worker's id (``{host}.{pid}.{6 hex}``).
        host, pid: where it runs.
        queues: the OJS queues it consumes.
        concurrency: its handler threads.
        active: the jobs it runs now, with their start times.
        started_at: when the worker started (UTC).
        sent_at: when this presence was sent (UTC).
        state: ``online``, or ``offline`` for the last presence of a graceful stop.
        version: the library version of the worker.
    """

    worker_id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    active: tuple[ActiveJob, ...]
    started_at: datetime
    sent_at: datetime
    state: PresenceState = "online"
    version: str = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON body of this presence."""
        return {
            "worker_id": self.worker_id,
            "host": self.host,
            "pid": self.pid,
            "queues": list(self.queues),
            "concurrency": self.concurrency,
            "state": self.state,
            "version": self.version,
            "started_at": format_timestamp(self.started_at),
            "sent_at": format_timestamp(self.sent_at),
            "active": [job.to_json() for job in self.active],
        }


class _JobEventFields(NamedTuple):
    event: str
    job_id: str
    job_type: str
    queue: str
    attempt: int
    worker_id: str
    at: datetime
    error: dict[str, Any] | None
    enqueued_at: datetime | None
    scheduled_at: datetime | None


class JobEvent(_JobEventFields):
    """One step of one job in one worker (immutable: a named tuple); see :mod:`ojs_kombu.runtime.lifecycle`.

    Parameters:
        event: one of :data:`JOB_EVENT_NAMES` (a decoded event may carry a newer name).
        job_id, job_type, queue: the job.
        attempt: the 1-based execution the event is about.
        worker_id: the worker that emitted it.
        at: when (UTC; default: now).
        error: for ``failed``: ``{"code", "type", "message"}`` of the failure.
        enqueued_at, scheduled_at: on a ``started`` event a worker emits, the job's ``enqueued_at`` /
            ``scheduled_at`` (aware datetimes), when it has them: what queue wait and scheduling
            lateness are measured from (:class:`~ojs_kombu.observability.job_metrics.JobMetrics`,
            the dashboard's queue wait); None on the other events (parsing them costs a µs per
            event nobody reads).  The body carries them when set.

    A named tuple rather than a frozen dataclass: a worker builds two per job in the thread
    that settles it, and a tuple is built in one step (a frozen dataclass writes its ten
    fields one by one: ~7,000 more instructions per event, measured).
    """

    __slots__ = ()

    def __new__(
        cls,
        event: str,
        job_id: str,
        job_type: str,
        queue: str,
        attempt: int,
        worker_id: str,
        at: datetime | None = None,
        error: dict[str, Any] | None = None,
        enqueued_at: datetime | None = None,
        scheduled_at: datetime | None = None,
    ) -> JobEvent:
        fields = (event, job_id, job_type, queue, attempt, worker_id, at or utcnow(), error, enqueued_at, scheduled_at)
        job_event: JobEvent = _new_tuple(cls, fields)
        return job_event

    def to_json(self) -> dict[str, Any]:
        """The JSON body of this event on the events stream (``error``, ``enqueued_at`` and
        ``scheduled_at`` only when set)."""
        body: dict[str, Any] = {
            "event": self.event,
            "job_id": self.job_id,
            "type": self.job_type,
            "queue": self.queue,
            "attempt": self.attempt,
            "worker_id": self.worker_id,
            "at": format_timestamp(self.at),
        }
        if self.error is not None:
            body["error"] = self.error
        if self.enqueued_at is not None:
            body["enqueued_at"] = format_timestamp(self.enqueued_at)
        if self.scheduled_at is not None:
            body["scheduled_at"] = format_timestamp(self.scheduled_at)
        return body


_new_tuple = tuple.__new__


class JobEventRecord(JobEvent):
    """A job event read from the events stream (:meth:`ojs_kombu.Client.events`, :func:`decode_event`):
    a :class:`JobEvent` whose ``enqueued_at`` / ``scheduled_at`` are the body's (None when it has none,
    as an older worker's ``started`` or any other event, or when one is not an RFC 3339 time)."""

    __slots__ = ()


@dataclass(frozen=True)
class CronEvent:
    """A ``cron.triggered`` or ``cron.skipped`` event (ojs-cron.md §9).

    Parameters:
        event: ``triggered`` or ``skipped``.
        cron_name, cron_expression, timezone: the cron job.
        scheduled_time: the occurrence (UTC).
        job_id, job_type, run_count, actual_time: of a ``triggered`` event: the job enqueued, the
            occurrences fired so far (this one included, as the scheduler knows them) and when it was.
        reason, active_job_id: of a ``skipped`` event: one of :data:`CronSkipReason`, and the job
            still active for ``overlap_skip``.
        timestamp: when the event was emitted (default now).
    """

    event: CronEventName
    cron_name: str
    cron_expression: str
    timezone: str
    scheduled_time: datetime
    job_id: str | None = None
    job_type: str | None = None
    run_count: int | None = None
    actual_time: datetime | None = None
    reason: CronSkipReason | None = None
    active_job_id: str | None = None
    timestamp: datetime = field(default_factory=utcnow)

    def to_json(self) -> dict[str, Any]:
        """The spec's body: ``{"event": "cron.<event>", "timestamp": …, "data": {…}}`` (fields not set left out)."""
        data: dict[str, Any] = {
            "cron_name": self.cron_name,
            "cron_expression": self.cron_expression,
            "timezone": self.timezone,
        }
        if self.event == "triggered":
            data.update(job_id=self.job_id, job_type=self.job_type, run_count=self.run_count)
        else:
            data.update(reason=self.reason, active_job_id=self.active_job_id)
        data["scheduled_time"] = format_timestamp(self.scheduled_time)
        if self.actual_time is not None:
            data["actual_time"] = format_timestamp(self.actual_time)
        return {
            "event": f"cron.{self.event}",
            "timestamp": format_timestamp(self.timestamp),
            "data": {k: v for k, v in data.items() if v is not None},
        }


def cron_event_message(event: CronEvent) -> OutgoingMessage:
    """The message of a cron event: ``type=ojs.event.cron.{event}``, body :meth:`CronEvent.to_json`."""
    return json_message(EVENT_TYPE_CRON_PREFIX + event.event, event.to_json(), sent_at=event.timestamp)


RateLimitEventName = Literal["exceeded", "released", "dropped"]
"""The rate limit events (ojs-rate-limiting.md §11.1): ``rate_limit.exceeded``, ``.released``, ``.dropped``."""


@dataclass(frozen=True)
class RateLimitEvent:
    """A ``rate_limit.*`` event of a worker (ojs-rate-limiting.md §11.1).

    Parameters:
        event: ``exceeded`` (a job could not start), ``released`` (a job that waited may start now)
            or ``dropped`` (discarded by ``on_limit: "drop"``).
        key: the rate limit key.
        strategy: ``concurrency``, ``rate`` or ``throttle``.
        limit: the limit reached (``exceeded``, ``dropped``); an ``exceeded`` event's ``current`` (the
            spec's count in use) is the limit too: a limit stops a job exactly when its count reached it.
        job_id, job_type, queue: the job.
        worker_id: the worker that emitted it.
        timestamp: when (default now).
    """

    event: RateLimitEventName
    key: str
    strategy: str
    job_id: str
    job_type: str
    queue: str
    worker_id: str
    limit: int | None = None
    timestamp: datetime = field(default_factory=utcnow)

    def to_json(self) -> dict[str, Any]:
        """The spec's body: ``{"event": "rate_limit.<event>", "timestamp": …, "data": {…}}``."""
        data: dict[str, Any] = {
            "key": self.key,
            "strategy": self.strategy,
            "limit": self.limit,
            "job_id": self.job_id,
            "job_type": self.job_type,
            "queue": self.queue,
            "worker_id": self.worker_id,
        }
        if self.event == "exceeded":
            data["current"] = self.limit
        return {
            "event": f"rate_limit.{self.event}",
            "timestamp": format_timestamp(self.timestamp),
            "data": {k: v for k, v in data.items() if v is not None},
        }


def rate_limit_event_message(event: RateLimitEvent) -> OutgoingMessage:
    """The message of a rate limit event: ``type=ojs.event.rate_limit.{event}``, body :meth:`RateLimitEvent.to_json`."""
    return json_message(EVENT_TYPE_RATE_LIMIT_PREFIX + event.event, event.to_json(), sent_at=event.timestamp)


def decode_cron_event(body: bytes, properties: dict[str, Any]) -> CronEvent | None:
    """Read a cron event of the events stream; ``None`` for any other message.

    Raises:
        DecodeError: a cron event whose body is not the spec's object.
    """
    kind = properties.get("type")
    if not isinstance(kind, str) or not kind.startswith(EVENT_TYPE_CRON_PREFIX):
        return None
    what = "a cron event"
    try:
        outer = json.loads(body.decode("utf-8")) if len(body) <= MAX_EVENT_BYTES else None
    except (UnicodeDecodeError, ValueError):
        outer = None
    if not isinstance(outer, dict) or not isinstance(outer.get("data"), dict):
        raise DecodeError(f"{what}: the body must be an object with a 'data' object", code="invalid_payload")
    name = kind[len(EVENT_TYPE_CRON_PREFIX) :]
    if name not in get_args(CronEventName):
        return None
    data = outer["data"]
    actual = data.get("actual_time")
    run_count = data.get("run_count")
    return CronEvent(
        event=name,  # type: ignore[arg-type]
        cron_name=_field(data, "cron_name", str, what),
        cron_expression=_field(data, "cron_expression", str, what),
        timezone=_field(data, "timezone", str, what),
        scheduled_time=_time(data, "scheduled_time", what),
        job_id=data.get("job_id") if isinstance(data.get("job_id"), str) else None,
        job_type=data.get("job_type") if isinstance(data.get("job_type"), str) else None,
        run_count=run_count if isinstance(run_count, int) and not isinstance(run_count, bool) else None,
        actual_time=_time(data, "actual_time", what) if isinstance(actual, str) else None,
        reason=data.get("reason") if data.get("reason") in get_args(CronSkipReason) else None,
        active_job_id=data.get("active_job_id") if isinstance(data.get("active_job_id"), str) else None,
        timestamp=_time(outer, "timestamp", what),
    )


def presence_message(presence: WorkerPresence) -> OutgoingMessage:
    """The message of a worker presence: ``type=ojs.event.worker``, body :meth:`WorkerPresence.to_json`."""
    return json_message(EVENT_TYPE_WORKER, presence.to_json(), sent_at=presence.sent_at)


def job_event_message(event: JobEvent) -> OutgoingMessage:
    """The message of a job event: ``type=ojs.event.job.{event}``, body :meth:`JobEvent.to_json`."""
    return json_message(EVENT_TYPE_JOB_PREFIX + event.event, event.to_json(), sent_at=event.at)


def marker_message() -> OutgoingMessage:
    """A reader's catch-up marker (``type=ojs.event.marker``, body ``{}``); its ``message_id`` identifies it."""
    return json_message(EVENT_TYPE_MARKER, {})


# -- decoding --------------------------------------------------------------------------------------


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise DecodeError(f"{what}: {name!r} is missing or not a {_kind_name(kind)}", code="invalid_payload")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)


def _time(data: dict[str, Any], name: str, what: str) -> datetime:
    try:
        return parse_timestamp(_field(data, name, str, what))
    except ValidationError as exc:
        if isinstance(exc, DecodeError):
            raise
        raise DecodeError(f"{what}: {name!r} is not an RFC 3339 timestamp", code="invalid_payload") from None


def _active_job(data: Any) -> ActiveJob:
    what = "an active job of a worker presence"
    if not isinstance(data, dict):
        raise DecodeError(f"{what} must be a JSON object", code="invalid_payload")
    return ActiveJob(
        _field(data, "job_id", str, what),
        _field(data, "queue", str, what),
        _field(data, "type", str, what),
        _field(data, "attempt", int, what),
        _time(data, "started_at", what),
    )


def decode_presence(data: dict[str, Any]) -> WorkerPresence:
    """A :class:`WorkerPresence` from a presence body (unknown fields ignored).

    Raises:
        DecodeError: a required field is missing or of the wrong type.
    """
    what = "a worker presence"
    queues = _field(data, "queues", list, what)
    active = data.get("active", [])
    state = data.get("state", "online")
    if not all(isinstance(q, str) for q in queues) or not isinstance(active, list):
        raise DecodeError(f"{what}: 'queues' must be strings and 'active' a list", code="invalid_payload")
    if state not in ("online", "offline"):
        raise DecodeError(f"{what}: unknown state {state!r}", code="invalid_payload")
    version = data.get("version", "")
    return WorkerPresence(
        worker_id=_field(data, "worker_id", str, what),
        host=_field(data, "host", str, what),
        pid=_field(data, "pid", int, what),
        queues=tuple(queues),
        concurrency=_field(data, "concurrency", int, what),
        active=tuple(_active_job(job) for job in active),
        started_at=_time(data, "started_at", what),
        sent_at=_time(data, "sent_at", what),
        state=state,
        version=version if isinstance(version, str) else "",
    )


def decode_job_event(data: dict[str, Any]) -> JobEventRecord:
    """A :class:`JobEventRecord` from a job event body (unknown fields ignored).

    Raises:
        DecodeError: a required field is missing or of the wrong type.
    """
    what = "a job event"
    error = data.get("error")
    enqueued_at, scheduled_at = _optional_time(data.get("enqueued_at")), _optional_time(data.get("scheduled_at"))
    return JobEventRecord(
        event=_field(data, "event", str, what),
        job_id=_field(data, "job_id", str, what),
        job_type=_field(data, "type", str, what),
        queue=_field(data, "queue", str, what),
        attempt=_field(data, "attempt", int, what),
        worker_id=_field(data, "worker_id", str, what),
        at=_time(data, "at", what),
        error=error if isinstance(error, dict) else None,
        enqueued_at=enqueued_at,
        scheduled_at=scheduled_at,
    )


def _optional_time(value: Any) -> datetime | None:
    """An optional time of an event body: None when absent or unreadable (it never fails a decode)."""
    if not isinstance(value, str):
        return None
    try:
        return parse_timestamp(value)
    except ValidationError:
        return None


def decode_event(body: bytes, properties: dict[str, Any]) -> WorkerPresence | JobEventRecord | None:
    """Read one message of the events stream.

    Parameters:
        body: the message body.
        properties: its AMQP properties (``type`` decides).

    Returns:
        The presence or the job event; ``None`` for a marker or an ``ojs.event.*`` type
        this version does not know.

    Raises:
        DecodeError: no ``type`` property, a body that is not a JSON object, or a
            presence / job event missing a required field.
    """
    kind = properties.get("type")
    if not isinstance(kind, str) or not kind:
        raise DecodeError("an event needs a type property", code="invalid_payload")
    if kind == EVENT_TYPE_MARKER:
        return None
    if len(body) > MAX_EVENT_BYTES:
        raise DecodeError(f"an event body is {len(body)} bytes", code="invalid_payload")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DecodeError(f"an event body is not JSON: {exc}", code="invalid_payload") from None
    if not isinstance(data, dict):
        raise DecodeError("an event body must be a JSON object", code="invalid_payload")
    if kind == EVENT_TYPE_WORKER:
        return decode_presence(data)
    if kind.startswith(EVENT_TYPE_JOB_PREFIX):
        return decode_job_event(data)
    return None


__all__ = [
    "EVENTS_CONTENT_TYPE",
    "EVENT_TYPE_MARKER",
    "JOB_EVENT_NAMES",
    "MARKER_ROUTING_KEY",
    "ActiveJob",
    "CronEvent",
    "CronEventName",
    "CronSkipReason",
    "EventsOptions",
    "JobEvent",
    "JobEventName",
    "JobEventRecord",
    "PresenceState",
    "RateLimitEvent",
    "RateLimitEventName",
    "WorkerPresence",
    "cron_event_message",
    "decode_cron_event",
    "decode_event",
    "decode_job_event",
    "decode_presence",
    "job_event_message",
    "library_version",
    "marker_message",
    "presence_message",
    "rate_limit_event_message",
]
