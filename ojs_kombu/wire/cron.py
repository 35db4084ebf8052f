"""The cron stream's records: definitions, removals and ticks (ojs-cron.md §2, §8; DESIGN §20).

Cron job definitions are registered through the broker: the stream ``ojs.stream.cron``
(:attr:`~ojs_kombu.model.naming.Names.cron_stream`), published to through the default
exchange (routing key = the stream's name).  Every record is a JSON message
(:func:`~ojs_kombu.wire.control.json_message`) whose ``type`` property says what it is:

=========================  ===================================================================
``type``                   body
=========================  ===================================================================
``ojs.cron.definition``    ``{"cron_job": {spec §2.1 object}, "registered_at": "…Z"}``
``ojs.cron.removed``       ``{"name": …, "removed_at": "…Z"}``
``ojs.cron.fired``         ``{"name": …, "scheduled_time": "…Z", "job_id": … | null,
                           "skipped": null | "overlap_skip" | …, "at": "…Z"}``
``ojs.cron.leader``        ``{"scheduler_id": …, "host": …, "pid": …, "elected_at": "…Z"}``: a
                           scheduler became the leader (for ``ojs-amqp cron list``)
``ojs.cron.marker``        ``{}``: a reader's catch-up mark (its ``message_id`` identifies it)
=========================  ===================================================================

Reading the stream from its first record and folding it (:class:`CronBook`) gives the
registry: the latest definition of each name wins (upsert, CRON-26), a removal drops it, and
the ``fired`` records the leader writes after each tick give every scheduler the last run,
the run count and the previous tick's job id, so a new leader continues where the old one
stopped (one catch-up at most, CRON-25).  The stream has no age limit: a definition is read
back however old it is (a record is a few hundred bytes).

Pure: :mod:`ojs_kombu.runtime.cron` publishes and reads these messages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.cron import CronJob
from ojs_kombu.model.timefmt import format_timestamp, parse_timestamp, utcnow
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.control import json_message

CRON_TYPE_DEFINITION = "ojs.cron.definition"
CRON_TYPE_REMOVED = "ojs.cron.removed"
CRON_TYPE_FIRED = "ojs.cron.fired"
CRON_TYPE_LEADER = "ojs.cron.leader"
CRON_TYPE_MARKER = "ojs.cron.marker"
#: A record larger than this is not a cron record.
MAX_CRON_RECORD_BYTES = 1024 * 1024
#: Segment size of the cron stream (RabbitMQ's default is 500 MB; the stream is small).
CRON_STREAM_SEGMENT_BYTES = 1_000_000


def cron_stream_arguments() -> dict[str, Any]:
    """The arguments of ``ojs.stream.cron``: a stream, no age or size limit (definitions are kept).

    Returns:
        A new dict.
    """
    return {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": CRON_STREAM_SEGMENT_BYTES}


@dataclass(frozen=True)
class CronDefinition:
    """An ``ojs.cron.definition`` record: ``cron`` registered (or replaced) at ``registered_at``."""

    cron: CronJob
    registered_at: datetime


@dataclass(frozen=True)
class CronRemoval:
    """An ``ojs.cron.removed`` record: the cron job ``name`` was removed."""

    name: str
    removed_at: datetime


@dataclass(frozen=True)
class CronFired:
    """An ``ojs.cron.fired`` record: the occurrence ``scheduled_time`` of ``name`` was handled.

    ``job_id`` is the job enqueued, or None when the occurrence was skipped (``skipped`` says why).
    """

    name: str
    scheduled_time: datetime
    job_id: str | None
    skipped: str | None
    at: datetime


@dataclass(frozen=True)
class CronLeader:
    """An ``ojs.cron.leader`` record: the scheduler ``scheduler_id`` became the leader at ``elected_at``."""

    scheduler_id: str
    host: str
    pid: int
    elected_at: datetime


CronRecord = CronDefinition | CronRemoval | CronFired | CronLeader


def definition_message(cron: CronJob, *, registered_at: datetime | None = None) -> OutgoingMessage:
    """The record registering ``cron`` (persistent).

    Parameters:
        cron: the definition.
        registered_at: the registration time (default now): ``@every`` counts from it.

    Returns:
        The message.
    """
    at = registered_at or utcnow()
    body = {"cron_job": cron.to_dict(), "registered_at": format_timestamp(at)}
    return json_message(CRON_TYPE_DEFINITION, body, sent_at=at, delivery_mode=2)


def removal_message(name: str) -> OutgoingMessage:
    """The record removing the cron job ``name`` (persistent)."""
    return json_message(CRON_TYPE_REMOVED, {"name": name, "removed_at": format_timestamp(utcnow())}, delivery_mode=2)


def fired_message(
    name: str, scheduled_time: datetime, job_id: str | None, *, skipped: str | None = None
) -> OutgoingMessage:
    """The record of one handled occurrence (persistent): enqueued as ``job_id``, or ``skipped``."""
    body = {
        "name": name,
        "scheduled_time": format_timestamp(scheduled_time),
        "job_id": job_id,
        "skipped": skipped,
        "at": format_timestamp(utcnow()),
    }
    return json_message(CRON_TYPE_FIRED, body, delivery_mode=2)


def leader_message(leader: CronLeader) -> OutgoingMessage:
    """The record of an election (persistent)."""
    body = {
        "scheduler_id": leader.scheduler_id,
        "host": leader.host,
        "pid": leader.pid,
        "elected_at": format_timestamp(leader.elected_at),
    }
    return json_message(CRON_TYPE_LEADER, body, sent_at=leader.elected_at, delivery_mode=2)


def cron_marker_message() -> OutgoingMessage:
    """A reader's catch-up marker (transient); its ``message_id`` identifies it."""
    return json_message(CRON_TYPE_MARKER, {})


def _time(data: dict[str, Any], name: str, what: str) -> datetime:
    value = data.get(name)
    if not isinstance(value, str):
        raise DecodeError(f"{what}: {name!r} is missing or not a string", code="invalid_payload")
    try:
        return parse_timestamp(value)
    except ValidationError:
        raise DecodeError(f"{what}: {name!r} is not an RFC 3339 timestamp", code="invalid_payload") from None


def _text(data: dict[str, Any], name: str, what: str, *, optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise DecodeError(f"{what}: {name!r} is missing or not a string", code="invalid_payload")
    return value


def decode_cron_record(body: bytes, properties: dict[str, Any]) -> CronRecord | None:
    """Read one message of the cron stream.

    Parameters:
        body: the message body.
        properties: its AMQP properties (``type`` decides).

    Returns:
        The record; ``None`` for a marker or a type this version does not know.

    Raises:
        DecodeError: a body that is not a JSON object, or a record missing a field or with an
            invalid definition.
    """
    kind = properties.get("type")
    if kind not in (CRON_TYPE_DEFINITION, CRON_TYPE_REMOVED, CRON_TYPE_FIRED, CRON_TYPE_LEADER):
        return None
    if len(body) > MAX_CRON_RECORD_BYTES:
        raise DecodeError(f"a cron record is {len(body)} bytes", code="invalid_payload")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DecodeError(f"a cron record is not JSON: {exc}", code="invalid_payload") from None
    if not isinstance(data, dict):
        raise DecodeError("a cron record must be a JSON object", code="invalid_payload")
    if kind == CRON_TYPE_DEFINITION:
        what = "a cron definition"
        try:
            cron = CronJob.from_dict(data.get("cron_job"))  # type: ignore[arg-type]
        except ValidationError as exc:
            raise DecodeError(f"{what}: {exc}", code="invalid_payload") from None
        return CronDefinition(cron, _time(data, "registered_at", what))
    if kind == CRON_TYPE_REMOVED:
        what = "a cron removal"
        return CronRemoval(_text(data, "name", what), _time(data, "removed_at", what))
    if kind == CRON_TYPE_LEADER:
        what = "a cron leader record"
        pid = data.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            raise DecodeError(f"{what}: 'pid' is missing or not an integer", code="invalid_payload")
        return CronLeader(
            _text(data, "scheduler_id", what), _text(data, "host", what), pid, _time(data, "elected_at", what)
        )
    what = "a cron tick"
    return CronFired(
        _text(data, "name", what),
        _time(data, "scheduled_time", what),
        _text(data, "job_id", what, optional=True),
        _text(data, "skipped", what, optional=True),
        _time(data, "at", what),
    )


@dataclass
class CronEntry:
    """One registered cron job as the stream tells it (spec §2.2's system-managed fields included).

    Attributes:
        cron: the latest definition.
        created_at: when the name was first registered (since its last removal).
        registered_at: when the latest definition was registered (``@every`` counts from it
            until the first tick).
        last_run_at: the scheduled time of the latest occurrence handled (fired or skipped), or None.
        last_job_id: the job of the latest occurrence fired, or None.
        run_count: the occurrences fired.
    """

    cron: CronJob
    created_at: datetime
    registered_at: datetime
    last_run_at: datetime | None = None
    last_job_id: str | None = None
    run_count: int = 0


@dataclass
class CronBook:
    """The registry folded from the cron stream: the latest definition per name, with its ticks."""

    entries: dict[str, CronEntry] = field(default_factory=dict)
    leader: CronLeader | None = None
    """The latest scheduler elected (it may have died since: see its ``elected_at``)."""

    def apply(self, record: CronRecord) -> None:
        """Fold one record in (records are applied in stream order).

        A definition replaces the previous one of its name and keeps its ticks (upsert); a
        removal drops the name; a tick moves ``last_run_at`` forward (an older tick, e.g. of an
        overlapping leader, changes nothing but is not counted twice).
        """
        if isinstance(record, CronDefinition):
            name = record.cron.name
            previous = self.entries.get(name)
            if previous is None:
                self.entries[name] = CronEntry(record.cron, record.registered_at, record.registered_at)
            else:
                previous.cron = record.cron
                previous.registered_at = record.registered_at
        elif isinstance(record, CronLeader):
            self.leader = record
        elif isinstance(record, CronRemoval):
            self.entries.pop(record.name, None)
        else:
            entry = self.entries.get(record.name)
            if entry is None or (entry.last_run_at is not None and record.scheduled_time <= entry.last_run_at):
                return
            entry.last_run_at = record.scheduled_time
            if record.job_id is not None:
                entry.last_job_id = record.job_id
                entry.run_count += 1


__all__ = [
    "CRON_STREAM_SEGMENT_BYTES",
    "CRON_TYPE_DEFINITION",
    "CRON_TYPE_FIRED",
    "CRON_TYPE_LEADER",
    "CRON_TYPE_MARKER",
    "CRON_TYPE_REMOVED",
    "MAX_CRON_RECORD_BYTES",
    "CronBook",
    "CronDefinition",
    "CronEntry",
    "CronFired",
    "CronLeader",
    "CronRecord",
    "CronRemoval",
    "cron_marker_message",
    "cron_stream_arguments",
    "decode_cron_record",
    "definition_message",
    "fired_message",
    "leader_message",
    "removal_message",
]
