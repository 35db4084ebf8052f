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
``ojs.cron.snapshot``      ``{"entries": [{"cron_job": …, "created_at", "registered_at",
                           "last_run_at", "last_job_id", "run_count"}, …], "leader": … | null,
                           "through": offset | null, "at": "…Z"}``: the whole registry as folded
                           up to the stream offset ``through``
``ojs.cron.marker``        ``{}``: a reader's catch-up mark (its ``message_id`` identifies it)
=========================  ===================================================================

Reading the stream from its first record and folding it (:class:`CronBook`) gives the
registry: the latest definition of each name wins (upsert, CRON-26), a removal drops it, and
the ``fired`` records the leader writes after each tick give every scheduler the last run,
the run count and the previous tick's job id, so a new leader continues where the old one
stopped (one catch-up at most, CRON-25).

The stream is bounded: it keeps :data:`CRON_STREAM_MAX_AGE` of records (``x-max-age``; RabbitMQ
drops whole segments, never the one written to), and a ``snapshot`` record, written by the
leader every :data:`CRON_SNAPSHOT_INTERVAL` (and by a registry read that found none that recent),
holds every definition with its ticks, so a definition older than the retention is still read
back.  A snapshot says up to which stream offset it folded (``through``): a reader resets its
book to the snapshot and applies again the records after that offset it already read
(:meth:`CronBook.apply`), so a record written while the snapshot was made is not lost.

Pure: :mod:`ojs_kombu.runtime.cron` publishes and reads these messages.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
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
CRON_TYPE_SNAPSHOT = "ojs.cron.snapshot"
#: A record larger than this is not a cron record.
MAX_CRON_RECORD_BYTES = 1024 * 1024
#: A snapshot larger than this is not one: RabbitMQ's default largest message (~50,000 cron jobs of ~330 bytes).
MAX_CRON_SNAPSHOT_BYTES = 16 * 1024 * 1024
#: Segment size of the cron stream (RabbitMQ's default is 500 MB; the stream is small).
CRON_STREAM_SEGMENT_BYTES = 1_000_000
#: ``x-max-age`` of the cron stream: records older than a day go, segment by segment.
CRON_STREAM_MAX_AGE = "1D"
#: How often the leader writes a snapshot: far shorter than :data:`CRON_STREAM_MAX_AGE`, so the
#: latest snapshot is always kept.
CRON_SNAPSHOT_INTERVAL = timedelta(hours=1)


def cron_stream_arguments() -> dict[str, Any]:
    """The arguments of ``ojs.stream.cron``: a stream kept :data:`CRON_STREAM_MAX_AGE` (snapshots keep definitions).

    Returns:
        A new dict.
    """
    return {
        "x-queue-type": "stream",
        "x-max-age": CRON_STREAM_MAX_AGE,
        "x-stream-max-segment-size-bytes": CRON_STREAM_SEGMENT_BYTES,
    }


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


@dataclass(frozen=True)
class CronSnapshot:
    """An ``ojs.cron.snapshot`` record: the registry folded up to the stream offset ``through``.

    ``through`` is None when the writer had read nothing with an offset (an empty stream).
    """

    entries: tuple[CronEntry, ...]
    leader: CronLeader | None
    through: int | None
    at: datetime


CronRecord = CronDefinition | CronRemoval | CronFired | CronLeader | CronSnapshot


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


def _leader_dict(leader: CronLeader) -> dict[str, Any]:
    return {
        "scheduler_id": leader.scheduler_id,
        "host": leader.host,
        "pid": leader.pid,
        "elected_at": format_timestamp(leader.elected_at),
    }


def leader_message(leader: CronLeader) -> OutgoingMessage:
    """The record of an election (persistent)."""
    return json_message(CRON_TYPE_LEADER, _leader_dict(leader), sent_at=leader.elected_at, delivery_mode=2)


def snapshot_message(book: CronBook, through: int | None) -> OutgoingMessage:
    """The snapshot of ``book`` (persistent): every definition with its ticks, and the leader.

    Parameters:
        book: the registry as folded.
        through: the stream offset of the last record folded into ``book`` (None: none).

    Returns:
        The message.
    """

    def ts(value: datetime | None) -> str | None:
        return None if value is None else format_timestamp(value)

    entries = [
        {
            "cron_job": entry.cron.to_dict(),
            "created_at": format_timestamp(entry.created_at),
            "registered_at": format_timestamp(entry.registered_at),
            "last_run_at": ts(entry.last_run_at),
            "last_job_id": entry.last_job_id,
            "run_count": entry.run_count,
        }
        for entry in book.entries.values()
    ]
    body = {
        "entries": entries,
        "leader": None if book.leader is None else _leader_dict(book.leader),
        "through": through,
        "at": format_timestamp(utcnow()),
    }
    return json_message(CRON_TYPE_SNAPSHOT, body, delivery_mode=2)


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


def _integer(data: dict[str, Any], name: str, what: str, *, optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise DecodeError(f"{what}: {name!r} is missing or not a non-negative integer", code="invalid_payload")
    return value


def _leader(data: Any, what: str) -> CronLeader:
    if not isinstance(data, dict):
        raise DecodeError(f"{what} must be a JSON object", code="invalid_payload")
    return CronLeader(
        _text(data, "scheduler_id", what),
        _text(data, "host", what),
        _integer(data, "pid", what),
        _time(data, "elected_at", what),
    )


def _snapshot(data: dict[str, Any]) -> CronSnapshot:
    what = "a cron snapshot"
    items = data.get("entries")
    if not isinstance(items, list):
        raise DecodeError(f"{what}: 'entries' is missing or not a list", code="invalid_payload")
    entries = []
    for item in items:
        if not isinstance(item, dict):
            raise DecodeError(f"{what}: an entry is not a JSON object", code="invalid_payload")
        try:
            cron = CronJob.from_dict(item.get("cron_job"))  # type: ignore[arg-type]
        except ValidationError as exc:
            raise DecodeError(f"{what}: {exc}", code="invalid_payload") from None
        last_run = item.get("last_run_at")
        entries.append(
            CronEntry(
                cron,
                _time(item, "created_at", what),
                _time(item, "registered_at", what),
                None if last_run is None else _time(item, "last_run_at", what),
                _text(item, "last_job_id", what, optional=True),
                _integer(item, "run_count", what),
            )
        )
    leader = data.get("leader")
    return CronSnapshot(
        tuple(entries),
        None if leader is None else _leader(leader, f"{what}'s leader"),
        _integer(data, "through", what, optional=True),
        _time(data, "at", what),
    )


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
    if kind not in (CRON_TYPE_DEFINITION, CRON_TYPE_REMOVED, CRON_TYPE_FIRED, CRON_TYPE_LEADER, CRON_TYPE_SNAPSHOT):
        return None
    if len(body) > (MAX_CRON_SNAPSHOT_BYTES if kind == CRON_TYPE_SNAPSHOT else MAX_CRON_RECORD_BYTES):
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
        return _leader(data, "a cron leader record")
    if kind == CRON_TYPE_SNAPSHOT:
        return _snapshot(data)
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
    snapshot: CronSnapshot | None = None
    """The latest snapshot applied, or None."""
    offset: int | None = None
    """The stream offset of the latest message read (any kind), or None."""
    _since: list[tuple[int, CronRecord]] = field(default_factory=list, repr=False)
    _unread: deque[CronFired] = field(default_factory=lambda: deque(maxlen=1000), repr=False)

    def apply(self, record: CronRecord, offset: int | None = None) -> None:
        """Fold one record in (records are applied in stream order).

        A definition replaces the previous one of its name and keeps its ticks (upsert); a
        removal drops the name; a tick moves ``last_run_at`` forward (an older tick, e.g. of an
        overlapping leader, changes nothing but is not counted twice).  A snapshot replaces
        everything, then the records read after its ``through`` are applied again (they were
        written while it was made); a snapshot through an offset no later than the one applied
        last changes nothing.

        Parameters:
            record: the record.
            offset: its stream offset (``x-stream-offset``); None for a record not read from the
                stream (the leader's own tick, folded before it is read back).
        """
        if offset is not None:
            self.seen(offset)
        if isinstance(record, CronSnapshot):
            self._reset(record)
            return
        if offset is not None:
            self._since.append((offset, record))
        elif isinstance(record, CronFired):
            self._unread.append(record)  # the leader's own tick: a snapshot read before it must not undo it
        self._fold(record)

    def seen(self, offset: int) -> None:
        """Note the stream offset of a message read (a marker, an unreadable record)."""
        self.offset = offset if self.offset is None else max(self.offset, offset)

    def _reset(self, snapshot: CronSnapshot) -> None:
        latest = None if self.snapshot is None else self.snapshot.through
        if latest is not None and (snapshot.through is None or snapshot.through <= latest):
            return
        self.snapshot = snapshot
        self.entries = {entry.cron.name: replace(entry) for entry in snapshot.entries}
        self.leader = snapshot.leader
        through = -1 if snapshot.through is None else snapshot.through
        self._since = [(offset, record) for offset, record in self._since if offset > through]
        for _, record in self._since:
            self._fold(record)
        for fired in self._unread:  # a tick folded again changes nothing (see _fold)
            self._fold(fired)

    def _fold(self, record: CronRecord) -> None:
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
        elif isinstance(record, CronFired):
            entry = self.entries.get(record.name)
            if entry is None or (entry.last_run_at is not None and record.scheduled_time <= entry.last_run_at):
                return
            entry.last_run_at = record.scheduled_time
            if record.job_id is not None:
                entry.last_job_id = record.job_id
                entry.run_count += 1


__all__ = [
    "CRON_SNAPSHOT_INTERVAL",
    "CRON_STREAM_MAX_AGE",
    "CRON_STREAM_SEGMENT_BYTES",
    "CRON_TYPE_DEFINITION",
    "CRON_TYPE_FIRED",
    "CRON_TYPE_LEADER",
    "CRON_TYPE_MARKER",
    "CRON_TYPE_REMOVED",
    "CRON_TYPE_SNAPSHOT",
    "MAX_CRON_RECORD_BYTES",
    "MAX_CRON_SNAPSHOT_BYTES",
    "CronBook",
    "CronDefinition",
    "CronEntry",
    "CronFired",
    "CronLeader",
    "CronRecord",
    "CronRemoval",
    "CronSnapshot",
    "cron_marker_message",
    "cron_stream_arguments",
    "decode_cron_record",
    "definition_message",
    "fired_message",
    "leader_message",
    "removal_message",
    "snapshot_message",
]
