"""The ``ojs://`` channel: a py-amqp channel that rewrites what passes through it (see :mod:`ojs_kombu.transport`).

Which queues are job queues (the rule the package docs describe) is decided
here, in :meth:`Channel.queue_declare` and :meth:`Channel.queue_bind`; routing,
declarations and task publishing are the connection's
(:class:`~ojs_kombu.transport.state.ConnectionState`); settling is the runtime's
:class:`~ojs_kombu.runtime.settle.Settler` (:mod:`ojs_kombu.transport.settlement`).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import amqp
from amqp.exceptions import RecoverableConnectionError
from kombu.transport import pyamqp

from ojs_kombu.amqp.delivery import RawDelivery
from ojs_kombu.amqp.outbox import defer_ack
from ojs_kombu.amqp.passthrough import (
    consumer_cancelled,
    decode_deliveries,
    publish_plain,
    publishes_through_basic_publish,
    send_nack,
    without_confirm_wrapper,
)
from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.policy.retry import Failure, decide
from ojs_kombu.runtime.consumer import Delivery
from ojs_kombu.runtime.limits import Admitted, Limiter
from ojs_kombu.runtime.settle import Settler
from ojs_kombu.runtime.subscriptions import Subscriptions
from ojs_kombu.runtime.window import QueueCounters
from ojs_kombu.transport.limits import ChannelLimits, JobPolicy
from ojs_kombu.transport.message import DecodedMessage
from ojs_kombu.transport.queues import ExchangeDeclaration
from ojs_kombu.transport.settlement import ChannelSettlement, delivery_from, delivery_of, is_envelope
from ojs_kombu.transport.state import ConnectionState
from ojs_kombu.transport.subscriber import JobConsumer, JobSubscriber
from ojs_kombu.wire.codec import decode

logger = logging.getLogger(__name__)

#: A job delivered this much before its ``scheduled_at`` goes back into the cascade;
#: less than that is left to the framework (Celery waits for the ETA itself).
EARLY_TOLERANCE_MS = 1000

#: Exchange types whose queues are never job queues: a message there is for every bound queue.
BROADCAST_EXCHANGE_TYPES = frozenset({"fanout", "topic", "headers"})

#: AMQP names that already belong to the binding (any prefix): used as they are.
_OJS_NAME_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_\-.]*\.)?ojs\.")
#: Exchanges always declared when asked: the binding's own and the broker's ``amq.*``.
_OWN_EXCHANGE_RE = re.compile(rf"{_OJS_NAME_RE.pattern}|^amq\.")


@dataclass
class _Unsettled:
    """A job delivery (from a job queue, an OJS envelope) not acked or rejected yet.

    ``job`` is None while the transport itself is settling it (the framework never saw it).
    """

    delivery: Delivery
    job: Job | None = None
    failure: Failure | None = None  # what the framework said failed, for a reject (note_failure)
    succeeded: bool = False  # the framework's next ack of it is a success (note_success)
    held: Admitted = ()  # the permits of its rate limits, given back when it is acked or rejected


@publishes_through_basic_publish  # py-amqp's confirm wrapper publishes through basic_publish too
class Channel(pyamqp.Channel):
    """A py-amqp channel speaking the OJS binding for job queues (see :mod:`ojs_kombu.transport`)."""

    def __init__(self, connection: Any, *args: Any, **kwargs: Any):
        super().__init__(connection, *args, **kwargs)
        # py-amqp swaps in its one-at-a-time confirm wrapper per instance; our
        # basic_publish decides per message instead.
        without_confirm_wrapper(self)
        #: The job queue consumers (pause, resume, broker cancel), by the framework's tags.
        self.subscriptions: Subscriptions[JobConsumer] = Subscriptions(JobSubscriber(self))
        self._unsettled: dict[int, _Unsettled] = {}
        # The type of an exchange declared since the last queue declaration or binding: kombu's
        # Queue.declare() declares its exchange right before its queue (see queue_declare).
        self._exchange_type: str | None = None
        self._metric = QueueCounters()
        state = self.ojs
        self.settler = Settler(
            ChannelSettlement(self),
            state.names,
            state.topology,
            state.cascade,
            early_tolerance_ms=EARLY_TOLERANCE_MS,
            discard_expired=False,  # Celery checks ``expires`` itself and records the task as revoked
            cancelled=state.is_cancelled,
            lifecycle=state.settings.load_lifecycle(),
            unique=state,
            completed=state.completed,
            sweep=state.sweep,
        )
        self._completed = state.completed
        #: The jobs' rate limits (``rate_limit``, the ``rate_limits`` option): a Limiter made by the first limited job.
        self.limits = ChannelLimits(self._limiter, state.settings.load_rate_limits())

    # -- helpers -------------------------------------------------------------------------------

    @property
    def ojs(self) -> ConnectionState:
        """The OJS state of the connection this channel belongs to.

        Raises:
            RecoverableConnectionError: the channel is closed (py-amqp's error for any call on a
                closed channel, which kombu's ``ensure`` answers with a new channel).
        """
        connection = self.connection
        if connection is None:
            raise RecoverableConnectionError(f"channel {self.channel_id} is closed")
        state: ConnectionState = connection.ojs
        return state

    @property
    def publisher(self) -> ConfirmedPublisher:
        """The connection's confirmed publisher (for the transport's own republishes)."""
        return self.ojs.publisher

    def _job_queue(self, name: str) -> str | None:
        """The OJS queue a framework queue name stands for, or None if it is not a job queue."""
        return self.ojs.queues.queues.get(name)

    def _is_job_queue_declaration(
        self, queue: str, passive: bool, durable: bool, exclusive: bool, auto_delete: bool, exchange_type: str | None
    ) -> bool:
        return (
            not passive
            and durable
            and not exclusive
            and not auto_delete
            and bool(queue)
            and exchange_type not in BROADCAST_EXCHANGE_TYPES
            and not _OJS_NAME_RE.match(queue)
            and queue not in self.ojs.settings.passthrough_queues
        )

    # -- declarations --------------------------------------------------------------------------

    def exchange_declare(
        self,
        exchange: str,
        type: str,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = True,
        nowait: bool = False,
        arguments: dict[str, Any] | None = None,
        argsig: str = "BssbbbbbF",
    ) -> Any:
        """Declare an exchange, remembering its type (see :meth:`queue_declare`).

        A durable direct exchange (Celery's task exchange ``celery`` & co.) is declared only when
        something needs it (:meth:`_declare_deferred`): the job queues bound to it are routed
        through ``ojs.exchange.direct``, so it would be an unprefixed exchange nobody uses.
        A passive declaration carries the type the caller expects: it counts too.
        """
        if exchange and type:
            self.ojs.queues.exchange_types[exchange] = type
            self._exchange_type = type
        if passive:
            self._declare_deferred(exchange)
        elif exchange and type == "direct" and durable and not auto_delete and not _OWN_EXCHANGE_RE.match(exchange):
            self.ojs.queues.deferred_exchanges[exchange] = ExchangeDeclaration(type, durable, auto_delete, arguments)
            return None
        return super().exchange_declare(exchange, type, passive, durable, auto_delete, nowait, arguments, argsig)

    def _declare_deferred(self, exchange: str) -> None:
        """Declare ``exchange`` now if its declaration was held back (see :meth:`exchange_declare`)."""
        declaration = self.ojs.queues.deferred_exchanges.pop(exchange, None)
        if declaration is not None:
            super().exchange_declare(
                exchange,
                declaration.type,
                False,
                declaration.durable,
                declaration.auto_delete,
                False,
                declaration.arguments,
            )

    def queue_declare(
        self,
        queue: str = "",
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = True,
        nowait: bool = False,
        arguments: dict[str, Any] | None = None,
        argsig: str = "BsbbbbbF",
    ) -> Any:
        """Declare ``ojs.queue.{q}`` (with DLQ and bindings) for a job queue; other queues as usual.

        A durable queue declared right after a fanout, topic or headers
        exchange on this channel (kombu declares a queue's exchange just before
        the queue) is a plain queue.
        """
        state = self.ojs
        exchange_type, self._exchange_type = self._exchange_type, None
        ojs_queue = self._job_queue(queue)
        if ojs_queue is None and self._is_job_queue_declaration(
            queue, passive, durable, exclusive, auto_delete, exchange_type
        ):
            ojs_queue = state.register_queue(queue, arguments)
        if ojs_queue is None:
            return super().queue_declare(queue, passive, durable, exclusive, auto_delete, nowait, arguments, argsig)
        if not passive:
            state.ensure_queue(ojs_queue)
        if nowait:
            return None
        return super().queue_declare(state.names.job_queue(ojs_queue), passive=True)

    def queue_bind(
        self,
        queue: str,
        exchange: str = "",
        routing_key: str = "",
        nowait: bool = False,
        arguments: dict[str, Any] | None = None,
        argsig: str = "BsssbF",
    ) -> Any:
        """Remember a job queue's binding to a direct exchange (for routing) instead of creating it.

        A job queue bound to a fanout, topic or headers exchange becomes a
        plain queue: it is declared as the framework asked and bound for real.
        """
        self._exchange_type = None
        state = self.ojs
        ojs_queue = self._job_queue(queue)
        if ojs_queue is not None and state.queues.exchange_types.get(exchange) in BROADCAST_EXCHANGE_TYPES:
            self._make_plain(queue)
            ojs_queue = None
        if ojs_queue is None or exchange == state.names.direct_exchange:
            self._declare_deferred(exchange)
            return super().queue_bind(
                queue if ojs_queue is None else state.names.job_queue(ojs_queue),
                exchange,
                routing_key,
                nowait,
                arguments,
                argsig,
            )
        state.queues.bindings[(exchange, routing_key)] = queue
        return None

    def _make_plain(self, queue: str) -> None:
        """A queue taken for a job queue turns out to be bound to a broadcast exchange: a plain queue after all."""
        arguments = self.ojs.queues.arguments.get(queue)
        self.ojs.queues.forget(queue)
        logger.info("queue %s is bound to a broadcast exchange: a plain AMQP queue, not a job queue", queue)
        super().queue_declare(queue, durable=True, auto_delete=False, arguments=arguments)

    def queue_unbind(
        self,
        queue: str,
        exchange: str,
        routing_key: str = "",
        nowait: bool = False,
        arguments: dict[str, Any] | None = None,
        argsig: str = "BsssF",
    ) -> Any:
        """Forget a job queue's binding; other queues as usual."""
        if self._job_queue(queue) is not None:
            self.ojs.queues.bindings.pop((exchange, routing_key), None)
            return None
        return super().queue_unbind(queue, exchange, routing_key, nowait, arguments, argsig)

    def queue_purge(self, queue: str = "", nowait: bool = False, argsig: str = "Bsb") -> Any:
        """Purge ``ojs.queue.{q}`` for a job queue."""
        return super().queue_purge(self._amqp_name(queue), nowait, argsig)

    def queue_delete(
        self,
        queue: str = "",
        if_unused: bool = False,
        if_empty: bool = False,
        nowait: bool = False,
        argsig: str = "Bsbbb",
    ) -> Any:
        """Delete ``ojs.queue.{q}`` for a job queue (its DLQ and retry queues stay)."""
        return super().queue_delete(self._amqp_name(queue), if_unused, if_empty, nowait, argsig)

    def _amqp_name(self, queue: str) -> str:
        ojs_queue = self._job_queue(queue)
        return queue if ojs_queue is None else self.ojs.names.job_queue(ojs_queue)

    # -- publishing ----------------------------------------------------------------------------

    def basic_publish(
        self,
        msg: amqp.Message,
        exchange: str = "",
        routing_key: str = "",
        mandatory: bool = False,
        immediate: bool = False,
        timeout: float | None = None,
        confirm_timeout: float | None = None,
        argsig: str = "Bssbb",
    ) -> Any:
        """Publish ``msg``: task messages and messages for job queues the OJS way, the rest untouched."""
        self._exchange_type = None
        state = self.ojs
        target = state.route(exchange, routing_key)
        headers = msg.properties.get("application_headers") or {}
        if target is not None and (codec := state.codec) is not None and codec.is_task(msg.properties, headers):
            return state.publish_task(msg, target, confirm_timeout or timeout)
        if target is not None and exchange not in state.ojs_exchanges:
            exchange, routing_key = state.names.direct_exchange, target
            state.ensure_queue(target)
        elif exchange in state.queues.deferred_exchanges:
            self._declare_deferred(exchange)
        # Pass-through traffic: py-amqp's publish, confirmed one at a time when confirm_publish.
        return publish_plain(self, msg, exchange, routing_key, mandatory, immediate, timeout, confirm_timeout, argsig)

    def basic_publish_confirm(self, *args: Any, **kwargs: Any) -> Any:
        """Same as :meth:`basic_publish` (which confirms pass-through traffic when ``confirm_publish``)."""
        return self.basic_publish(*args, **kwargs)

    # -- consuming -----------------------------------------------------------------------------

    def basic_qos(self, prefetch_size: int, prefetch_count: int, a_global: bool, argsig: str = "lBb") -> Any:
        """Always per-consumer prefetch (``global=False``): the binding's FETCH, and what quorum queues need."""
        self.limits.prefetch = prefetch_count
        return super().basic_qos(prefetch_size, prefetch_count, False, argsig)

    def basic_consume(
        self,
        queue: str = "",
        consumer_tag: str = "",
        no_local: bool = False,
        no_ack: bool = False,
        exclusive: bool = False,
        nowait: bool = False,
        callback: Callable[[Any], Any] | None = None,
        arguments: dict[str, Any] | None = None,
        on_cancel: Callable[[str], Any] | None = None,
        argsig: str = "BssbbbbF",
    ) -> Any:
        """Consume ``ojs.queue.{q}`` for a job queue; its deliveries are converted by :meth:`_deliver`."""
        ojs_queue = self._job_queue(queue)
        if ojs_queue is None or callback is None:
            return super().basic_consume(
                queue, consumer_tag, no_local, no_ack, exclusive, nowait, callback, arguments, on_cancel, argsig
            )
        state = self.ojs
        amqp_name = state.names.job_queue(ojs_queue)
        # Every cancel and pause still retained is known before the first job of the queue arrives,
        # and every completed job id (deduplicate).
        state.control.ensure_reading(self.connection, ojs_queue)
        if state.completed is not None:
            state.completed.ensure(ojs_queue)
        state.job_channels.add(self)

        def deliver(raw: amqp.Message, q: str = queue, cb: Callable[[Any], Any] = callback) -> Any:
            return self._deliver(raw, q, cb)

        paused = state.control.paused
        if not consumer_tag and ojs_queue in paused:
            consumer_tag = f"ojs-paused-{uuid.uuid4().hex}"  # paused: remembered, consumed on resume
        consumer = JobConsumer(
            amqp_name,
            ojs_queue,
            tag=consumer_tag,
            deliver=deliver,
            on_cancel=on_cancel or self._on_broker_cancel,
            no_local=no_local,
            no_ack=no_ack,
            exclusive=exclusive,
            nowait=nowait,
            arguments=arguments,
            argsig=argsig,
            framework_queue=queue,
            callback=callback,
        )
        self.subscriptions.add(consumer, paused)
        # One channel per connection has the frame reader decode its deliveries (_on_raw_delivery):
        # the first that consumes a job queue, or the next one once it has closed (a Celery worker
        # consumes its tasks on one channel).
        decode_deliveries(self, self.connection.frame_reader, self._on_raw_delivery)
        return consumer.tag

    def basic_cancel(self, consumer_tag: str, nowait: bool = False, argsig: str = "sb") -> Any:
        """``Basic.Cancel``; a job queue consumer that is paused has nothing to cancel at the broker."""
        consumer = self.subscriptions.remove(consumer_tag)
        if consumer is not None and consumer.paused:
            return None
        return super().basic_cancel(consumer_tag, nowait, argsig)

    def apply_pauses(self, paused: frozenset[str]) -> None:
        """Stop consuming the paused job queues (``Basic.Cancel``), consume resumed ones again (``Basic.Consume``).

        The framework's consumer tags stay valid: a resumed queue is consumed with the
        same tag, callback and arguments.  Deliveries received before the cancel are
        settled as usual on this channel.  Called by the connection's loop (see
        :meth:`ConnectionState.maintain <ojs_kombu.transport.state.ConnectionState.maintain>`).

        Parameters:
            paused: the OJS queues paused now.
        """
        if self.is_open:
            self.subscriptions.apply(paused)

    def basic_get(self, queue: str = "", no_ack: bool = False, argsig: str = "Bsb") -> Any:
        """``Basic.Get`` from ``ojs.queue.{q}`` for a job queue, converted like a delivery."""
        ojs_queue = self._job_queue(queue)
        if ojs_queue is None:
            return super().basic_get(queue, no_ack, argsig)
        raw = super().basic_get(self.ojs.names.job_queue(ojs_queue), no_ack, argsig)
        if raw is None or not is_envelope(raw.properties):
            return raw
        delivery = delivery_of(raw, ojs_queue)
        try:
            job = decode(delivery.body, delivery.properties, delivery.headers)
        except DecodeError:
            return raw
        message = self._converted(raw.properties, raw.delivery_info, job, queue)
        if not no_ack:
            self._metric(METRICS.messages_consumed, ojs_queue).inc()
            self._unsettled[raw.delivery_tag] = _Unsettled(delivery, job)
        return message

    def delivered_job(self, delivery_tag: int) -> Job | None:
        """The decoded job of a delivery this channel passed to the framework and that is not settled yet.

        Parameters:
            delivery_tag: the delivery's tag on this channel.

        Returns:
            The job (``attempt`` counts the executions before this one), or None for a
            delivery that is not a job, is settled, or is being settled by the transport.
        """
        unsettled = self._unsettled.get(delivery_tag)
        return None if unsettled is None else unsettled.job

    def _on_broker_cancel(self, consumer_tag: str) -> None:
        self.subscriptions.broker_cancelled(consumer_tag, None, "the consumer restarts and re-consumes")
        self.subscriptions.remove(consumer_tag)
        raise consumer_cancelled(consumer_tag)

    def _deliver(self, raw: amqp.Message, queue: str, callback: Callable[[Any], Any]) -> Any:
        """Convert a delivery from job queue ``queue`` and pass it on, or settle it here (the Settler)."""
        if not is_envelope(raw.properties):
            return callback(raw)  # not OJS (a plain kombu message, a stock Celery producer): untouched
        ojs_queue = self.ojs.queues.queues.get(queue) or queue
        return self._deliver_job(delivery_of(raw, ojs_queue), raw.properties, raw.delivery_info, queue, callback)

    def _on_raw_delivery(self, raw: RawDelivery) -> bool:
        """A delivery the connection's frame reader decoded (see :meth:`_read_deliveries_directly`).

        A job delivery to a job queue consumer takes the path of :meth:`_deliver` without a
        py-amqp message in between (and its body stays bytes); anything else is left to
        py-amqp (False), which reads it as it reads every other frame.
        """
        consumer = self.subscriptions.by_tag.get(raw.consumer_tag)
        properties = raw.properties
        if consumer is None or not self.is_open or not is_envelope(properties):
            return False
        delivery_info = {  # what py-amqp's Channel._on_basic_deliver makes of Basic.Deliver
            "consumer_tag": raw.consumer_tag,
            "delivery_tag": raw.delivery_tag,
            "redelivered": raw.redelivered,
            "exchange": raw.exchange,
            "routing_key": raw.routing_key,
        }
        delivery = delivery_from(properties, raw.body, delivery_info, consumer.ojs_queue)
        self._deliver_job(delivery, properties, delivery_info, consumer.framework_queue, consumer.callback)
        return True

    def _deliver_job(
        self,
        delivery: Delivery,
        properties: dict[str, Any],
        delivery_info: dict[str, Any],
        queue: str,
        callback: Callable[[Any], Any],
        admitted: bool = False,
    ) -> Any:
        """Triage a job delivery from framework queue ``queue``; pass the converted message to ``callback``
        (``admitted``: a parked delivery back from its waiter, counted when it arrived)."""
        if not admitted:
            self._metric(METRICS.messages_consumed, delivery.queue).inc()
        unsettled = self._unsettled[delivery.delivery_tag] = _Unsettled(delivery)
        job = self.settler.triage(delivery)
        if job is None:
            return None  # settled (or being settled) by the Settler
        try:
            message = self._converted(properties, delivery_info, job, queue)
        except (ValidationError, ValueError, TypeError) as exc:
            self.settler.reject_invalid(delivery, "invalid_envelope", str(exc))
            return None
        unsettled.job = job
        if self.limits.applies(job):
            verdict = self.limits.admit(delivery, job, (properties, delivery_info, queue, callback))
            if isinstance(verdict, str):  # settled, or parked: admitted later, back here on the connection's loop
                return None
            unsettled.held = verdict
        return callback(message)

    def _limiter(self, park_limit: int, job_policy: JobPolicy | None) -> Limiter:
        """The Limiter of :attr:`limits` (made by its first limited job): permits of this connection."""
        state = self.ojs
        if state.permits is None:
            raise LookupError("this ojs:// connection has no permits for rate limits")
        return Limiter(
            state.permits,
            {},
            self.settler,
            lambda delivery: state.call_soon(partial(self._admitted, delivery)),
            park_limit=park_limit,  # at least 1
            job_policy=job_policy,
        )

    def _admitted(self, delivery: Delivery) -> None:
        """A parked job whose waiter took its permits and start tokens (on the connection's loop): delivered now."""
        parked = self.limits.admitted(delivery, self.is_open)
        if parked is not None:
            self._deliver_job(delivery, *parked, admitted=True)

    def _converted(
        self, properties: dict[str, Any], delivery_info: dict[str, Any], job: Job, queue: str
    ) -> DecodedMessage:
        headers = properties.get("application_headers") or {}
        codec = self.ojs.codec
        if codec is None:
            # Not a ValueError: the job is fine, it must not be dead-lettered.  It stays unacked
            # (the broker requeues it when the connection closes).
            raise LookupError(
                "a job was delivered on an ojs:// connection that has no task codec: set the transport "
                "option codec, or import the framework adapter that registers one (ojs_celery)"
            )
        task = codec.task_message(job, properties, headers)
        delivery_info = {
            **delivery_info,
            # The framework republishes retries to where the delivery came from:
            # the anonymous exchange with its own queue name routes back here.
            "exchange": "",
            "routing_key": queue,
            # Not the first execution: the broker redelivered it, or it is a retry.
            "redelivered": bool(delivery_info.get("redelivered")) or job.attempt > 0,
        }
        return DecodedMessage(self, task, delivery_info)

    def message_to_python(self, raw_message: Any) -> Any:
        """kombu's message for a raw py-amqp message; a converted job delivery is one already."""
        if isinstance(raw_message, DecodedMessage):
            return raw_message
        return super().message_to_python(raw_message)  # type: ignore[no-untyped-call]

    # -- settling ------------------------------------------------------------------------------

    def basic_ack(self, delivery_tag: int, multiple: bool = False, argsig: str = "Lb") -> Any:
        """``Basic.Ack``; a job delivery is forgotten and counted.

        With ``deduplicate``, the ack of a success (:meth:`note_success`) waits for the job id's
        record to be confirmed: the connection's loop sends it then.
        """
        if self._completed is not None and not multiple:
            unsettled = self._unsettled.get(delivery_tag)
            if unsettled is not None and unsettled.succeeded and unsettled.job is not None:
                unsettled.succeeded = False
                state = self.ojs
                # Recorded (confirmed), then acked: see ojs_kombu.runtime.completed for the crash windows.
                self._completed.record(
                    unsettled.job.id, unsettled.delivery.queue, partial(state.ack_recorded, self, delivery_tag)
                )
                return None
        self._forget(delivery_tag, multiple, METRICS.messages_acked)
        if not multiple and defer_ack(self, delivery_tag):  # kombu's event loop writes it before it polls
            return None
        return super().basic_ack(delivery_tag, multiple, argsig)

    def basic_reject(self, delivery_tag: int, requeue: bool, argsig: str = "Lb") -> Any:
        """``Basic.Nack(requeue=False)`` (dead-lettered); a job is never requeued (see the package docs).

        ``requeue=True`` on a job counts a failed attempt (``requeued``): the
        Settler retries it or dead-letters it once its attempts are spent.
        """
        if requeue and self._fail_requeued_job(delivery_tag, "rejected"):
            return None
        if requeue:
            return super().basic_reject(delivery_tag, requeue, argsig)
        return self.basic_nack(delivery_tag)

    def basic_nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = False) -> None:
        """Send a real ``Basic.Nack`` (py-amqp has none); ``requeue=False`` dead-letters the message.

        ``requeue=True`` on one job counts a failed attempt (``requeued``), as :meth:`basic_reject`
        does.  ``multiple=True`` with ``requeue=True`` goes to the broker as it is: the jobs come
        back ``redelivered`` and each counts a failed attempt (``worker_lost``) then, so on every
        RabbitMQ version (4.3 does not count a nack's return towards a quorum queue's delivery
        limit) a job given back every time still ends in its dead letter queue.
        """
        if requeue and not multiple and self._fail_requeued_job(delivery_tag, "nacked"):
            return
        if not requeue and not multiple and self._dead_letter_noted(delivery_tag):
            return
        self._forget(delivery_tag, multiple, METRICS.messages_nacked)
        send_nack(self, delivery_tag, multiple, requeue)

    def note_success(self, delivery_tag: int) -> None:
        """The next ack of ``delivery_tag`` says its job completed (the handler returned).

        Called by a framework adapter (``ojs_celery`` on an ``acks_late`` success) right before
        it acks.  With the transport option ``deduplicate`` the job id is then recorded as
        completed, confirmed, before the ack; an ack without it (a retry's, a revoke's) records
        nothing.  Unknown or already settled delivery tags are ignored.
        """
        unsettled = self._unsettled.get(delivery_tag)
        if unsettled is not None and unsettled.job is not None:
            unsettled.succeeded = True

    def note_failure(self, delivery_tag: int, failure: Failure) -> None:
        """What failed in the job of ``delivery_tag``: a reject that follows dead-letters it with
        ``failure`` as its final failure (recorded, then nacked: see :meth:`Settler.dead_letter`).

        Called by a framework adapter (``ojs_celery``) before it rejects an exhausted task.
        Unknown or already settled delivery tags are ignored.
        """
        unsettled = self._unsettled.get(delivery_tag)
        if unsettled is not None and unsettled.job is not None:
            unsettled.failure = failure

    def _dead_letter_noted(self, delivery_tag: int) -> bool:
        """A reject of a job whose failure was noted: settled by the Settler; False otherwise."""
        unsettled = self._unsettled.get(delivery_tag)
        if unsettled is None or unsettled.job is None or unsettled.failure is None:
            return False
        job, failure = unsettled.job, unsettled.failure
        unsettled.job = unsettled.failure = None  # the Settler's nack comes back through basic_nack
        self.settler.dead_letter(unsettled.delivery, job, job.attempt + 1, failure, "rejected by the framework")
        return True

    def _fail_requeued_job(self, delivery_tag: int, how: str) -> bool:
        """A job delivery given back with ``requeue=True``: a failed attempt (``requeued``), settled by
        the Settler (retry queue, or the DLQ once its attempts are spent).  False if not a job's."""
        unsettled = self._unsettled.get(delivery_tag)
        if unsettled is None:
            return False
        if unsettled.job is None:  # settling already: a second requeue counts no attempt and sends nothing
            return True
        job, attempt = unsettled.job, unsettled.job.attempt + 1
        unsettled.job = None
        failure = Failure("requeued", "Requeued", f"attempt {attempt} was {how} with requeue=True")
        self.settler.fail(unsettled.delivery, job, attempt, failure, decide(job, attempt, error_type="requeued"))
        return True

    def _forget(self, delivery_tag: int, multiple: bool, counter: Any) -> None:
        tags = [t for t in self._unsettled if t <= delivery_tag] if multiple else [delivery_tag]
        for tag in tags:
            unsettled = self._unsettled.pop(tag, None)
            if unsettled is not None:
                self._metric(counter, unsettled.delivery.queue).inc()
                self.limits.release(unsettled.held)

    def collect(self) -> None:
        """Tear down this channel (py-amqp), dropping the per-delivery state (and what its limiter holds)."""
        self.limits.close(unsettled.held for unsettled in self._unsettled.values())
        self._unsettled.clear()
        self.subscriptions.clear()
        super().collect()


__all__ = ["BROADCAST_EXCHANGE_TYPES", "EARLY_TOLERANCE_MS", "Channel"]
