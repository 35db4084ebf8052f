"""The consuming side of the binding: FETCH, ACK and FAIL on one connection (binding §5.2–5.5, §10–11).

A :class:`Consumer` owns one AMQP connection with two channels: a consuming
channel (``Basic.Qos(prefetch, global=False)`` then ``Basic.Consume(no_ack=False)``
per queue) and a publishing channel in confirm mode for the retry path.  Its
loop runs in one thread, the only thread that touches the connection (AMQP-028),
except while that thread lends it for a job it runs itself: then a stand-in thread
runs the loop's passes (:meth:`Consumer.serve`, :mod:`~ojs_kombu.runtime.handover`),
one thread at a time.  Handler threads settle deliveries through thread-safe requests
(:meth:`Consumer.ack`, :meth:`Consumer.nack`, :meth:`Consumer.republish`) that
the loop executes; a self-pipe wakes the loop at once when it waits in
``select`` (a busy loop executes them before it waits again), so an ack never
waits for a poll interval.  The acks and nacks of one pass over the requests
leave in one socket write, each its own frame (:class:`~ojs_kombu.amqp.framing.WriteBatch`).

On a connection loss the loop reconnects with the back-off of DESIGN §9,
re-declares the topology and re-registers its consumers with the same
prefetch; deliveries of the lost connection are forgotten (the broker
redelivers them, flagged ``redelivered``).  A broker-initiated ``Basic.Cancel``
(e.g. the queue was deleted) is logged, counted and followed by a re-consume
after a delay.

Pause and resume (``ControlReader.paused``): the loop compares the paused set with
what it applied last, on every pass; a paused queue's consumer is cancelled
(``Basic.Cancel``; its unsettled deliveries are still settled on the channel) and
a resumed queue is consumed again with the same prefetch.  A queue paused at
(re)connection is not consumed at all.

Metrics: ``ojs_amqp_connections_active`` and ``ojs_amqp_channels_active`` (the
consuming and the publishing channel) while connected;
``ojs_amqp_messages_unacked{consumer}`` (label: the connection name) and
``ojs_amqp_consumer_utilization{queue}`` (unsettled deliveries of the queue over
the prefetch count) are updated once per loop pass, and drop to 0 when the
connection is lost (the broker takes those deliveries back).

Shutdown: :meth:`Consumer.close` releases the wake-up pipe.  A handler thread
that settles a delivery after that (a job that outlived the grace period) only
queues a moot request: it never writes to the closed descriptor, whose number
the process may already have given to another file.
"""

from __future__ import annotations

import logging
import os
import queue as queue_module
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amqp import spec
from amqp.basic_message import Message
from amqp.channel import Channel
from amqp.exceptions import RecoverableConnectionError
from kombu.connection import Connection

from ojs_kombu.amqp.connection import safe_url
from ojs_kombu.amqp.delivery import RawDelivery
from ojs_kombu.amqp.errors import raise_if_permanent
from ojs_kombu.amqp.failover import Failover
from ojs_kombu.amqp.framing import FrameReader, WriteBatch
from ojs_kombu.amqp.framing import supports as framing_supports
from ojs_kombu.amqp.publisher import ConfirmedPublisher, Destination, PublishTicket
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import OjsError
from ojs_kombu.observability.logs import message_log_extra
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.runtime.control import ControlReader
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.headers import strip_death_headers

logger = logging.getLogger(__name__)

#: FrameReader's constructor is not annotated: calling it through this typed name keeps the
#: module strict whether or not it ever is.
_frame_reader: Callable[[Any], FrameReader] = FrameReader
_write_batch: Callable[[Any], WriteBatch] = WriteBatch

#: The consumer's two long-lived channels: consuming, and publishing (confirm mode).
_CHANNELS = 2

#: A settle request from a handler thread: ``("ack" | "nack", delivery)``, or
#: ``("republish", delivery, destination, queue, prepare, then)`` (``then``: ``"ack"``, or
#: ``"nack"`` for a nack that records the final failure first).
_Request = (
    tuple[str, "Delivery"]
    | tuple[
        str, "Delivery", Destination | Callable[[], Destination], str, Callable[[Any, Destination], None] | None, str
    ]
)


@dataclass
class Delivery:
    """One message delivered to the consumer, as handed to a handler thread."""

    body: bytes
    properties: dict[str, Any]
    headers: dict[str, Any]
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    queue: str
    generation: int
    received: float = field(default_factory=time.monotonic)

    def outgoing(self, headers: dict[str, Any] | None = None) -> OutgoingMessage:
        """This message for a republish: same body and properties, ``x-death*`` stripped."""
        table = strip_death_headers(self.headers)
        if headers:
            table.update(headers)
        properties = {k: v for k, v in self.properties.items() if k != "application_headers"}
        return OutgoingMessage(self.body, properties, table)


class Consumer:
    """Consumes AMQP queues on one connection; the loop runs in the caller's thread.

    Arguments:
        url: broker URL.
        queues: ``{amqp_queue_name: ojs_queue_name}`` to consume.
        prefetch: ``Basic.Qos`` prefetch count per consumer (``global=False``).
        on_delivery: called in the loop thread with each :class:`Delivery`; must not block.
        topology: re-declared after every reconnect, and for re-consuming after a cancel.
        declare: called with the kombu connection after (re)connecting, before consuming.
        on_pass: called in the loop's thread after each pass of the loop (after the pass's
            deliveries went to ``on_delivery``); it may run jobs, lending the connection to a
            stand-in meanwhile (:mod:`~ojs_kombu.runtime.handover`).
        control: reads the control queues on a third channel; after every (re)connection
            it has caught up with them before any job queue is consumed.
    """

    def __init__(
        self,
        url: str,
        queues: dict[str, str],
        prefetch: int,
        on_delivery: Callable[[Delivery], None],
        *,
        topology: Topology,
        declare: Callable[[Any], None] | None = None,
        control: ControlReader | None = None,
        heartbeat: float = 60,
        connect_retries: int | None = None,
        cancel_retry_delay: float = 1.0,
        connection_name: str = "ojs_kombu worker",
        transport_options: dict[str, Any] | None = None,
        ssl: Any = None,
        on_pass: Callable[[], None] | None = None,
    ):
        self.url = url
        self.queues = dict(queues)
        self.prefetch = prefetch
        self.on_delivery = on_delivery
        self.topology = topology
        self.declare = declare
        self.control = control
        self._channel_count = _CHANNELS + (1 if control is not None else 0)
        self.heartbeat = heartbeat
        self.connect_retries = connect_retries
        self.cancel_retry_delay = cancel_retry_delay
        self._failover = Failover(
            url, heartbeat=heartbeat, ssl=ssl, transport_options=transport_options, connection_name=connection_name
        )
        self._kombu = self._failover.connection()
        self.connection_name = connection_name
        self._requests: queue_module.SimpleQueue[_Request] = queue_module.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        self._wake_pending = False  # a byte is (about to be) in the pipe: the loop will wake
        self._idle = False  # the loop is about to wait (or waits) in select(): requests must wake it
        self._pipe_lock = threading.Lock()  # guards writes to the pipe against close()
        self._closed = False  # close() was called: never write to the pipe again
        self._running = False  # run() is executing: it releases the pipe when it ends
        self._unacked: dict[str, int] = dict.fromkeys(self.queues.values(), 0)  # per OJS queue
        self._window_changed = True
        self._metric_children: dict[tuple[Any, str], Any] = {}
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stop = threading.Event()
        self._consuming = threading.Event()
        self._cancel_wanted = threading.Event()
        self._generation = 0
        self._channel: Channel | None = None
        self._publisher: ConfirmedPublisher | None = None
        self._consumer_tags: dict[str, str] = {}
        self._queue_by_tag: dict[str, str] = {}  # consumer tag -> amqp queue (for deliveries)
        self._reader: FrameReader | None = None
        self._writes: WriteBatch | None = None
        self._recancelled: dict[str, float] = {}
        self._paused_version = -1  # the version of control.paused the loop applied last
        self.reconnections = 0
        self.cancellations = 0
        self.connected = threading.Event()
        self._attempt = 0  # consecutive failed connections
        self._reconnect_at = 0.0  # monotonic: not before (the back-off of a connection lost in serve)
        self._leave: str | None = None  # a node another connection found unable to commit (leave_node)
        self._sock: Any = None  # the connection's socket, for the passes
        self._interval = 1.0  # the longest a pass waits in select
        self._next_heartbeat_check = 0.0
        self.on_pass = on_pass

    # -- thread-safe requests ------------------------------------------------------------------

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge ``delivery`` (``Basic.Ack``, ``multiple=False``)."""
        self._request(("ack", delivery))

    def nack(
        self,
        delivery: Delivery,
        record: Destination | None = None,
        prepare: Callable[[Any, Destination], None] | None = None,
    ) -> None:
        """Reject ``delivery`` without requeue: ``Basic.Nack(requeue=False)``, into the DLQ.

        With ``record`` (the job's final failure), ``record`` is published (confirmed) first
        (after ``prepare``) and the nack follows; it follows a refused record too.
        """
        if record is None:
            self._request(("nack", delivery))
        else:
            self._request(("republish", delivery, record, delivery.queue, prepare, "nack"))

    def republish(
        self,
        delivery: Delivery,
        destination: Destination | Callable[[], Destination],
        queue: str,
        prepare: Callable[[Any, Destination], None] | None = None,
    ) -> None:
        """Publish ``destination`` (confirmed), then ack ``delivery`` (DESIGN §5: never ack first).

        Carried out in the loop thread by
        :meth:`~ojs_kombu.amqp.publisher.ConfirmedPublisher.publish_when_ready`:
        ``prepare(connection, destination)`` first (e.g. to declare a retry queue), then a
        callable ``destination`` is asked for (a delay runs from there, not from this
        request).  If the broker does not confirm the publish, ``delivery`` is nacked into
        its DLQ so the job is never lost.
        """
        self._request(("republish", delivery, destination, queue, prepare, "ack"))

    def stop_consuming(self) -> None:
        """Cancel every consumer (no new deliveries); the loop keeps settling."""
        self._cancel_wanted.set()
        self._wake()

    def stop(self) -> None:
        """End the loop after it has executed the requests already made."""
        self._stop.set()
        self._wake()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    def wake(self) -> None:
        """Make a pass waiting in ``select`` return now (thread-safe)."""
        self._wake()

    def leave_node(self, url: str, reason: str) -> None:
        """Move to the next node if connected to ``url`` (thread-safe; the loop does it at its next pass).

        For what another connection of the worker found out about that node and this connection
        cannot see: a node cut off from the cluster's majority still answers heartbeats, but its
        queues deliver nothing (the Worker's beacon notices that its presences are no longer
        confirmed there).

        Parameters:
            url: the node's URL, as in this consumer's failover list.
            reason: what was seen, for the log.
        """
        self._leave = f"{url}\n{reason}"
        self._wake()

    def connection_factory(self) -> Connection:
        """A new, unconnected kombu connection with this consumer's settings."""
        clone: Connection = self._kombu.clone()
        return clone

    @property
    def consuming(self) -> bool:
        """Whether a consumer is registered; False once :meth:`stop_consuming` has been carried out."""
        return self._consuming.is_set()

    @property
    def generation(self) -> int:
        """Incremented on every (re)connection; deliveries of older generations cannot be settled."""
        return self._generation

    def _request(self, item: _Request) -> None:
        self._requests.put(item)
        # Only a loop that waits in select() needs the pipe: a busy one executes every request
        # made so far before it waits again.  _idle is set before the loop's last look at the
        # queue, and read here after the put, so one of the two sees the other (see _wait).
        if self._idle:
            self._wake()

    def _wake(self) -> None:
        # One byte per wake-up, not per request: the loop clears the flag after it has read the
        # pipe, then executes every request made so far (see _clear_wake and _loop).
        if self._wake_pending:
            return
        with self._pipe_lock:
            if self._closed:
                return  # the loop has ended; the request is moot (the broker redelivers)
            self._wake_pending = True
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:
                pass  # the pipe is full: the loop is awake anyway

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Consume until :meth:`stop`; reconnect on connection loss."""
        with self._pipe_lock:
            if self._closed:
                raise OjsError("the consumer is closed")
            self._running = True
        try:
            while not self._stop.is_set():
                try:
                    self._connect()
                    self._loop()
                except self._kombu.connection_errors + self._kombu.channel_errors as exc:
                    self._stop.wait(self._lost(exc))
        finally:
            self._drain_requests_after_disconnect()
            self._disconnect()
            with self._pipe_lock:
                self._running = False
                if self._closed:
                    self._release_pipe()

    def serve(self, until: Callable[[], bool], on_pass: Callable[[], None] | None = None) -> None:
        """Run the loop's passes in the calling thread until ``until()`` is true or :meth:`stop`.

        For a thread the loop's own thread has lent the connection to while it runs a job
        (:class:`~ojs_kombu.runtime.handover.Handover`): one thread at a time uses the
        connection.  A lost connection is re-established here, as :meth:`run` would; :meth:`wake`
        makes a waiting pass return, so ``until`` is looked at again.

        Parameters:
            until: checked before every pass.
            on_pass: called after every pass (instead of the consumer's :attr:`on_pass`).

        Raises:
            Exception: what :meth:`run` would end with (a permanent refusal, ``connect_retries``
                spent, a bug); the loop's own thread re-raises it when it takes the connection back.
        """
        while not until() and not self._stop.is_set():
            try:
                if self._channel is None:
                    if (wait := self._reconnect_at - time.monotonic()) > 0:
                        self._stop.wait(min(wait, 0.05))  # the back-off, looking at until() meanwhile
                        continue
                    self._connect()
                    self._begin_passes()
                self._pass()
                if on_pass is not None:
                    on_pass()
            except self._kombu.connection_errors + self._kombu.channel_errors as exc:
                self._reconnect_at = time.monotonic() + self._lost(exc)

    def _lost(self, exc: BaseException) -> float:
        """After a connection or channel error: disconnect; the back-off before connecting again
        (DESIGN §9), or re-raise when retrying cannot help or ``connect_retries`` is spent."""
        lost = safe_url(self._failover.current)
        unsettled = sum(self._unacked.values())
        self._disconnect()
        raise_if_permanent(exc, url=self.url)  # 403 / 530: retrying cannot help
        if self._stop.is_set():
            return 0.0
        self._attempt += 1
        if self.connect_retries is not None and self._attempt > self.connect_retries:
            raise exc
        delay = self._failover.failed(self._kombu)  # the next node; back-off once per full rotation
        self.reconnections += 1
        METRICS.reconnected()
        logger.warning(
            "consumer connection to %s lost (%s); reconnecting to %s in %.1fs%s",
            lost,
            exc,
            safe_url(self._failover.current),
            delay,
            # On RabbitMQ 4.3 a quorum queue keeps the deliveries of a consumer whose node became
            # unreachable for x-consumer-disconnected-timeout (60 s by default) before it
            # delivers them again: say how many jobs may wait that long (docs/cluster.md).
            f"; {unsettled} unsettled deliveries go back to their queues (from a node that became "
            "unreachable: after the queue's consumer-disconnected timeout)"
            if unsettled
            else "",
        )
        return delay

    def close(self) -> None:
        """Release the wake-up pipe; requests made afterwards are dropped (the broker redelivers).

        Safe at any time: if the loop is still running (it outlived a join timeout),
        the pipe is released when the loop ends instead.  Idempotent.
        """
        with self._pipe_lock:
            if self._closed:
                return
            self._closed = True
            if not self._running:
                self._release_pipe()

    def _release_pipe(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._wake_r = self._wake_w = -1

    def _connect(self) -> None:
        if (wait := self._reconnect_at - time.monotonic()) > 0:
            self._stop.wait(wait)  # what is left of the back-off of a connection a stand-in lost
        self._failover.connect(self._kombu)
        connection = self._kombu.connection
        # Plain TCP: buffered reads (framing.py).  TLS keeps py-amqp's read path.
        self._reader = _frame_reader(connection) if framing_supports(connection) else None
        self._writes = _write_batch(connection)
        self._generation += 1
        self.topology.redeclare(connection)
        if self.declare:
            self.declare(connection)
        self._publisher = ConfirmedPublisher(connection)
        if self.control is not None:
            self.control.attach(connection, self._pump)  # caught up with every cancel before any job arrives
        channel: Channel = connection.channel()
        channel.auto_decode = False
        channel.basic_qos(0, self.prefetch, False)
        self._channel = channel
        if self._reader is not None:
            self._reader.decode_deliveries(channel.channel_id, self._on_raw_delivery)
        self._consumer_tags.clear()
        self._queue_by_tag.clear()
        self._recancelled.clear()  # a new channel consumes every queue; a pending re-consume would double it
        if not self._cancel_wanted.is_set():
            for amqp_queue in self.queues:
                if not self._paused(amqp_queue):
                    self._consume(amqp_queue)
        self._paused_version = -1
        self._apply_pauses()  # logs what is paused; consumes nothing more
        self._attempt = 0
        self._failover.succeeded()  # after re-declaring and re-consuming: a node that fails those counts
        METRICS.connections_active.inc()
        METRICS.channels_opened(self._channel_count)
        self.connected.set()  # after the gauges: a caller woken by it reads them up to date

    def _consume(self, amqp_queue: str) -> None:
        assert self._channel is not None  # connected
        tag = self._channel.basic_consume(
            amqp_queue,
            no_ack=False,
            callback=self._on_message,
            on_cancel=lambda consumer_tag, q=amqp_queue: self._on_cancel(q, consumer_tag),
        )
        self._consumer_tags[amqp_queue] = tag
        self._queue_by_tag[tag] = amqp_queue
        self._consuming.set()

    def _disconnect(self) -> None:
        if self.connected.is_set():
            METRICS.connections_active.dec()
            METRICS.channels_closed(self._channel_count)
        self.connected.clear()
        self._forget_window()  # the broker takes the unsettled deliveries of a lost channel back
        self._consuming.clear()  # no consumer outlives its channel
        self._channel = None
        self._publisher = None
        self._reader = None
        self._writes = None
        try:
            self._kombu.collect()
        except Exception:  # noqa: BLE001 - the connection is already broken
            pass

    def _loop(self) -> None:
        self._begin_passes()
        while not self._stop.is_set():
            self._pass()
            if self.on_pass is not None and self._channel is not None:
                self.on_pass()  # may lend the connection to a stand-in (serve) until it returns
            if self._channel is None:
                return  # the stand-in lost the connection and re-raised nothing: connect again
        if self._channel is not None:  # a stand-in may have closed it for good at stop (shutdown)
            self._finish()

    def _begin_passes(self) -> None:
        connection = self._kombu.connection
        self._sock = connection.sock
        self._interval = min(1.0, self.heartbeat / 4) if self.heartbeat else 1.0
        self._next_heartbeat_check = 0.0

    def _pass(self) -> None:
        """One pass of the loop: settle requests, control, then wait for and dispatch frames."""
        if self._leave is not None:
            url, _, reason = self._leave.partition("\n")
            self._leave = None
            if url == self._failover.current:
                raise RecoverableConnectionError(f"leaving {safe_url(url)}: {reason}")
        connection = self._kombu.connection
        sock = self._sock
        reader = self._reader
        if self._cancel_wanted.is_set() and self._consuming.is_set():
            self._cancel_all()
        self._execute_requests()
        self._reconsume_cancelled()
        if self.control is not None:
            self.control.maintain(connection)
            self._apply_pauses()
        if reader is not None:
            # Frames may already be buffered (read by a drain_events, e.g. while waiting for
            # confirms): they do not make the socket readable, so do not wait in select then.
            if not reader.has_frame() and sock in self._wait(sock, self._interval):
                reader.fill()
            reader.dispatch()
        else:
            if not self._has_buffered(sock):
                self._wait(sock, self._interval)
            self._read_available(connection)
        # Once per interval, not per pass (a busy loop makes thousands): py-amqp's tick wants
        # about two per heartbeat, and the loop never waits longer than the interval.
        if self.heartbeat and (now := time.monotonic()) >= self._next_heartbeat_check:
            self._kombu.heartbeat_check()
            self._next_heartbeat_check = now + self._interval
        if self._window_changed:
            self._record_window()

    def _finish(self) -> None:
        """The end of consuming: execute the last requests, wait for republishes to settle."""
        self._execute_requests()
        if self._publisher is not None:
            self._publisher.wait_all(timeout=10)  # republishes settle (ack or nack) before we go

    def shutdown(self) -> None:
        """After :meth:`stop`, from the thread that holds the connection when the loop's own thread
        cannot come back to it (a job outlived the grace period): settle what was asked, close.

        The broker then redelivers the deliveries still unsettled, as after a lost connection.
        """
        if self._channel is not None:
            try:
                self._finish()
            finally:
                self._disconnect()

    def _wait(self, sock: Any, interval: float) -> list[Any]:
        """Wait in ``select`` until the socket is readable, a request or :meth:`_wake` arrives, or
        ``interval`` passes; return what is readable."""
        self._idle = True
        try:
            # A request made before _idle was set did not wake us: do not wait for it.
            timeout = 0.0 if not self._requests.empty() else interval
            readable, _, _ = select.select([sock, self._wake_r], [], [], timeout)
        finally:
            self._idle = False
        if self._wake_r in readable:
            self._clear_wake()
        readable_list: list[Any] = readable
        return readable_list

    def _pump(self, timeout: float) -> None:
        """Read and dispatch what arrives within ``timeout`` seconds (the buffered reader when there is one)."""
        reader = self._reader
        if reader is None:
            try:
                self._kombu.connection.drain_events(timeout=timeout)
            except TimeoutError:
                pass
            return
        if not reader.has_frame():
            readable, _, _ = select.select([self._kombu.connection.sock], [], [], timeout)
            if readable:
                reader.fill()
        reader.dispatch()

    @staticmethod
    def _has_buffered(sock: Any) -> bool:
        pending = getattr(sock, "pending", None)  # TLS sockets buffer decrypted bytes
        return bool(pending and pending())

    def _read_available(self, connection: Any) -> None:
        while True:
            try:
                connection.drain_events(timeout=0)
            except TimeoutError:
                return

    def _clear_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        # Only now: a byte written before this point may just have been read.  A request made
        # while the flag was still set is executed by the loop's next _execute_requests.
        self._wake_pending = False

    def _on_message(self, message: Message) -> None:
        """A delivery read by py-amqp (TLS, or what the direct decoder leaves to it)."""
        info = message.delivery_info
        amqp_queue = self._queue_by_tag.get(info["consumer_tag"], "")
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
        self._deliver(
            amqp_queue,
            dict(message.properties),
            body,
            info["delivery_tag"],
            bool(info["redelivered"]),
            info["exchange"],
            info["routing_key"],
        )

    def _on_raw_delivery(self, raw: RawDelivery) -> bool:
        """A delivery decoded by the frame reader; False (left to py-amqp) for a consumer tag we do not know."""
        amqp_queue = self._queue_by_tag.get(raw.consumer_tag)
        if amqp_queue is None:
            return False
        self._deliver(
            amqp_queue, raw.properties, raw.body, raw.delivery_tag, raw.redelivered, raw.exchange, raw.routing_key
        )
        return True

    def _deliver(
        self,
        amqp_queue: str,
        properties: dict[str, Any],
        body: bytes,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
    ) -> None:
        """Count one delivery of ``amqp_queue`` and hand it to ``on_delivery`` (``properties`` is ours to change)."""
        headers = dict(properties.pop("application_headers", None) or {})
        queue = self.queues.get(amqp_queue, amqp_queue)
        self._metric(METRICS.messages_consumed, queue).inc()
        self._unacked[queue] = self._unacked.get(queue, 0) + 1
        self._window_changed = True
        self.on_delivery(
            Delivery(
                body=body,
                properties=properties,
                headers=headers,
                delivery_tag=delivery_tag,
                redelivered=redelivered,
                exchange=exchange,
                routing_key=routing_key,
                queue=queue,
                generation=self._generation,
            )
        )

    def _on_cancel(self, amqp_queue: str, consumer_tag: str) -> None:
        self._consumer_tags.pop(amqp_queue, None)
        self._queue_by_tag.pop(consumer_tag, None)
        self.cancellations += 1
        METRICS.consumer_cancellations.labels(self.queues.get(amqp_queue, amqp_queue)).inc()
        logger.warning(
            "the broker cancelled the consumer of %s (Basic.Cancel); re-consuming in %.1fs",
            amqp_queue,
            self.cancel_retry_delay,
        )
        self._recancelled[amqp_queue] = time.monotonic() + self.cancel_retry_delay

    def _paused(self, amqp_queue: str) -> bool:
        return self.control is not None and self.queues[amqp_queue] in self.control.paused

    def _apply_pauses(self) -> None:
        """Cancel the consumers of paused queues and consume resumed ones (when the state changed)."""
        if self.control is None or self.control.paused.version == self._paused_version:
            return
        assert self._channel is not None  # connected
        self._paused_version = self.control.paused.version
        for amqp_queue, ojs_queue in self.queues.items():
            if self._paused(amqp_queue):
                self._recancelled.pop(amqp_queue, None)  # a broker cancel is re-consumed on resume instead
                tag = self._consumer_tags.pop(amqp_queue, None)
                if tag is not None:
                    self._channel.basic_cancel(tag)
                    self._queue_by_tag.pop(tag, None)
                    logger.info("queue %s paused: stopped consuming %s", ojs_queue, amqp_queue)
                else:
                    logger.info("queue %s is paused: not consuming %s", ojs_queue, amqp_queue)
            elif (
                amqp_queue not in self._consumer_tags
                and amqp_queue not in self._recancelled
                and not self._cancel_wanted.is_set()
            ):
                self._consume(amqp_queue)
                logger.info("queue %s resumed: consuming %s again", ojs_queue, amqp_queue)
        if not self._consumer_tags:
            self._consuming.clear()

    def _reconsume_cancelled(self) -> None:
        if not self._recancelled or self._cancel_wanted.is_set():
            return
        now = time.monotonic()
        for amqp_queue, due in list(self._recancelled.items()):
            if due > now:
                continue
            del self._recancelled[amqp_queue]
            ojs_queue = self.queues[amqp_queue]
            try:
                self.topology.forget(ojs_queue)
                if self.declare:
                    self.declare(self._kombu.connection)
                else:
                    self.topology.ensure_queue(self._kombu.connection, ojs_queue)
                self._consume(amqp_queue)
                logger.info("re-consuming %s after a broker cancel", amqp_queue)
            except self._kombu.channel_errors as exc:
                logger.warning("re-consuming %s failed (%s); trying again", amqp_queue, exc)
                raise

    def _cancel_all(self) -> None:
        assert self._channel is not None  # connected
        for amqp_queue, tag in list(self._consumer_tags.items()):
            self._channel.basic_cancel(tag)
            del self._consumer_tags[amqp_queue]
            self._queue_by_tag.pop(tag, None)
        self._consuming.clear()

    # -- settling ------------------------------------------------------------------------------

    def _execute_requests(self) -> None:
        """Carry out the settle requests made so far.

        The acks and nacks of one pass leave in one socket write (:class:`WriteBatch`),
        each its own frame; a republish first sends what is held, since publishing
        may wait for confirms.
        """
        writes = self._writes
        try:
            while True:
                try:
                    item = self._requests.get_nowait()
                except queue_module.Empty:
                    return
                kind, delivery = item[0], item[1]
                if delivery.generation != self._generation:
                    continue  # its channel is gone; the broker redelivers it
                if kind == "ack" or kind == "nack":
                    if writes is not None:
                        writes.hold()
                    if kind == "ack":
                        self._ack(delivery)
                    else:
                        self._nack(delivery)
                else:
                    if writes is not None:
                        writes.flush()
                    self._execute_republish(item)
        finally:
            if writes is not None:
                writes.flush()

    def _execute_republish(self, item: _Request) -> None:
        delivery = item[1]
        if len(item) == 6:
            _, _, destination, queue, prepare, then = item
            assert self._publisher is not None  # connected
            self._publisher.publish_when_ready(
                destination, queue=queue, prepare=prepare, on_done=self._republished(delivery, then)
            )

    def _republished(self, delivery: Delivery, then: str) -> Callable[[PublishTicket], None]:
        return lambda ticket: self._after_republish(delivery, ticket, then)

    def _after_republish(self, delivery: Delivery, ticket: PublishTicket, then: str = "ack") -> None:
        if delivery.generation != self._generation:
            return
        if ticket.error is None:
            if then == "ack":
                self._ack(delivery)
            else:
                self._nack(delivery)
            return
        if then == "nack":
            logger.error(
                "recording the final failure of job %s failed (%s); dead-lettering it without the record",
                delivery.properties.get("message_id"),
                ticket.error,
                extra=message_log_extra(delivery.properties.get("message_id"), delivery.queue),
            )
            self._nack(delivery)
            return
        logger.error(
            "republishing job %s failed (%s); sending it to its dead letter queue",
            ticket.job_id,
            ticket.error,
            extra=message_log_extra(ticket.job_id, delivery.queue),
        )
        self._nack(delivery)

    def _ack(self, delivery: Delivery) -> None:
        self._send_settle(spec.Basic.Ack, delivery)
        self._metric(METRICS.messages_acked, delivery.queue).inc()
        self._settled(delivery.queue)

    def _nack(self, delivery: Delivery) -> None:
        # Basic.Nack(requeue=False): dead-lettered (py-amqp has no basic_nack).
        self._send_settle(spec.Basic.Nack, delivery)
        self._metric(METRICS.messages_nacked, delivery.queue).inc()
        self._settled(delivery.queue)

    def _send_settle(self, method: tuple[int, int], delivery: Delivery) -> None:
        """One ``Basic.Ack`` / ``Basic.Nack(requeue=False)`` frame, ``multiple=False`` (binding §5.3)."""
        channel = self._channel
        assert channel is not None  # only settled while connected (same generation)
        if self._writes is not None and channel.is_open:
            self._writes.settle(channel.channel_id, method, delivery.delivery_tag)
        else:  # py-amqp raises what a closed channel raises
            channel.send_method(method, "Lbb", (delivery.delivery_tag, False, False))

    def _settled(self, queue: str) -> None:
        self._unacked[queue] = max(0, self._unacked.get(queue, 0) - 1)
        self._window_changed = True

    def _forget_window(self) -> None:
        for queue in self._unacked:
            self._unacked[queue] = 0
        self._record_window()

    def _record_window(self) -> None:
        """Publish the unacked and utilization gauges (once per loop pass, not per message)."""
        self._window_changed = False
        METRICS.unacked(self.connection_name, sum(self._unacked.values()))
        for queue, count in self._unacked.items():
            METRICS.utilization(queue, min(1.0, count / self.prefetch) if self.prefetch > 0 else 0.0)

    def _metric(self, family: Any, queue: str) -> Any:  # prometheus_client children are untyped
        """``family.labels(queue)``, cached: labels() costs more than the increment."""
        child = self._metric_children.get((family, queue))
        if child is None:
            child = self._metric_children[(family, queue)] = family.labels(queue)
        return child

    def _drain_requests_after_disconnect(self) -> None:
        while True:
            try:
                self._requests.get_nowait()
            except queue_module.Empty:
                return


__all__ = [
    "Consumer",
    "Delivery",
]
