"""The observation service: what the broker and the workers tell about queues, workers and jobs.

The events stream ``ojs.stream.events`` (worker presences, job events), the control
streams replayed as the workers replay them (paused queues), and passive
``Queue.Declare`` counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from amqp import Channel
from amqp.exceptions import NotFound, RecoverableConnectionError
from kombu.connection import Connection

from ojs_kombu.amqp.connection import close_quietly
from ojs_kombu.client.results import QueueCounts
from ojs_kombu.client.session import Service
from ojs_kombu.errors import OjsError, ValidationError
from ojs_kombu.model.naming import validate_queue_name
from ojs_kombu.model.timefmt import utcnow
from ojs_kombu.runtime.control import Cancellations, ControlReader
from ojs_kombu.runtime.presence import read_events
from ojs_kombu.wire.events import JobEventRecord, WorkerPresence

#: A worker whose latest presence is older than this many seconds is not listed by ``workers()``
#: (three presence intervals).
DEFAULT_STALE_AFTER = 15.0

# Timestamp offsets of a stream point at chunks: start reading a little earlier, filter by body times.
_STREAM_OFFSET_SLACK = timedelta(seconds=1)


class Observation(Service):
    """Reads the events and control streams and counts queues through the client's session
    (see :class:`~ojs_kombu.Client`)."""

    def workers(self, stale_after: float, timeout: float) -> list[WorkerPresence]:
        """The live workers, from their latest presence on the events stream (BEAT, DESIGN §14).

        Reads ``ojs.stream.events`` from ``stale_after`` seconds ago and keeps each worker's latest
        presence, unless it is ``offline`` (stopped gracefully) or older than ``stale_after`` (killed,
        hung or cut off: presences come every 5 s by default).  Presence times are the workers'
        clocks: keep hosts in sync (NTP).  Serves :meth:`ojs_kombu.Client.workers`.

        Parameters:
            stale_after: seconds after which a silent worker counts as gone.
            timeout: seconds to wait for the read to catch up with the stream.

        Returns:
            One presence per live worker, sorted by worker id.

        Raises:
            ValidationError: ``stale_after`` is not > 0.
            TopologyError: ``ojs.stream.events`` exists and is not a stream.
            OjsError: the read did not catch up within ``timeout``.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`ojs_kombu.Client.enqueue`.
        """
        if isinstance(stale_after, bool) or not isinstance(stale_after, int | float) or not stale_after > 0:
            raise ValidationError(f"stale_after must be > 0 seconds, got {stale_after!r}", field="stale_after")
        horizon = utcnow() - timedelta(seconds=stale_after)
        latest: dict[str, WorkerPresence] = {}

        def keep(record: WorkerPresence | JobEventRecord) -> bool:
            if isinstance(record, WorkerPresence):
                known = latest.get(record.worker_id)
                if known is None or record.sent_at >= known.sent_at:
                    latest[record.worker_id] = record
            return True

        self._read_events(horizon, keep, latest.clear, timeout)
        live = [p for p in latest.values() if p.state == "online" and p.sent_at >= horizon]
        return sorted(live, key=lambda presence: presence.worker_id)

    def events(
        self, since: datetime | timedelta, queue: str | None, limit: int | None, timeout: float
    ) -> list[JobEventRecord]:
        """Job lifecycle events read back from the events stream, oldest first (:meth:`ojs_kombu.Client.events`).

        Workers publish them only when opted in (``Worker(events=True)``); the stream
        keeps them for its retention (default one hour, :class:`~ojs_kombu.wire.events.EventsOptions`).

        Parameters:
            since: an aware datetime, or how long ago (``timedelta(minutes=10)``).
            queue: only the events of this OJS queue.
            limit: at most this many (the oldest ones).
            timeout: seconds to wait for the read to catch up with the stream.

        Returns:
            The events at or after ``since``, in the order the stream holds them.

        Raises:
            ValidationError: a naive datetime, a bad queue name or a ``limit`` below 1.
            TopologyError: ``ojs.stream.events`` exists and is not a stream.
            OjsError: the read did not catch up within ``timeout``.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`ojs_kombu.Client.enqueue`.
        """
        start = utcnow() - since if isinstance(since, timedelta) else since
        if not isinstance(start, datetime) or start.tzinfo is None or start.utcoffset() is None:
            raise ValidationError(f"since must be an aware datetime or a timedelta, got {since!r}", field="since")
        if queue is not None:
            validate_queue_name(queue)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValidationError(f"limit must be a positive integer, got {limit!r}", field="limit")
        found: list[JobEventRecord] = []

        def keep(record: WorkerPresence | JobEventRecord) -> bool:
            if isinstance(record, JobEventRecord) and record.at >= start and queue in (None, record.queue):
                found.append(record)
            return limit is None or len(found) < limit

        self._read_events(start, keep, found.clear, timeout)
        return found

    def _read_events(
        self,
        since: datetime,
        on_event: Callable[[WorkerPresence | JobEventRecord], bool],
        reset: Callable[[], None],
        timeout: float,
    ) -> None:
        """Read the events stream from ``since`` (see :func:`~ojs_kombu.runtime.presence.read_events`);
        ``reset`` forgets what an attempt that failed had collected before the next one."""
        session = self.session

        def read(conn: Connection) -> None:
            reset()
            read_events(
                conn.connection,
                session.names,
                session.topology,
                since - _STREAM_OFFSET_SLACK,
                on_event,
                timeout=timeout,
            )

        session.run(read)

    def queue_counts(self, amqp_queues: Iterable[str]) -> dict[str, QueueCounts | None]:
        """Ready messages and consumers of AMQP queues, exact and current (passive ``Queue.Declare``).

        Serves :meth:`ojs_kombu.Client.queue_counts`.

        Parameters:
            amqp_queues: full AMQP queue names (``ojs.queue.email``, ``ojs.schedule.03`` …).

        Returns:
            Each name with its :class:`~ojs_kombu.client.results.QueueCounts`, or None when the queue does not exist.

        Raises:
            BrokerConnectionError, BrokerRefusedError: as for :meth:`ojs_kombu.Client.enqueue`.
        """
        wanted = list(dict.fromkeys(amqp_queues))

        def inspect(conn: Connection) -> dict[str, QueueCounts | None]:
            counts: dict[str, QueueCounts | None] = {}
            channel: Channel | None = None
            try:
                for name in wanted:
                    channel = channel or conn.connection.channel()
                    try:
                        _, ready, consumers = channel.queue_declare(name, passive=True)
                    except NotFound:
                        counts[name], channel = None, None  # the broker closed the channel
                        continue
                    counts[name] = QueueCounts(int(ready), int(consumers))
            finally:
                if channel is not None:
                    close_quietly(channel)
            return counts

        return self.session.run(inspect)

    def paused_queues(self, queues: Iterable[str], timeout: float) -> dict[str, bool | None]:
        """Whether each OJS queue is paused, as its workers see it: its control stream read from the start.

        Each control stream is declared if missing, then replayed with the workers' own
        :class:`~ojs_kombu.runtime.control.ControlReader` (one small marker record is published to
        know it caught up).  Every retained cancel is read: 1 s for 10,000, 5.5 s for 50,000.
        Serves :meth:`ojs_kombu.Client.paused_queues`.

        Parameters:
            queues: OJS queue names.
            timeout: seconds to wait for the replay.

        Returns:
            Each queue: True (paused), False, or None when its control queue is a classic
            queue (degraded mode: no history to read).

        Raises:
            ValidationError: a bad queue name.
            OjsError: the streams were not replayed within ``timeout``.
            BrokerConnectionError, BrokerRefusedError: as for :meth:`ojs_kombu.Client.enqueue`.
        """
        wanted = [validate_queue_name(q) for q in dict.fromkeys(queues)]
        session = self.session

        def read(conn: Connection) -> dict[str, bool | None]:
            for queue in wanted:
                session.topology.declare(conn.connection, session.topology.control_specs(queue))
            streams = [q for q in wanted if session.topology.control_is_stream(q)]
            reader = ControlReader(session.names, session.topology, streams, Cancellations(), replay_timeout=timeout)
            if streams:
                try:
                    close_quietly(reader.attach(conn.connection))
                except RecoverableConnectionError as exc:  # the replay was too slow: not worth a reconnect
                    session.drop(conn)  # its channel still consumes the streams
                    raise OjsError(f"reading the control streams: {exc}") from None
            return {q: (q in reader.paused) if q in streams else None for q in wanted}

        return session.run(read)


__all__ = ["DEFAULT_STALE_AFTER", "Observation"]
