"""Periodic jobs on RabbitMQ alone: the cron scheduler, over the cron registry (ojs-cron.md; DESIGN §20).

**The registry** is the stream ``ojs.stream.cron`` (:mod:`ojs_kombu.wire.cron`): registering
publishes a definition record, removing a removal record, and reading the stream from its
first record up to a marker of one's own folds it into the current definitions (the latest
record per name wins).  :class:`CronRegistry` does that over any connection provider, so
:class:`~ojs_kombu.Client` delegates ``register_cron`` / ``crons`` / ``remove_cron`` to it
(:mod:`ojs_kombu.runtime.cron_registry`; its names are importable from here too).

**The scheduler** (:class:`CronScheduler`, ``ojs-amqp cron run``) replays the stream at start
and follows it live; any number may run.  Each holds a
:class:`~ojs_kombu.runtime.leader.LeaderLease`, and only the leader fires: on each due
occurrence it

1. checks the lease (:attr:`~ojs_kombu.runtime.leader.LeaderLease.is_leader`) right before
   publishing: a leader that lost the lease stops firing at once;
2. derives the job id from the cron name and the scheduled time
   (:func:`~ojs_kombu.model.cron.tick_job_id`), so two overlapping leaders publish the same id;
3. passes :meth:`CronScheduler.claim_tick` (the seam of the unique lock, ``ojs_kombu.amqp.locks``:
   today it claims every tick);
4. applies the overlap policy, publishes the job confirmed (``meta.cron_name``,
   ``meta.cron_triggered_at`` = the scheduled time, RFC 3339), then an ``ojs.cron.fired`` record
   on the cron stream and a ``cron.triggered`` event on the events stream.

The ``fired`` records tell every scheduler the last run of each cron job: a newly elected
leader first reads the cron stream up to a marker of its own (everything the old leader
wrote before it lost the lease), then continues from the last run, firing at most one missed
occurrence (CRON-25).

**Overlap policies** (spec §6).  Whether the previous tick's job is still active is read from
the job lifecycle events on the events stream (``Worker(events=True)``): active when its latest
event is ``started``, ``failed`` or ``retried``.  ``skip`` then skips the occurrence
(``cron.skipped``, reason ``overlap_skip``); ``cancel_previous`` cancels the previous job
through the control plane and fires; ``allow`` fires.  ``enqueue`` fires too, and each of its
jobs carries :attr:`~ojs_kombu.model.cron.CronJob.rate_limit` (concurrency 1, keyed by the cron
job's name, unless its options carry one), so the workers' concurrency limits run the
occurrences one at a time, across processes (CRON-18).
Without job events (workers not publishing them) a job waiting in its queue or running is
not seen: ``skip`` and ``cancel_previous`` then behave as ``allow``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict, deque
from datetime import datetime, timedelta
from typing import Any

from amqp import Channel
from amqp import Message as WireMessage

from ojs_kombu.amqp.connection import resolve_url, safe_url
from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.failover import Failover
from ojs_kombu.amqp.locks import Held, UniqueLocks
from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.amqp.reconnect import Forever, Reconnector
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import (
    BrokerRefusedError,
    DecodeError,
    OjsError,
    PublishError,
    TopologyError,
)
from ojs_kombu.model.cron import CronJob, tick_job_id
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import Names
from ojs_kombu.model.timefmt import format_timestamp, utcnow
from ojs_kombu.policy.cron import MAX_EVALUATION_INTERVAL, MIN_EVALUATION_INTERVAL, dst_skipped, due, first_due
from ojs_kombu.runtime.cron_registry import (
    DEFAULT_READ_TIMEOUT,
    CronRegistry,
    CronStreamReader,
    RegisteredCron,
    Runner,
    cron_job_json,
    next_run_of,
    registered,
)
from ojs_kombu.runtime.leader import LeaderLease
from ojs_kombu.wire.codec import OutgoingMessage, encode
from ojs_kombu.wire.control import cancel_message
from ojs_kombu.wire.cron import (
    CronBook,
    CronDefinition,
    CronEntry,
    CronFired,
    CronLeader,
    CronRemoval,
    fired_message,
    leader_message,
)
from ojs_kombu.wire.events import CronEvent, CronSkipReason, JobEventRecord, cron_event_message, decode_event

logger = logging.getLogger(__name__)

#: How long the lock of a fired tick (:meth:`CronScheduler.claim_tick`) and its queues live: far longer than
#: two leaders can overlap (the old one stops at its next lease check), short enough that a cron firing
#: every second leaves at most ~1,200 idle queue pairs behind.
TICK_LOCK_TTL = timedelta(minutes=10)

#: Seconds of job events a scheduler reads back at start to know which tick jobs are active.
ACTIVITY_LOOKBACK = timedelta(hours=1)
#: Job ids whose latest lifecycle event a scheduler remembers.
MAX_TRACKED_JOBS = 10_000
_ACTIVE_EVENTS = frozenset({"started", "failed", "retried"})
#: More queued occurrences of one ``enqueue`` cron job than this are logged as a warning (CRON-S04).
MAX_QUEUED_OCCURRENCES = 2


class _Activity:
    """The latest lifecycle event of recent jobs, from the events stream (bounded)."""

    def __init__(self, limit: int = MAX_TRACKED_JOBS) -> None:
        self._latest: OrderedDict[str, str] = OrderedDict()
        self._limit = limit

    def record(self, event: JobEventRecord) -> None:
        self._latest[event.job_id] = event.event
        self._latest.move_to_end(event.job_id)
        while len(self._latest) > self._limit:
            self._latest.popitem(last=False)

    def is_active(self, job_id: str | None) -> bool:
        return job_id is not None and self._latest.get(job_id) in _ACTIVE_EVENTS

    def seen(self, job_id: str) -> bool:
        """Whether any lifecycle event of ``job_id`` was read (a worker took it)."""
        return job_id in self._latest


class CronScheduler:
    """Fires the registered cron jobs; any number may run, the leader fires (see the module).

    Parameters:
        url: the broker URL (or a failover list); default ``$OJS_AMQP_URL``.
        names: the deployment's entity names (or ``prefix``).
        prefix: the entity prefix, when ``names`` is not given.
        ssl, transport_options: as for :class:`~ojs_kombu.Client`.
        lease_options: keyword arguments of the :class:`~ojs_kombu.runtime.leader.LeaderLease`
            (``heartbeat``, ``renew_interval``, ``renew_timeout``).
        heartbeat: AMQP heartbeat of the scheduler's own connection, in seconds.
        scheduler_id: how this instance names itself in logs (default ``host.pid.random``).

    Raises:
        ValidationError: a bad URL, prefix or option.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        names: Names | None = None,
        prefix: str = "",
        ssl: Any = None,
        transport_options: dict[str, Any] | None = None,
        lease_options: dict[str, Any] | None = None,
        heartbeat: float = 30.0,
        scheduler_id: str | None = None,
    ) -> None:
        self.url = resolve_url(url)
        self.names = names or Names(prefix)
        self.topology = Topology(self.names)
        self.scheduler_id = scheduler_id or f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
        self.lease = LeaderLease(
            self.url,
            names=self.names,
            ssl=ssl,
            transport_options=transport_options,
            connection_name=f"ojs-cron-leader {self.scheduler_id}",
            **(lease_options or {}),
        )
        self._failover = Failover(
            self.url,
            heartbeat=heartbeat,
            ssl=ssl,
            transport_options=transport_options,
            connection_name=f"ojs-cron-scheduler {self.scheduler_id}",
        )
        self._connection = self._failover.connection()
        # Transient failures are retried until stop(); a permanent refusal stops the scheduler.
        self._reconnect = Reconnector(Forever(), self._failover, url=self.url, name="cron scheduler")
        self.book = CronBook()
        self._activity = _Activity()
        self._queued: dict[str, deque[str]] = {}  # enqueue policy: fired jobs no worker took yet
        self._taken: set[str] = set()  # enqueue policy: cron jobs one of whose jobs was seen taken
        self._gaps_checked: dict[str, datetime] = {}  # how far dst_skip occurrences were reported
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._synced = False  # caught up with the stream since this instance became the leader
        self._publisher: ConfirmedPublisher | None = None
        self._tick_locks: UniqueLocks | None = None
        self._planned = 0.0
        self.ready = threading.Event()
        """Set once the scheduler replayed the cron stream (and after each reconnect)."""
        self.fired = 0
        """Occurrences this instance fired (jobs published)."""
        self.skipped = 0
        """Occurrences this instance skipped (overlap, disabled)."""
        self.error: OjsError | None = None
        """The permanent error that stopped the scheduler, or None."""

    @property
    def is_leader(self) -> bool:
        """Whether this instance holds the lease now."""
        return self.lease.is_leader

    # -- running ----------------------------------------------------------------------------------

    def run(self) -> None:
        """Run until :meth:`stop` (or a permanent error: raised).

        Raises:
            BrokerRefusedError, TopologyError: the broker refused the scheduler for good.
        """
        self.lease.start()
        errors = (
            OjsError,
            TimeoutError,
            OSError,
            *self._connection.connection_errors,
            *self._connection.channel_errors,
        )
        try:
            while not self._stopping.is_set():
                try:
                    self._connect()
                    self._serve()
                except TopologyError:
                    raise  # an entity exists with other arguments: permanent, like a refusal
                except errors as exc:
                    self.ready.clear()
                    self._disconnect(graceful=False)
                    self._stopping.wait(self._reconnect.failed(exc, self._connection))
        except (BrokerRefusedError, TopologyError) as exc:
            self.error = exc
            logger.error("cron scheduler stopped: %s", exc)
            raise
        finally:
            self._disconnect(graceful=True)
            self.lease.stop()

    def start(self) -> CronScheduler:
        """Run in a background thread (tests, embedding); :meth:`stop` ends it.

        Returns:
            self.
        """
        if self._thread is None:
            self._thread = threading.Thread(target=self._run_quietly, name="ojs-cron-scheduler", daemon=True)
            self._thread.start()
        return self

    def _run_quietly(self) -> None:
        try:
            self.run()
        except OjsError:
            pass  # kept in self.error

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop firing, give the lease up and disconnect.

        Parameters:
            timeout: seconds to wait for a background thread (:meth:`start`).
        """
        self._stopping.set()
        self.lease.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> CronScheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def crons(self) -> list[RegisteredCron]:
        """The cron jobs as this instance knows them (from the stream it follows)."""
        return [registered(self.book.entries[name]) for name in sorted(self.book.entries)]

    # -- the connection's thread ----------------------------------------------------------------

    def _connect(self) -> None:
        with map_exceptions(url=self.url):
            self._reconnect.connecting()
            self._failover.connect(self._connection)
            connection = self._connection.connection
            self.topology.ensure_cron(connection)
            self.topology.ensure_events(connection)
            self.book = CronBook()
            self._reader = CronStreamReader(self.names, self.book, self._on_record)
            self._reader.attach(connection)
            self._reader.wait(connection, self._reader.mark(), DEFAULT_READ_TIMEOUT * 6)
            if self.topology.events_is_stream():
                self._follow_events(connection)
            self._publisher = ConfirmedPublisher(connection, window=100)
            self._events_channel = connection.channel()
        self._reconnect.succeeded()
        self._reconnect.reset()
        self._synced = False
        self.ready.set()
        logger.info(
            "cron scheduler %s: %d cron job(s) replayed from %s (%s)",
            self.scheduler_id,
            len(self.book.entries),
            self.names.cron_stream,
            safe_url(self._failover.current),
        )

    def _follow_events(self, connection: Any) -> None:
        channel: Channel = connection.channel()
        channel.auto_decode = False
        channel.basic_qos(0, 1000, False)

        def on_message(message: WireMessage) -> None:
            channel.basic_ack(message.delivery_info["delivery_tag"], multiple=True)
            body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
            try:
                record = decode_event(body, dict(message.properties))
            except DecodeError:
                return
            if isinstance(record, JobEventRecord):
                self._activity.record(record)

        channel.basic_consume(
            self.names.events_stream,
            no_ack=False,
            callback=on_message,
            arguments={"x-stream-offset": utcnow() - ACTIVITY_LOOKBACK},
        )

    def _serve(self) -> None:
        connection = self._connection.connection
        self._planned = 0.0  # monotonic time of the next evaluation
        with map_exceptions(url=self.url):
            while not self._stopping.is_set():
                if not self.lease.is_leader:
                    self._synced, self._planned = False, 0.0  # evaluate at once when elected
                    timeout = 0.5
                else:
                    if time.monotonic() >= self._planned:
                        fired, wait = self._evaluate()
                        floor = self._planned + MIN_EVALUATION_INTERVAL if fired else 0.0
                        self._planned = self._next_evaluation(floor, time.monotonic(), wait)
                    timeout = min(0.5, max(0.001, self._planned - time.monotonic()))
                try:
                    connection.drain_events(timeout=timeout)
                except TimeoutError:
                    pass
                connection.heartbeat_tick()

    @staticmethod
    def _next_evaluation(floor: float, now: float, wait: float) -> float:
        """When to evaluate next (monotonic): when the earliest occurrence is due (1 ms after, so the
        clock has passed it), not before ``floor`` and at most 60 s from now (spec §7.3).

        After an evaluation that fired, ``floor`` is one second after it was *planned* (CRON-24:
        measured from the plan, so the lateness of one tick does not add up into the next); after
        one that found nothing due (a wake-up a little early, a new definition) there is none.
        """
        return min(now + MAX_EVALUATION_INTERVAL, max(floor, now + wait + 0.001))

    def _on_record(self, record: Any) -> None:
        """A definition or removal read from the stream: evaluate again soon (still once a second at most)."""
        if isinstance(record, CronDefinition | CronRemoval) and self._synced:
            self._planned = min(self._planned, time.monotonic())

    def _evaluate(self) -> tuple[bool, float]:
        """Fire what is due; returns whether anything fired, and the seconds until the earliest next occurrence."""
        if not self._synced:
            # Newly elected: read what the previous leader wrote before it lost the lease.
            self._reader.wait(self._connection.connection, self._reader.mark(), DEFAULT_READ_TIMEOUT)
            self._synced = True
            leader = CronLeader(self.scheduler_id, socket.gethostname(), os.getpid(), utcnow())
            self._publish(leader_message(leader), "", self.names.cron_stream, self.names.cron_stream)
            self.book.apply(leader)
            self._publish_snapshot()
            logger.info("cron scheduler %s: leader, %d cron job(s)", self.scheduler_id, len(self.book.entries))
        elif self._reader.snapshot_due(utcnow()):
            self._publish_snapshot()
        wait, fired = MAX_EVALUATION_INTERVAL, False
        for entry in list(self.book.entries.values()):
            cron = entry.cron
            since = entry.last_run_at or entry.registered_at
            # A disabled job's occurrences are skipped, not fired (CRON-30 ``disabled``).
            upcoming = next_run_of(entry) if cron.enabled else first_due(cron.expression, cron.zone, since, None)
            if upcoming is None:
                continue
            now = utcnow()
            self._report_dst_skips(entry, since, now)
            outcome = due(
                entry.cron.expression,
                entry.cron.zone,
                upcoming,
                now,
                anchor=entry.last_run_at or entry.registered_at,
            )
            if outcome.fire_at is not None:
                if not self.lease.is_leader:
                    self._synced = False
                    return fired, MIN_EVALUATION_INTERVAL
                if cron.enabled:
                    self._fire(entry, outcome.fire_at, now)
                else:
                    self._skip(entry, outcome.fire_at, now, "disabled", None)
                fired = True
                upcoming = outcome.next_run_at
            if upcoming is not None:
                wait = min(wait, (upcoming - utcnow()).total_seconds())
        return fired, wait

    def claim_tick(self, cron: CronJob, scheduled_time: datetime, job_id: str) -> bool:
        """Whether this tick may fire: the unique lock of its derived id (``ojs_kombu.amqp.locks``, DESIGN §20).

        Two leaders overlapping for a moment (the old one has not noticed it lost the lease)
        both reach here with the same ``job_id``; the lock ``ojs.lock.cron.{job_id}`` lets one
        of them fire.  The holder is this scheduler (and the tick), so a claim retried after a
        reconnect is still ours.  Tick locks are never released: they expire after
        :data:`TICK_LOCK_TTL` (token and queues), and are not persistent (a broker restart
        frees them; the cron stream's ``fired`` records still tell a new leader the last run).
        A claim that fails for another reason than the connection fires the tick (a duplicate
        id is better than a lost tick: ``Worker(deduplicate=True)`` drops it).

        Parameters:
            cron: the cron job.
            scheduled_time: the occurrence.
            job_id: its derived job id.

        Returns:
            True to fire, False when another scheduler claimed it already.
        """
        connection = self._connection.connection
        if self._tick_locks is None or self._tick_locks.connection is not connection:
            self._tick_locks = UniqueLocks(
                connection, names=self.names, queue_expires=TICK_LOCK_TTL, delete_on_release=False, persistent=False
            )
        holder = f"{self.scheduler_id}/{job_id}"
        try:
            outcome = self._tick_locks.acquire(f"cron.{job_id}", holder, TICK_LOCK_TTL)
        except (PublishError, BrokerRefusedError) as exc:
            logger.warning("cron %s: could not claim the tick of %s (%s); firing it", cron.name, scheduled_time, exc)
            return True
        if isinstance(outcome, Held) and outcome.existing_id != holder:
            logger.info("cron %s: the tick of %s was claimed by %s", cron.name, scheduled_time, outcome.existing_id)
            return False
        return True

    def _fire(self, entry: CronEntry, scheduled_time: datetime, now: datetime) -> None:
        cron = entry.cron
        job_id = tick_job_id(cron.name, scheduled_time)
        if not self.claim_tick(cron, scheduled_time, job_id):
            self.book.apply(CronFired(cron.name, scheduled_time, None, "claimed", now))  # its claimer records it
            return
        previous = entry.last_job_id
        active = self._activity.is_active(previous)
        if active and cron.overlap_policy == "skip":
            self._skip(entry, scheduled_time, now, "overlap_skip", previous)
            return
        connection = self._connection.connection
        if active and cron.overlap_policy == "cancel_previous" and previous is not None:
            self.topology.declare(connection, self.topology.control_specs(cron.queue))
            self._publish(
                cancel_message(previous),
                self.names.direct_exchange,
                self.names.control_routing_key(cron.queue),
                cron.queue,
            )
        job = self._job(cron, scheduled_time, job_id)
        self.topology.ensure_queue(connection, cron.queue)
        self._publish(encode(job), self.names.direct_exchange, cron.queue, cron.queue, job_id=job_id)
        self._record(CronFired(cron.name, scheduled_time, job_id, None, now), job_id)
        self.fired += 1
        if cron.overlap_policy == "enqueue":
            self._warn_when_queued(cron, job_id)
        self._event(
            CronEvent(
                "triggered",
                cron.name,
                cron.cron,
                cron.timezone,
                scheduled_time,
                job_id=job_id,
                job_type=cron.type,
                run_count=entry.run_count,
                actual_time=utcnow(),
            )
        )
        logger.info("cron %s: fired %s as job %s", cron.name, format_timestamp(scheduled_time), job_id)

    def _skip(
        self,
        entry: CronEntry,
        scheduled_time: datetime,
        now: datetime,
        reason: CronSkipReason,
        active_job_id: str | None,
    ) -> None:
        """Record an occurrence that enqueues nothing and emit its ``cron.skipped`` (CRON-30)."""
        cron = entry.cron
        self._record(CronFired(cron.name, scheduled_time, None, reason, now), None)
        self._event(
            CronEvent(
                "skipped",
                cron.name,
                cron.cron,
                cron.timezone,
                scheduled_time,
                reason=reason,
                active_job_id=active_job_id,
            )
        )
        self.skipped += 1

    def _report_dst_skips(self, entry: CronEntry, since: datetime, now: datetime) -> None:
        """Emit ``cron.skipped`` (``dst_skip``) for occurrences a spring-forward gap swallowed (CRON-30).

        They are events only (nothing is recorded on the cron stream): a leader elected in between
        may report one again.
        """
        cron = entry.cron
        if not cron.enabled:
            return
        checked = max(since, self._gaps_checked.get(cron.name, since))
        for missing in dst_skipped(cron.expression, cron.zone, checked, now):
            self._event(CronEvent("skipped", cron.name, cron.cron, cron.timezone, missing, reason="dst_skip"))
        self._gaps_checked[cron.name] = now

    def _warn_when_queued(self, cron: CronJob, job_id: str) -> None:
        """CRON-S04: log a warning when more than two occurrences of an ``enqueue`` job wait in its queue.

        Counted from the job lifecycle events: a fired job no worker has taken yet is queued.  Only
        once a job of this cron job was seen taken, so that workers without job events (whose jobs
        are never seen taken) do not make it warn on every tick.
        """
        queued = self._queued.setdefault(cron.name, deque(maxlen=1000))
        queued.append(job_id)
        while queued and self._activity.seen(queued[0]):
            queued.popleft()
            self._taken.add(cron.name)
        waiting = sum(1 for queued_id in queued if not self._activity.seen(queued_id))
        if cron.name in self._taken and waiting > MAX_QUEUED_OCCURRENCES:
            logger.warning(
                "cron %s: %d occurrences are queued behind a running one (overlap_policy 'enqueue')",
                cron.name,
                waiting,
            )

    @staticmethod
    def _job(cron: CronJob, scheduled_time: datetime, job_id: str) -> Job:
        options = cron.options
        meta = dict(options.get("meta") or {})
        meta["cron_name"] = cron.name
        meta["cron_triggered_at"] = format_timestamp(scheduled_time)
        return Job.create(
            cron.type,
            cron.args,
            queue=cron.queue,
            meta=meta,
            retry=options.get("retry"),
            timeout=options.get("timeout"),
            tags=options.get("tags"),
            rate_limit=cron.rate_limit,
            id=job_id,
        )

    def _publish(
        self, message: OutgoingMessage, exchange: str, routing_key: str, queue: str, job_id: str | None = None
    ) -> None:
        assert self._publisher is not None
        ticket = self._publisher.publish(
            message, exchange=exchange, routing_key=routing_key, queue=queue, job_id=job_id
        )
        self._publisher.wait([ticket], DEFAULT_READ_TIMEOUT)
        ticket.raise_for_error()

    def _publish_snapshot(self) -> None:
        """Write the registry as this leader knows it to the cron stream (outlives the retention, see
        :mod:`ojs_kombu.wire.cron`); readers rely on it only once it is read back."""
        self._publish(self._reader.snapshot(), "", self.names.cron_stream, self.names.cron_stream)

    def _record(self, fired: CronFired, job_id: str | None) -> None:
        """Write the tick to the cron stream (confirmed) and fold it in at once."""
        message = fired_message(fired.name, fired.scheduled_time, job_id, skipped=fired.skipped)
        self._publish(message, "", self.names.cron_stream, self.names.cron_stream)
        self.book.apply(fired)

    def _event(self, event: CronEvent) -> None:
        """Publish a cron event (best effort, like the workers' job events)."""
        message = cron_event_message(event)
        try:
            self._events_channel.basic_publish(
                WireMessage(message.body, **message.properties),
                exchange=self.names.events_exchange,
                routing_key=self.names.cron_event_routing_key(event.event, event.cron_name),
            )
        except (OSError, *self._connection.connection_errors, *self._connection.channel_errors) as exc:
            logger.warning("cron %s: the cron.%s event was not published: %s", event.cron_name, event.event, exc)

    def _disconnect(self, *, graceful: bool) -> None:
        self._publisher = None
        try:
            if graceful:
                self._connection.release()
            else:
                self._connection.collect()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass


__all__ = [
    "ACTIVITY_LOOKBACK",
    "DEFAULT_READ_TIMEOUT",
    "MAX_QUEUED_OCCURRENCES",
    "CronRegistry",
    "CronScheduler",
    "CronStreamReader",
    "RegisteredCron",
    "Runner",
    "TICK_LOCK_TTL",
    "cron_job_json",
    "next_run_of",
    "registered",
]
