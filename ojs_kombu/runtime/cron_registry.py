"""The cron registry on RabbitMQ alone: definitions on the cron stream (ojs-cron.md; DESIGN §20).

The registry is the stream ``ojs.stream.cron`` (:mod:`ojs_kombu.wire.cron`): registering
publishes a definition record, removing a removal record, and reading the stream from its
first record up to a marker of one's own folds it into the current definitions (the latest
record per name wins).  :class:`CronRegistry` does that over any connection provider, so
:class:`~ojs_kombu.Client` delegates ``register_cron`` / ``crons`` / ``remove_cron`` to it;
:class:`CronStreamReader` is the reading, shared with the scheduler
(:class:`~ojs_kombu.runtime.cron.CronScheduler`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from amqp import Channel
from amqp import Message as WireMessage

from ojs_kombu.amqp.connection import close_quietly, make_connection, resolve_url
from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import DecodeError, NotFoundError, OjsError, ValidationError
from ojs_kombu.model.cron import CronJob, OverlapPolicy
from ojs_kombu.model.naming import Names
from ojs_kombu.model.timefmt import format_timestamp, utcnow
from ojs_kombu.policy.cron import first_due
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.cron import (
    CRON_SNAPSHOT_INTERVAL,
    CronBook,
    CronEntry,
    CronLeader,
    cron_marker_message,
    decode_cron_record,
    definition_message,
    removal_message,
    snapshot_message,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
Runner = Callable[[Callable[[Any], T]], T]
"""Runs ``operation(kombu_connection)`` on a connected connection (what ``Client._run`` does)."""

DEFAULT_READ_TIMEOUT = 10.0
"""Seconds a read of the cron stream waits for its marker."""


@dataclass(frozen=True)
class RegisteredCron(CronJob):
    """A registered cron job with the system-managed fields of spec §2.2.

    Attributes:
        created_at: first registration (since the last removal).
        last_run_at: the latest occurrence handled (fired or skipped), or None.
        next_run_at: the next occurrence, or None when disabled (CRON-28) or none comes.
        run_count: occurrences fired.
        last_job_id: the job of the latest occurrence fired.
    """

    created_at: datetime | None = None
    last_run_at: datetime | None = None
    next_run_at: datetime | None = None
    run_count: int = 0
    last_job_id: str | None = None

    @property
    def definition(self) -> CronJob:
        """The plain definition (without the system-managed fields)."""
        return CronJob.from_dict(CronJob.to_dict(self))

    def to_dict(self) -> dict[str, Any]:
        """The spec §8.3 object: the definition and the system-managed fields (times in RFC 3339)."""

        def ts(value: datetime | None) -> str | None:
            return None if value is None else format_timestamp(value)

        return {
            **super().to_dict(),
            "last_run_at": ts(self.last_run_at),
            "next_run_at": ts(self.next_run_at),
            "run_count": self.run_count,
            "created_at": ts(self.created_at),
        }


def next_run_of(entry: CronEntry) -> datetime | None:
    """The occurrence ``entry`` waits for; None when disabled (CRON-28)."""
    if not entry.cron.enabled:
        return None
    return first_due(entry.cron.expression, entry.cron.zone, entry.registered_at, entry.last_run_at)


def registered(entry: CronEntry) -> RegisteredCron:
    """``entry`` as a :class:`RegisteredCron` (with its next run computed now)."""
    return RegisteredCron(
        **CronJob.to_dict(entry.cron),
        created_at=entry.created_at,
        last_run_at=entry.last_run_at,
        next_run_at=next_run_of(entry),
        run_count=entry.run_count,
        last_job_id=entry.last_job_id,
    )


class CronStreamReader:
    """Reads ``ojs.stream.cron`` from its first record into a :class:`~ojs_kombu.wire.cron.CronBook`.

    Parameters:
        names: the entity names.
        book: where records are folded (a new one by default).
        on_record: called after each record is folded (in the connection's thread).
    """

    def __init__(
        self, names: Names, book: CronBook | None = None, on_record: Callable[[Any], None] | None = None
    ) -> None:
        self.names = names
        self.book = book if book is not None else CronBook()
        self.on_record = on_record
        self.channel: Channel | None = None
        self._seen_markers: set[str] = set()
        self.records = 0
        self._snapshot_made_at: datetime | None = None
        self.first_offset: int | None = None
        """The stream offset of the first message read (> 0 once retention dropped the stream's head)."""

    def attach(self, connection: Any) -> Channel:
        """Consume the stream from its first record on a new channel of ``connection`` (py-amqp).

        Returns:
            The channel.
        """
        channel: Channel = connection.channel()
        channel.auto_decode = False
        channel.basic_qos(0, 1000, False)
        channel.basic_consume(
            self.names.cron_stream, no_ack=False, callback=self._on_message, arguments={"x-stream-offset": "first"}
        )
        self.channel = channel
        self._seen_markers.clear()
        self.first_offset = None
        return channel

    def snapshot_due(self, now: datetime) -> bool:
        """Whether the latest snapshot read or made here is older than
        :data:`~ojs_kombu.wire.cron.CRON_SNAPSHOT_INTERVAL` (or there is none)."""
        read = None if self.book.snapshot is None else self.book.snapshot.at
        times = [t for t in (self._snapshot_made_at, read) if t is not None]
        return not times or now - max(times) >= CRON_SNAPSHOT_INTERVAL

    def snapshot(self) -> OutgoingMessage:
        """A snapshot of the book through the last offset read (to publish; it counts for :meth:`snapshot_due`)."""
        self._snapshot_made_at = utcnow()
        return snapshot_message(self.book, self.book.offset)

    def mark(self) -> str:
        """Publish a marker to the stream; :meth:`wait` returns once it is read back.

        Returns:
            The marker's id.
        """
        assert self.channel is not None
        marker = cron_marker_message()
        self.channel.basic_publish(
            WireMessage(marker.body, **marker.properties), exchange="", routing_key=self.names.cron_stream
        )
        return str(marker.properties["message_id"])

    def wait(self, connection: Any, marker_id: str, timeout: float) -> None:
        """Read until the marker ``marker_id`` came back: every record published before it is folded.

        Raises:
            OjsError: not within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while marker_id not in self._seen_markers:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OjsError(f"reading {self.names.cron_stream}: not caught up within {timeout:.0f}s")
            try:
                connection.drain_events(timeout=min(remaining, 1.0))
            except TimeoutError:
                continue
        self._seen_markers.discard(marker_id)

    def _on_message(self, message: WireMessage) -> None:
        assert self.channel is not None
        self.channel.basic_ack(message.delivery_info["delivery_tag"], multiple=True)
        properties = dict(message.properties)
        offset = (properties.get("application_headers") or {}).get("x-stream-offset")
        if not isinstance(offset, int) or isinstance(offset, bool):
            offset = None
        elif self.first_offset is None:
            self.first_offset = offset
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
        try:
            record = decode_cron_record(body, properties)
        except DecodeError as exc:
            logger.warning("ignoring an unreadable record of %s: %s", self.names.cron_stream, exc)
            record = None
        if record is None:
            if offset is not None:
                self.book.seen(offset)
            message_id = properties.get("message_id")
            if isinstance(message_id, str):
                self._seen_markers.add(message_id)
            return
        self.book.apply(record, offset)
        self.records += 1
        if self.on_record is not None:
            self.on_record(record)


def _publish_confirmed(connection: Any, names: Names, message: OutgoingMessage, timeout: float) -> None:
    """Publish one record to the cron stream and wait for its confirm."""
    publisher = ConfirmedPublisher(connection, window=10)
    try:
        ticket = publisher.publish(message, exchange="", routing_key=names.cron_stream, queue=names.cron_stream)
        publisher.wait([ticket], timeout)
        ticket.raise_for_error()
    finally:
        publisher.close()


class CronRegistry:
    """Register, remove and list cron jobs through the broker (ojs-cron.md §8; DESIGN §20).

    Parameters:
        run: runs ``operation(kombu_connection)`` on a connected kombu connection (the Client's
            ``_run``); see :meth:`connect` for a registry with a connection of its own.
        names: the deployment's entity names.
        topology: declares the cron stream (default: a new one for ``names``).
        timeout: seconds a read or a publish waits.
    """

    def __init__(
        self, run: Runner[Any], names: Names, topology: Topology | None = None, *, timeout: float = DEFAULT_READ_TIMEOUT
    ) -> None:
        self._run = run
        self.names = names
        self.topology = topology or Topology(names)
        self.timeout = timeout
        self._owned: Any = None
        self._stream_ready = False

    @classmethod
    def connect(
        cls,
        url: str | None = None,
        *,
        names: Names | None = None,
        ssl: Any = None,
        transport_options: dict[str, Any] | None = None,
        timeout: float = DEFAULT_READ_TIMEOUT,
    ) -> CronRegistry:
        """A registry with a connection of its own (the CLI's); :meth:`close` it.

        Parameters:
            url: the broker URL (default ``$OJS_AMQP_URL``).
            names: the deployment's entity names.
            ssl, transport_options: as for :class:`~ojs_kombu.Client`.
            timeout: seconds a read or a publish waits.

        Returns:
            The registry.
        """
        conn = make_connection(
            resolve_url(url), heartbeat=60, ssl=ssl, transport_options=transport_options, connection_name="ojs-cron"
        )

        def run(operation: Callable[[Any], Any]) -> Any:
            with map_exceptions(url=resolve_url(url)):
                conn.ensure_connection(max_retries=1)
                return operation(conn)

        registry = cls(run, names or Names(), timeout=timeout)
        registry._owned = conn
        return registry

    def close(self) -> None:
        """Close the connection of a registry made by :meth:`connect`."""
        if self._owned is not None:
            self._owned.release()
            self._owned = None

    def __enter__(self) -> CronRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def register(self, cron: CronJob) -> RegisteredCron:
        """Register ``cron``, or replace the definition of its name (upsert, CRON-26).

        Parameters:
            cron: the definition (already validated: CRON-11).

        Returns:
            It as registered (``next_run_at`` computed, CRON-07; ticks of a previous definition kept).

        Raises:
            ValidationError: ``cron`` is not a CronJob.
            PublishError, BrokerConnectionError, BrokerRefusedError: the broker did not take it.
        """
        if not isinstance(cron, CronJob):
            raise ValidationError(f"expected a CronJob, got {type(cron).__name__}", field="cron")
        definition = CronJob.from_dict(CronJob.to_dict(cron))  # a RegisteredCron's system fields dropped
        message = definition_message(definition)

        def operation(conn: Any) -> None:
            self._ensure_stream(conn.connection)
            _publish_confirmed(conn.connection, self.names, message, self.timeout)

        self._run(operation)
        book = self._read()
        entry = book.entries.get(definition.name)
        if entry is None:  # removed again meanwhile by someone else
            raise NotFoundError(f"cron job {definition.name!r} was removed while it was registered", reply_code=404)
        return registered(entry)

    def register_cron(
        self,
        name: str,
        expression: str,
        job_type: str,
        args: list[Any] | tuple[Any, ...] = (),
        *,
        queue: str,
        timezone: str = "UTC",
        overlap_policy: OverlapPolicy = "skip",
        enabled: bool = True,
        description: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> RegisteredCron:
        """Build a :class:`~ojs_kombu.model.cron.CronJob` and :meth:`register` it (``Client.register_cron``).

        Parameters:
            name, expression, job_type, args, timezone, overlap_policy, enabled, description:
                the definition's ``name``, ``cron``, ``type``, ``args`` ...
            queue: where each occurrence's job goes (``options["queue"]``).
            options: further job options (``timeout``, ``retry``, ``tags``, ``meta``, ``rate_limit``).

        Returns:
            As :meth:`register`.

        Raises:
            ValidationError: naming the bad field; as :meth:`register`.
        """
        cron = CronJob(
            name=name,
            cron=expression,
            type=job_type,
            args=list(args) if isinstance(args, tuple) else args,  # a dict is refused, not made a list of its keys
            timezone=timezone,
            options={**(options or {}), "queue": queue},
            overlap_policy=overlap_policy,
            enabled=enabled,
            description=description,
        )
        return self.register(cron)

    def remove(self, name: str) -> None:
        """Remove the cron job ``name``; jobs it enqueued are not affected (spec §8.4).

        Raises:
            NotFoundError: no cron job has that name (CRON-27).
            PublishError, BrokerConnectionError, BrokerRefusedError: the broker did not take it.
        """
        if name not in self._read().entries:
            raise NotFoundError(f"no cron job is named {name!r}", reply_code=404)
        message = removal_message(name)

        def operation(conn: Any) -> None:
            _publish_confirmed(conn.connection, self.names, message, self.timeout)

        self._run(operation)

    def list(self, *, enabled: bool | None = None) -> list[RegisteredCron]:
        """The registered cron jobs, by name, with their last and next runs (spec §8.2).

        Parameters:
            enabled: only the enabled (True) or disabled (False) ones (CRON-S06); None: all.

        Returns:
            The cron jobs.
        """
        entries = self._read().entries
        found = [registered(entries[name]) for name in sorted(entries)]
        return [c for c in found if enabled is None or c.enabled is enabled]

    def leader(self) -> CronLeader | None:
        """The scheduler elected last, as it recorded itself on the stream (it may have died since)."""
        return self._read().leader

    def get(self, name: str) -> RegisteredCron:
        """The cron job ``name`` (spec §8.3).

        Raises:
            NotFoundError: no cron job has that name.
        """
        entry = self._read().entries.get(name)
        if entry is None:
            raise NotFoundError(f"no cron job is named {name!r}", reply_code=404)
        return registered(entry)

    def _ensure_stream(self, connection: Any) -> None:
        """Declare the cron stream once per registry: a stream created before it had a retention
        differs in ``x-max-age``, which the topology warns about on every declaration (fixed with a
        policy, see docs/periodic-jobs.md); a ``Client.crons()`` polled would log it on every call."""
        if not self._stream_ready:
            self.topology.ensure_cron(connection)
            self._stream_ready = True

    def _read(self) -> CronBook:
        def operation(conn: Any) -> CronBook:
            connection = conn.connection
            self._ensure_stream(connection)
            reader = CronStreamReader(self.names)
            channel = reader.attach(connection)
            try:
                reader.wait(connection, reader.mark(), self.timeout)
            finally:
                close_quietly(channel)
            if reader.snapshot_due(utcnow()) and reader.book.entries:
                # No scheduler wrote one lately: keep the definitions past the stream's retention.
                _publish_confirmed(connection, self.names, reader.snapshot(), self.timeout)
            return reader.book

        book: CronBook = self._run(operation)
        return book


def cron_job_json(cron: RegisteredCron) -> str:
    """``cron`` as one JSON line (the CLI's ``--json``)."""
    return json.dumps(cron.to_dict(), separators=(",", ":"))


__all__ = [
    "DEFAULT_READ_TIMEOUT",
    "CronRegistry",
    "CronStreamReader",
    "RegisteredCron",
    "Runner",
    "cron_job_json",
    "next_run_of",
    "registered",
]
