"""The consuming side of the binding: FETCH, ACK and FAIL on one connection (binding §5.2–5.5, §10–11).

A :class:`Consumer` owns one AMQP connection with two channels: a consuming
channel (``Basic.Qos(prefetch, global=False)`` then ``Basic.Consume(no_ack=False)``
per queue) and a publishing channel in confirm mode for the retry path.  Its
loop runs in one thread, the only thread that touches the connection (AMQP-028),
except while that thread lends it for a job it runs itself: then a stand-in thread
runs the loop's passes (:meth:`Consumer.serve`, :mod:`~ojs_kombu.runtime.handover`),
one thread at a time.  This module is that I/O loop; its parts live beside it:

* :mod:`~ojs_kombu.runtime.requests`: the typed settle requests (:class:`Ack`, :class:`Nack`,
  :class:`Republish`) handler threads make through :meth:`Consumer.ack`, :meth:`Consumer.nack`
  and :meth:`Consumer.republish`, carried out by the loop;
* :mod:`~ojs_kombu.runtime.wakeup`: the self-pipe that wakes the loop at once when it waits in
  ``select`` (a busy loop carries the requests out before it waits again), so an ack never
  waits for a poll interval;
* :mod:`~ojs_kombu.runtime.subscriptions`: pause, resume and the broker's ``Basic.Cancel``
  (shared with the ``ojs://`` transport);
* :mod:`~ojs_kombu.runtime.window`: the per-queue counters and the window gauges.

Every frame the loop writes goes through the connection's
:class:`~ojs_kombu.amqp.outbox.Outbox`: the acks and nacks of one pass over the requests
leave in one socket write, each its own frame, in order with the republishes' frames.

On a connection loss the loop reconnects with the back-off of DESIGN §9
(a :class:`~ojs_kombu.amqp.reconnect.Reconnector`: ``Forever``, or ``connect_retries``
consecutive failures at most; a permanent refusal ends the loop at once with its typed error),
re-declares the topology and re-registers its consumers with the same
prefetch; deliveries of the lost connection are forgotten (the broker
redelivers them, flagged ``redelivered``).  A broker-initiated ``Basic.Cancel``
(e.g. the queue was deleted) is logged, counted and followed by a re-consume
after a delay.

Pause and resume (``ControlReader.paused``): the loop compares the paused set's version
with what it applied last, on every pass (:meth:`Subscriptions.apply
<ojs_kombu.runtime.subscriptions.Subscriptions.apply>`).  A queue paused at (re)connection
is not consumed at all.

Metrics: ``ojs_amqp_connections_active`` and ``ojs_amqp_channels_active`` (the
consuming and the publishing channel) while connected; the window gauges once per
loop pass (:mod:`~ojs_kombu.runtime.window`).

Shutdown: :meth:`Consumer.close` releases the wake-up pipe.  A handler thread
that settles a delivery after that (a job that outlived the grace period) only
queues a moot request: it never writes to the closed descriptor, whose number
the process may already have given to another file.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from amqp.basic_message import Message
from amqp.channel import Channel
from amqp.exceptions import RecoverableConnectionError
from kombu.connection import Connection

from ojs_kombu.amqp.connection import safe_url
from ojs_kombu.amqp.delivery import RawDelivery
from ojs_kombu.amqp.errors import consuming
from ojs_kombu.amqp.failover import Failover
from ojs_kombu.amqp.framing import FrameReader, attach_reader, pump, read_available, socket_of, tls_pending
from ojs_kombu.amqp.outbox import Outbox, outbox
from ojs_kombu.amqp.publisher import ConfirmedPublisher, Destination
from ojs_kombu.amqp.reconnect import Budgeted, Forever, Reconnector
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.runtime.control import ControlReader
from ojs_kombu.runtime.delivery import Delivery
from ojs_kombu.runtime.requests import Ack, AckMany, Nack, Republish, SettleExecutor, SettleRequests
from ojs_kombu.runtime.subscriptions import Subscription, Subscriptions
from ojs_kombu.runtime.wakeup import Wakeup
from ojs_kombu.runtime.window import Window

logger = logging.getLogger(__name__)

#: The warning for a lost connection (the fields of :data:`~ojs_kombu.amqp.reconnect.RETRY_MESSAGE`).
_LOST = "%(name)s to %(failed)s lost (%(error)s); reconnecting to %(next)s in %(delay).1fs%(note)s"

#: The consumer's two long-lived channels: consuming, and publishing (confirm mode).
_CHANNELS = 2


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
        self._reconnect = Reconnector(
            Forever() if connect_retries is None else Budgeted(None, connect_retries),
            self._failover,
            url=url,
            name="consumer connection",
            message=_LOST,
        )
        self.connection_name = connection_name
        #: The self-pipe that wakes a waiting loop (:mod:`~ojs_kombu.runtime.wakeup`).
        self.wakeup = Wakeup()
        #: The settle requests not carried out yet (:mod:`~ojs_kombu.runtime.requests`).
        self.requests = SettleRequests(self.wakeup)
        self.window = Window(connection_name, prefetch, list(self.queues.values()))
        #: Carries the requests out on the consuming channel (:mod:`~ojs_kombu.runtime.requests`).
        self.settling = SettleExecutor(self.requests, self.window)
        self._stop = threading.Event()
        self._consuming = threading.Event()
        self._cancel_wanted = threading.Event()
        self._generation = 0
        self._channel: Channel | None = None
        self._publisher: ConfirmedPublisher | None = None
        self._subscriber = _Subscriber(self)
        #: The job queues consumed on the current channel (a new set per connection).
        self.subscriptions: Subscriptions[Subscription] = Subscriptions(self._subscriber)
        self._reader: FrameReader | None = None
        self._outbox: Outbox | None = None
        self._paused_version = -1  # the version of control.paused the loop applied last
        self.reconnections = 0
        self.cancellations = 0
        self.connected = threading.Event()
        self._reconnect_at = 0.0  # monotonic: not before (the back-off of a connection lost in serve)
        self._leave: str | None = None  # a node another connection found unable to commit (leave_node)
        self._sock: Any = None  # the connection's socket, for the passes
        self._interval = 1.0  # the longest a pass waits in select
        self._next_heartbeat_check = 0.0
        self.on_pass = on_pass

    # -- thread-safe requests ------------------------------------------------------------------

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge ``delivery`` (``Basic.Ack``, ``multiple=False``)."""
        self.requests.put(Ack(delivery))

    def ack_many(self, deliveries: list[Delivery]) -> None:
        """Acknowledge a batch's ``deliveries`` (one ``Basic.Ack(multiple=True)`` when their tags allow,
        :meth:`SettleExecutor.ack_many <ojs_kombu.runtime.requests.SettleExecutor.ack_many>`)."""
        if deliveries:
            ordered = tuple(sorted(deliveries, key=lambda d: (d.generation, d.delivery_tag)))
            self.requests.put(AckMany(ordered[-1], ordered))

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
            self.requests.put(Nack(delivery))
        else:
            self.requests.put(Republish(delivery, record, delivery.queue, prepare, then="nack"))

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
        self.requests.put(Republish(delivery, destination, queue, prepare))

    def stop_consuming(self) -> None:
        """Cancel every consumer (no new deliveries); the loop keeps settling."""
        self._cancel_wanted.set()
        self.wakeup.wake()

    def stop(self) -> None:
        """End the loop after it has executed the requests already made."""
        self._stop.set()
        self.wakeup.wake()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    def wake(self) -> None:
        """Make a pass waiting in ``select`` return now (thread-safe)."""
        self.wakeup.wake()

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
        self.wakeup.wake()

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

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Consume until :meth:`stop`; reconnect on connection loss."""
        self.wakeup.begin()
        try:
            while not self._stop.is_set():
                try:
                    self._connect()
                    self._loop()
                except self._kombu.connection_errors + self._kombu.channel_errors as exc:
                    self._stop.wait(self._lost(exc))
        finally:
            self.requests.drop_all()
            self._disconnect()
            self.wakeup.end()

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
        (DESIGN §9), or raise when retrying cannot help (the typed refusal) or ``connect_retries``
        is spent (:class:`~ojs_kombu.errors.BrokerConnectionError`)."""
        unsettled = self.window.unsettled
        self._disconnect()
        if self._stop.is_set():
            return 0.0
        # On RabbitMQ 4.3 a quorum queue keeps the deliveries of a consumer whose node became
        # unreachable for x-consumer-disconnected-timeout (60 s by default) before it
        # delivers them again: say how many jobs may wait that long (docs/cluster.md).
        note = (
            f"; {unsettled} unsettled deliveries go back to their queues (from a node that became "
            "unreachable: after the queue's consumer-disconnected timeout)"
            if unsettled
            else ""
        )
        delay = self._reconnect.failed(exc, self._kombu, note=note)
        self.reconnections += 1
        return delay

    def close(self) -> None:
        """Release the wake-up pipe; requests made afterwards are dropped (the broker redelivers).

        Safe at any time: if the loop is still running (it outlived a join timeout),
        the pipe is released when the loop ends instead.  Idempotent.
        """
        self.wakeup.close()

    def _connect(self) -> None:
        if (wait := self._reconnect_at - time.monotonic()) > 0:
            self._stop.wait(wait)  # what is left of the back-off of a connection a stand-in lost
        self._reconnect.connecting()
        self._failover.connect(self._kombu)
        connection = self._kombu.connection
        # Plain TCP: buffered reads (framing.py).  TLS keeps py-amqp's read path.
        self._reader = attach_reader(connection)
        self._outbox = outbox(connection)
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
        self.settling.attach(channel, self._outbox, self._publisher, self._generation)
        if self._reader is not None:
            self._reader.decode_deliveries(channel.channel_id, self._on_raw_delivery)
        # A new channel consumes every queue: a re-consume pending on the old one would double it.
        self.subscriptions = Subscriptions[Subscription](self._subscriber)
        paused = self.control.paused if self.control is not None else ()
        consume = not self._cancel_wanted.is_set()
        for amqp_queue, ojs_queue in self.queues.items():
            self.subscriptions.add(Subscription(amqp_queue, ojs_queue), paused, consume=consume)
        if self.control is not None:
            self._paused_version = self.control.paused.version
        self._reconnect.succeeded()  # after re-declaring and re-consuming: a node that fails those counts
        self._reconnect.reset()
        METRICS.connections_active.inc()
        METRICS.channels_opened(self._channel_count)
        self.connected.set()  # after the gauges: a caller woken by it reads them up to date

    # -- subscriptions -------------------------------------------------------------------------

    def _consume(self, subscription: Subscription) -> str:
        """``Basic.Consume`` ``subscription``'s queue on the consuming channel; its consumer tag."""
        assert self._channel is not None  # connected
        with consuming(subscription.amqp_queue):
            tag: str = self._channel.basic_consume(
                subscription.amqp_queue,
                no_ack=False,
                callback=self._on_message,
                on_cancel=self._on_cancel,
            )
        self._consuming.set()
        return tag

    def _cancel(self, subscription: Subscription) -> None:
        """``Basic.Cancel`` ``subscription``'s consumer."""
        assert self._channel is not None  # connected
        self._channel.basic_cancel(subscription.tag)

    def _on_cancel(self, consumer_tag: str) -> None:
        then = f"re-consuming in {self.cancel_retry_delay:.1f}s"
        if self.subscriptions.broker_cancelled(consumer_tag, self.cancel_retry_delay, then) is not None:
            self.cancellations += 1

    def _apply_pauses(self) -> None:
        """Cancel the consumers of paused queues and consume resumed ones (when the state changed)."""
        control = self.control
        if control is None or control.paused.version == self._paused_version:
            return
        self._paused_version = control.paused.version
        self.subscriptions.apply(control.paused, resume=not self._cancel_wanted.is_set())
        if not self.subscriptions.consuming:
            self._consuming.clear()

    def _reconsume_cancelled(self) -> None:
        if not self.subscriptions.retrying or self._cancel_wanted.is_set():
            return
        for subscription in self.subscriptions.due():
            try:
                self.topology.forget(subscription.ojs_queue)
                if self.declare:
                    self.declare(self._kombu.connection)
                else:
                    self.topology.ensure_queue(self._kombu.connection, subscription.ojs_queue)
                self.subscriptions.start(subscription)
                logger.info("re-consuming %s after a broker cancel", subscription.amqp_queue)
            except self._kombu.channel_errors as exc:
                logger.warning("re-consuming %s failed (%s); trying again", subscription.amqp_queue, exc)
                raise

    def _cancel_all(self) -> None:
        self.subscriptions.cancel_all()
        self._consuming.clear()

    # -- passes --------------------------------------------------------------------------------

    def _disconnect(self) -> None:
        if self.connected.is_set():
            METRICS.connections_active.dec()
            METRICS.channels_closed(self._channel_count)
        self.connected.clear()
        self.window.forget()  # the broker takes the unsettled deliveries of a lost channel back
        self._consuming.clear()  # no consumer outlives its channel
        self._channel = None
        self._publisher = None
        self._reader = None
        self._outbox = None
        self.settling.detach()
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
        self._sock = socket_of(self._kombu.connection)
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
        self.settling.execute()
        self._reconsume_cancelled()
        if self.control is not None:
            self.control.maintain(connection)
            self._apply_pauses()
        if reader is not None:
            # Frames may already be buffered (read by a drain_events, e.g. while waiting for
            # confirms): they do not make the socket readable, so do not wait in select then.
            if not reader.has_frame() and self.wakeup.wait(sock, self._interval, self.requests.empty):
                reader.fill()
            reader.dispatch()
        else:
            if not tls_pending(sock):
                self.wakeup.wait(sock, self._interval, self.requests.empty)
            read_available(connection)
        # Once per interval, not per pass (a busy loop makes thousands): py-amqp's tick wants
        # about two per heartbeat, and the loop never waits longer than the interval.
        if self.heartbeat and (now := time.monotonic()) >= self._next_heartbeat_check:
            self._kombu.heartbeat_check()
            self._next_heartbeat_check = now + self._interval
        if self.window.changed:
            self.window.record()

    def _finish(self) -> None:
        """The end of consuming: execute the last requests, wait for republishes to settle."""
        self.settling.finish(timeout=10)

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

    def _pump(self, timeout: float) -> None:
        """Read and dispatch what arrives within ``timeout`` seconds (the buffered reader when there is one)."""
        pump(self._kombu.connection, self._reader, timeout)

    # -- deliveries ----------------------------------------------------------------------------

    def _on_message(self, message: Message) -> None:
        """A delivery read by py-amqp (TLS, or what the direct decoder leaves to it)."""
        info = message.delivery_info
        subscription = self.subscriptions.by_tag.get(info["consumer_tag"])
        amqp_queue = subscription.amqp_queue if subscription is not None else ""
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
        subscription = self.subscriptions.by_tag.get(raw.consumer_tag)
        if subscription is None:
            return False
        self._deliver(
            subscription.amqp_queue,
            raw.properties,
            raw.body,
            raw.delivery_tag,
            raw.redelivered,
            raw.exchange,
            raw.routing_key,
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
        self.window.delivered(queue)
        self.settling.delivered(delivery_tag)
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


class _Subscriber:
    """The consumer's channel as a :class:`~ojs_kombu.runtime.subscriptions.Subscriber`."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def consume(self, subscription: Subscription) -> str:
        """``Basic.Consume`` on the consumer's channel."""
        return self._consumer._consume(subscription)

    def cancel(self, subscription: Subscription) -> None:
        """``Basic.Cancel`` on the consumer's channel."""
        self._consumer._cancel(subscription)


__all__ = [
    "Consumer",
    "Delivery",
]
