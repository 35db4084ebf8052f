"""BEAT (binding §5.7, AMQP-020): liveness, worker presence and job events on the events stream (DESIGN §14).

Liveness is the binding's §5.7 alternative: **AMQP connection heartbeats**.
Every worker connection negotiates a heartbeat (``Worker(heartbeat=60)``, DESIGN
§9); when a worker dies or hangs, RabbitMQ closes its connection after two missed
heartbeats and redelivers its unacknowledged jobs, which count as failed attempts
(``worker_lost``).  No per-job heartbeat messages are sent: RabbitMQ has no
visibility timeout to extend, and they would bloat the control stream.

For people and tools, each worker also publishes its **presence** to the events
stream ``ojs.stream.events`` (through the topic exchange ``ojs.exchange.events``,
routing key ``worker.{id}``) every ``interval`` seconds (5 by default): worker id,
host, pid, queues, concurrency, the jobs it runs with their start times
(:mod:`ojs_kombu.wire.events`), and a last ``offline`` presence when it stops
gracefully.  :meth:`Client.workers() <ojs_kombu.client.Client.workers>` lists the
workers whose latest presence is online and recent; a killed worker drops out once
its last presence is older than ``stale_after``.

:class:`Beacon` runs in a thread of its own on a connection of its own, so job
processing never waits for it: a broker outage only delays beacons (it reconnects
with the back-off of DESIGN §9).  With ``Worker(events=True)`` it also publishes
the worker's job lifecycle events (:mod:`ojs_kombu.runtime.lifecycle`, routing key
``job.{event}.{queue}``): :meth:`Beacon.offer` is the lifecycle subscriber, called
in handler threads; it only puts the event on a bounded queue.  When that queue is
full (the broker is unreachable for long), events are dropped, counted
(:attr:`Beacon.dropped`) and logged.  Job events are best effort: the beacon
does not wait for their confirms, and those queued when a worker is killed are lost.

The beacon's channel is in confirm mode, and its presences double as a check of the node it is
connected to: a node cut off from the cluster's majority still answers heartbeats but commits
nothing, so a presence it has not confirmed after ``confirm_timeout`` seconds (by default three
intervals, at least 30 s) makes the beacon move to the next node and call ``on_stalled`` with
that node's URL (the Worker moves its consumer off that node too: ``docs/cluster.md``).

:func:`read_events` reads the stream back for the Client.
"""

from __future__ import annotations

import logging
import os
import queue as queue_module
import socket
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from amqp import Channel
from amqp import Message as WireMessage

from ojs_kombu.amqp.connection import close_quietly, safe_url
from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.failover import ConnectionSettings
from ojs_kombu.amqp.reconnect import Forever, Reconnector
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import BrokerRefusedError, DecodeError, OjsError, TopologyError, ValidationError
from ojs_kombu.model.naming import Names
from ojs_kombu.model.timefmt import utcnow
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.events import (
    MARKER_ROUTING_KEY,
    ActiveJob,
    JobEvent,
    JobEventRecord,
    PresenceState,
    RateLimitEvent,
    WorkerPresence,
    decode_event,
    job_event_message,
    library_version,
    marker_message,
    presence_message,
    rate_limit_event_message,
)

logger = logging.getLogger(__name__)

#: Seconds between two presences of a worker (DESIGN §14).
DEFAULT_PRESENCE_INTERVAL = 5.0
#: Job events a beacon holds while it cannot publish; more are dropped and counted.
DEFAULT_MAX_PENDING_EVENTS = 10_000

ActiveJobsProvider = Callable[[], Iterable[ActiveJob]]
"""What a worker runs now, for its presence (called in the beacon's thread)."""


def check_presence_interval(value: float) -> float:
    """Return ``value`` as a presence interval in seconds.

    Raises:
        ValidationError: not a number > 0.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValidationError(f"the presence interval must be > 0 seconds, got {value!r}", field="presence_interval")
    return float(value)


_STOP = object()
_PUMP_INTERVAL = 0.5  # seconds between two reads of the beacon's connection (heartbeats)
#: The least time a presence may wait for its confirm before the node is taken as unable to commit
#: (RabbitMQ 4.3 answers a metadata write on a minority node after 30 s).
MIN_CONFIRM_TIMEOUT = 30.0


class Beacon:
    """Publishes a worker's presence (and, when offered, its job events) to the events stream.

    Parameters:
        connection: how the beacon's own connection reaches the broker, or just the broker URL
            (then the default heartbeat, no TLS options, the connection named ``"ojs_kombu worker events"``).
        names: the entity names (prefix).
        topology: declares the events exchange and stream (its ``events`` options).
        worker_id: the worker's id.
        queues: the OJS queues the worker consumes.
        concurrency: its handler threads.
        active: the provider of the jobs it runs now.
        interval: seconds between two presences.
        max_pending: job events held while they cannot be published.
        confirm_timeout: seconds after which an unconfirmed presence means that the node cannot
            commit (default: three intervals, at least :data:`MIN_CONFIRM_TIMEOUT`).
        on_stalled: called in the beacon's thread with the URL of such a node and what was seen,
            before the beacon moves to the next node.

    Raises:
        ValidationError: ``interval`` or ``max_pending`` is not positive.
    """

    def __init__(
        self,
        connection: ConnectionSettings | str,
        names: Names,
        topology: Topology,
        *,
        worker_id: str,
        queues: Iterable[str],
        concurrency: int,
        active: ActiveJobsProvider,
        interval: float = DEFAULT_PRESENCE_INTERVAL,
        max_pending: int = DEFAULT_MAX_PENDING_EVENTS,
        confirm_timeout: float | None = None,
        on_stalled: Callable[[str, str], None] | None = None,
    ):
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValidationError(f"max_pending must be a positive integer, got {max_pending!r}", field="max_pending")
        if isinstance(connection, str):
            connection = ConnectionSettings(connection, connection_name="ojs_kombu worker events")
        self.url = url = connection.url
        self.names = names
        self.topology = topology
        self.worker_id = worker_id
        self.queues = tuple(queues)
        self.concurrency = concurrency
        self.active = active
        self.interval = check_presence_interval(interval)
        self.confirm_timeout = (
            max(MIN_CONFIRM_TIMEOUT, 3 * self.interval) if confirm_timeout is None else confirm_timeout
        )
        self.on_stalled = on_stalled
        self.stalls = 0  # nodes left because they stopped confirming the presences
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.version = library_version()
        self.started_at = utcnow()
        self.dropped = 0  # job events dropped because the pending queue was full
        self.published = 0  # messages handed to the broker (presences and job events)
        self._pending: queue_module.Queue[JobEvent | object] = queue_module.Queue(max_pending)
        self._failover = connection.failover()
        self._connection = self._failover.connection()
        # Transient failures only delay beacons; a permanent refusal ends the beacon (never retried forever).
        self._reconnect = Reconnector(Forever(), self._failover, url=url, name="worker beacon connection")
        self._channel: Channel | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_pump = 0.0
        self._drop_lock = threading.Lock()
        self._published_on_channel = 0  # the delivery tag of the channel's last publish
        self._unconfirmed: dict[int, float] = {}  # presence delivery tag -> monotonic time published

    # -- the worker's side ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the beacon's thread (idempotent)."""
        if self._thread is not None:
            return
        self.started_at = utcnow()
        self._thread = threading.Thread(target=self._run, name="ojs-beacon", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Publish what is pending and an ``offline`` presence (if the broker is reachable), then close.

        Parameters:
            timeout: seconds to wait for the beacon's thread.
        """
        thread = self._thread
        if thread is None or self._stopping.is_set():
            return
        self._stopping.set()
        try:
            self._pending.put_nowait(_STOP)  # wake the thread; when full it wakes on its own
        except queue_module.Full:
            pass
        thread.join(timeout)

    def offer(self, event: JobEvent | RateLimitEvent) -> None:
        """Queue a job or rate limit event for publishing (a lifecycle subscriber; never blocks).

        When the pending queue is full the event is dropped and counted in :attr:`dropped`.
        """
        try:
            self._pending.put_nowait(event)
        except queue_module.Full:
            self._drop()

    def _drop(self) -> None:
        with self._drop_lock:  # handler threads drop concurrently
            self.dropped += 1
            dropped = self.dropped
        if dropped == 1 or dropped % 1000 == 0:
            logger.warning(
                "events stream: %d job event(s) dropped so far, %d are waiting for the broker",
                dropped,
                self._pending.qsize(),
            )

    def presence(self, state: PresenceState = "online") -> WorkerPresence:
        """The worker's presence now."""
        try:
            active = tuple(self.active())
        except Exception:  # a provider bug must not stop the beacon
            logger.exception("the active-jobs provider of the worker presence failed")
            active = ()
        return WorkerPresence(
            worker_id=self.worker_id,
            host=self.host,
            pid=self.pid,
            queues=self.queues,
            concurrency=self.concurrency,
            active=active,
            started_at=self.started_at,
            sent_at=utcnow(),
            state=state,
            version=self.version,
        )

    # -- the beacon's thread -------------------------------------------------------------------

    def _run(self) -> None:
        next_beat = time.monotonic()
        try:
            while not self._stopping.is_set():
                try:
                    channel = self._connected()
                    if time.monotonic() >= next_beat:
                        self._publish(channel, presence_message(self.presence()), self._worker_key(), presence=True)
                        next_beat = time.monotonic() + self.interval
                    self._publish_pending(channel, wait=max(0.0, next_beat - time.monotonic()))
                except self._errors as exc:  # a broker outage: only delays beacons
                    self._disconnect(graceful=False)
                    self._back_off(exc)
            self._goodbye()
        except BrokerRefusedError as exc:
            logger.error("worker beacon: the broker refused for good (%s); no more presences are published", exc)
        except Exception:
            logger.exception("the worker beacon failed; no more presences are published")
        finally:
            self._disconnect(graceful=True)

    @property
    def _errors(self) -> tuple[type[BaseException], ...]:
        return (OjsError, *self._connection.connection_errors, *self._connection.channel_errors)

    def _worker_key(self) -> str:
        return self.names.worker_routing_key(self.worker_id)

    def _connected(self) -> Channel:
        if self._channel is not None and self._connection.connected:
            return self._channel
        with map_exceptions(url=self.url):
            self._failover.connect(self._connection)
            self.topology.ensure_events(self._connection.connection, force=True)
            channel = self._connection.connection.channel()
            channel.confirm_select()
            channel.events["basic_ack"].add(self._confirmed)
            channel.events["basic_nack"].add(self._confirmed)  # settled all the same: the node answers
            self._published_on_channel = 0
            self._unconfirmed.clear()
            self._channel = channel
        self._reconnect.succeeded()
        if self._reconnect.failures:
            logger.info("worker beacon reconnected to %s", safe_url(self._failover.current))
        return self._channel

    def _publish(self, channel: Channel, message: OutgoingMessage, routing_key: str, *, presence: bool = False) -> None:
        with map_exceptions(url=self.url):
            channel.basic_publish(
                WireMessage(message.body, application_headers=message.headers, **message.properties),
                exchange=self.names.events_exchange,
                routing_key=routing_key,
            )
        self.published += 1
        self._published_on_channel += 1
        if presence:
            self._unconfirmed[self._published_on_channel] = time.monotonic()

    def _confirmed(self, delivery_tag: int, multiple: bool = False, *_: Any) -> None:
        """A ``Basic.Ack`` / ``Basic.Nack`` of the beacon's channel (read in the beacon's thread)."""
        # Working again once the node answers a publish, not once connected: a connection that a
        # publish to a stream without a member closes (506) keeps its back-off and its count
        # (Reconnector: QueueUnavailableError once that lasts).
        self._reconnect.reset()
        if multiple:
            for tag in [t for t in self._unconfirmed if t <= delivery_tag]:
                del self._unconfirmed[tag]
        else:
            self._unconfirmed.pop(delivery_tag, None)

    def _check_confirms(self) -> None:
        """Leave the node when a presence has waited ``confirm_timeout`` seconds for its confirm.

        Raises:
            OjsError: the node does not confirm (the caller reconnects to the next node).
        """
        if not self._unconfirmed:
            return
        waited = time.monotonic() - min(self._unconfirmed.values())
        if waited < self.confirm_timeout:
            return
        url = self._failover.current
        reason = (
            f"a presence published {waited:.0f}s ago is not confirmed: the node commits nothing "
            "(cut off from the cluster's majority?)"
        )
        self.stalls += 1
        if self.on_stalled is not None:
            try:
                self.on_stalled(url, reason)
            except Exception:  # a failing callback must not stop the beacon
                logger.exception("worker beacon: on_stalled failed")
        raise OjsError(f"leaving {safe_url(url)}: {reason}")

    def _publish_pending(self, channel: Channel, *, wait: float) -> None:
        """Publish queued job events until the next beat is due, keeping the connection alive."""
        deadline = time.monotonic() + wait
        while not self._stopping.is_set():
            now = time.monotonic()
            if now >= self._next_pump:  # not per event: a busy worker's events would wait for it
                self._pump()  # reads the confirms too
                self._check_confirms()
                self._next_pump = now + _PUMP_INTERVAL
            remaining = deadline - now
            if remaining <= 0:
                return
            try:
                item = self._pending.get(timeout=min(remaining, _PUMP_INTERVAL))
            except queue_module.Empty:
                continue
            if item is _STOP:
                return
            if isinstance(item, JobEvent | RateLimitEvent):
                self._publish_event(channel, item)

    def _publish_event(self, channel: Channel, event: JobEvent | RateLimitEvent) -> None:
        try:
            if isinstance(event, RateLimitEvent):
                key = self.names.rate_limit_event_routing_key(event.event, event.queue)
                self._publish(channel, rate_limit_event_message(event), key)
            else:
                key = self.names.job_event_routing_key(event.event, event.queue)
                self._publish(channel, job_event_message(event), key)
        except BaseException:
            self._requeue(event)  # published after the reconnect
            raise

    def _requeue(self, event: JobEvent | RateLimitEvent) -> None:
        try:
            self._pending.put_nowait(event)
        except queue_module.Full:
            self._drop()

    def _pump(self) -> None:
        """Read what the broker sent (heartbeats) and send ours: the beacon's connection is otherwise write-only."""
        connection = self._connection.connection
        with map_exceptions(url=self.url):
            try:
                connection.drain_events(timeout=0.001)
            except TimeoutError:
                pass
            connection.heartbeat_tick()

    def _back_off(self, exc: BaseException) -> None:
        """Wait before reconnecting (to the next node).

        Raises:
            BrokerRefusedError: ``exc`` is permanent (a wrong password, a missing vhost or permission).
        """
        self._stopping.wait(self._reconnect.failed(exc, self._connection))

    def _goodbye(self) -> None:
        """At stop: publish the pending job events and the ``offline`` presence, if connected.

        Not connected (the broker is unreachable): no attempt is made, so stopping never waits
        for a connection; the worker drops out of ``Client.workers()`` when its presence goes stale.
        """
        channel = self._channel
        if channel is None or not self._connection.connected:
            logger.info("worker beacon: not connected at stop; no offline presence is published")
            return
        try:
            while True:
                try:
                    item = self._pending.get_nowait()
                except queue_module.Empty:
                    break
                if isinstance(item, JobEvent | RateLimitEvent):
                    self._publish_event(channel, item)
            self._publish(channel, presence_message(self.presence("offline")), self._worker_key())
        except self._errors as exc:
            logger.warning("worker beacon: the offline presence was not published (%s)", exc)

    def _disconnect(self, *, graceful: bool) -> None:
        """Close the connection (``graceful``: the broker handles what was sent first) or drop a broken one."""
        channel, self._channel = self._channel, None
        try:
            if graceful:
                if channel is not None:
                    close_quietly(channel)
                self._connection.release()
            else:
                self._connection.collect()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass


# -- reading the stream back -------------------------------------------------------------------------


def read_events(
    connection: Any,
    names: Names,
    topology: Topology,
    since: datetime,
    on_event: Callable[[WorkerPresence | JobEventRecord], bool],
    *,
    prefetch: int = 1000,
    timeout: float = 10.0,
) -> None:
    """Read the events stream from ``since`` until caught up, or until ``on_event`` returns False.

    Catching up uses a marker: one ``ojs.event.marker`` message published after the
    consumer started; everything before it has been read when it comes back.  The
    stream's timestamp offsets point at chunks, so records somewhat older than
    ``since`` may come too: ``on_event`` filters by the times in the bodies.

    Parameters:
        connection: an open py-amqp connection (used by this thread only meanwhile).
        names, topology: the entity names, and the topology that declares the stream.
        since: read records from about this time (aware datetime).
        on_event: called with every decoded record, in stream order; False stops the read.
        prefetch: ``Basic.Qos`` of the reading channel (a stream consumer needs one).
        timeout: seconds to wait for the marker.

    Raises:
        TopologyError: ``ojs.stream.events`` exists and is not a stream (see :mod:`ojs_kombu.amqp.topology`).
        OjsError: the marker did not come back within ``timeout``.
    """
    topology.ensure_events(connection)
    if not topology.events_is_stream():
        raise TopologyError(
            f"{names.events_stream} exists and is not a stream (see Topology.conflicts); its events cannot be read"
        )
    channel: Channel = connection.channel()
    channel.auto_decode = False
    marker = marker_message()
    marker_id = marker.properties["message_id"]
    state = {"done": False, "unacked": 0}
    ack_every = max(1, prefetch // 4)

    def on_message(message: WireMessage) -> None:
        state["unacked"] += 1
        if state["unacked"] >= ack_every:
            channel.basic_ack(message.delivery_info["delivery_tag"], multiple=True)
            state["unacked"] = 0
        if state["done"]:
            return
        properties = dict(message.properties)
        if properties.get("message_id") == marker_id:
            state["done"] = True
            return
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
        try:
            record = decode_event(body, properties)
        except DecodeError as exc:
            logger.warning("ignoring an unreadable message of %s: %s", names.events_stream, exc)
            return
        if record is not None and on_event(record) is False:
            state["done"] = True

    consumer_tag = None
    try:
        with map_exceptions():
            channel.basic_qos(0, prefetch, False)
            consumer_tag = channel.basic_consume(
                names.events_stream, no_ack=False, callback=on_message, arguments={"x-stream-offset": since}
            )
            channel.basic_publish(
                WireMessage(marker.body, **marker.properties),
                exchange=names.events_exchange,
                routing_key=MARKER_ROUTING_KEY,
            )
            deadline = time.monotonic() + timeout
            while not state["done"]:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OjsError(f"reading {names.events_stream}: not caught up within {timeout:.0f}s")
                try:
                    connection.drain_events(timeout=min(remaining, 1.0))
                except TimeoutError:
                    continue
    finally:
        # Cancel first: a stream consumer stopped early (a limit, the marker) still has up to
        # ``prefetch`` deliveries in flight; Basic.Cancel-Ok comes after the last of them (they
        # reach on_message, which ignores them once done), so Channel.Close meets none and
        # py-amqp does not log "Received method (60, 60) during closing channel" for each.
        if consumer_tag is not None and channel.is_open:
            try:
                channel.basic_cancel(consumer_tag)
            except Exception:  # noqa: BLE001 - clean-up: the channel or connection may be gone already
                pass
        close_quietly(channel)


__all__ = [
    "DEFAULT_MAX_PENDING_EVENTS",
    "DEFAULT_PRESENCE_INTERVAL",
    "ActiveJobsProvider",
    "Beacon",
    "check_presence_interval",
    "read_events",
]
