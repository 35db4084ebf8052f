"""The ``ojs://`` / ``ojss://`` kombu transports: kombu and Celery traffic on the OJS wire.

Importing :mod:`ojs_kombu` registers the aliases, so ``kombu.Connection("ojs://…")``
and Celery's ``broker_url="ojs://…"`` resolve to these classes; the config-only
path is ``broker_transport="ojs_kombu.transport:Transport"``.

The transport is py-amqp's, with a :class:`Channel` that rewrites what passes
through it (DESIGN §2–§6):

* **Job queues.**  A durable, non-exclusive, non-auto-delete queue declared
  through the channel (Celery's ``celery`` queue, a kombu ``Queue("email")``)
  is an OJS job queue: declaring it declares ``ojs.queue.{q}`` with its dead
  letter queue and bindings; consuming, purging or deleting it acts on
  ``ojs.queue.{q}``.  Bindings of such a queue to another exchange are
  remembered (for routing), not created.  Queue names that are not valid OJS
  names are mapped (:func:`ojs_queue_for`: ``Reports_High`` -> ``reports-high``).
* **Publishing.**  A task message (recognised by the framework codec, by default
  Celery protocol v2: see :mod:`ojs_celery.protocol`) addressed to a job queue
  becomes an OJS envelope published with confirms and ``mandatory`` to
  ``ojs.exchange.direct``; a retried task (``retries > 0``) goes to
  ``ojs.queue.retry.{q}.{ms}`` (the delay rounded up to the retry ladder); a
  task with a future ETA goes through the scheduling cascade.  A ``Basic.Return``
  or ``Basic.Nack`` raises :class:`~ojs_kombu.errors.UnroutableError` /
  :class:`~ojs_kombu.errors.PublishNackedError`.  Any other message addressed
  to a job queue is re-addressed to ``ojs.exchange.direct`` with its body
  untouched; everything else (remote control, events, ``rpc://`` results,
  messages to exchanges the transport does not know) passes through untouched.
* **Consuming.**  An OJS envelope delivered from a job queue is handed to the
  consumer as the framework's task message (an envelope from any other OJS
  producer becomes a task message for the task whose name maps to its
  ``type``).  A ``redelivered`` job (the worker running it died) counts as a
  failed attempt; a job that arrives before its ``scheduled_at`` goes back into
  the cascade; an invalid envelope goes to its dead letter queue.  Other
  messages pass through untouched.
* **Settling.**  ``basic_reject(requeue=False)`` sends a real ``Basic.Nack``
  (dead-lettered into ``ojs.queue.dlx.{q}``); ``requeue=True`` on a job never
  requeues: it counts a failed attempt (retry queue, confirmed, then ack; or the
  dead letter queue once the attempts are spent).  ``basic_qos`` is always
  ``global=False``.  A broker-initiated consumer cancel is logged and counted,
  then raised as kombu's recoverable ``ConsumerCancelled`` so the consumer
  re-declares and re-consumes.

Transport options (``transport_options=`` / Celery ``broker_transport_options``),
removed before the py-amqp connection sees them:

``prefix``
    multi-tenant entity prefix (``tenant1.ojs.queue.email``).
``queue_options``
    a :class:`~ojs_kombu.wire.entities.QueueOptions` or a dict of its fields for every job queue.
``passthrough_queues``
    durable queue names that stay plain AMQP queues.
``codec``
    the task message codec: an object or ``"module:Class"`` (default
    :class:`ojs_celery.protocol.CeleryCodec`).
``confirm_timeout``
    seconds to wait for the confirm of a job publish (default 30).

``confirm_publish`` keeps its py-amqp meaning for pass-through traffic; job
messages are always confirmed.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import amqp
from amqp import spec
from amqp.exceptions import ConsumerCancelled, MessageNacked, RecoverableConnectionError
from kombu.transport import TRANSPORT_ALIASES, pyamqp
from kombu.utils.imports import symbol_by_name

from ojs_kombu.amqp.connection import DEFAULT_HEARTBEAT
from ojs_kombu.amqp.framing import FrameReader
from ojs_kombu.amqp.framing import supports as framing_supports
from ojs_kombu.amqp.publisher import ConfirmedPublisher, PublishTicket
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import QUEUE_NAME_RE, Names, ojs_queue_for
from ojs_kombu.model.timefmt import utcnow
from ojs_kombu.observability.metrics import METRICS
from ojs_kombu.policy.retry import Decision, Failure, Outcome, decide, ladder_ms, record_failure
from ojs_kombu.policy.schedule import Cascade, delay_ms_until
from ojs_kombu.wire.codec import ACCEPTED_CONTENT_TYPES, CONTENT_TYPE, OutgoingMessage, decode
from ojs_kombu.wire.entities import QueueOptions
from ojs_kombu.wire.headers import Header

logger = logging.getLogger(__name__)

DEFAULT_CODEC = "ojs_celery.protocol:CeleryCodec"
DEFAULT_CONFIRM_TIMEOUT = 30.0
#: A job delivered this much before its ``scheduled_at`` goes back into the cascade;
#: less than that is left to the framework (Celery waits for the ETA itself).
EARLY_TOLERANCE_MS = 1000

_OJS_OPTIONS = ("prefix", "queue_options", "passthrough_queues", "codec", "confirm_timeout")
#: AMQP names that already belong to the binding (any prefix): used as they are.
_OJS_NAME_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_\-.]*\.)?ojs\.")
_QUEUE_ARGUMENT_OPTIONS = {
    "x-max-priority": "max_priority",
    "x-max-length": "max_length",
    "x-max-length-bytes": "max_length_bytes",
    "x-overflow": "overflow",
    "x-message-ttl": "message_ttl",
    "x-queue-type": "queue_type",
}


class TaskCodec(Protocol):
    """Turns a framework's task messages into OJS jobs and back (see :mod:`ojs_celery.protocol`)."""

    def is_task(self, properties: dict[str, Any], headers: dict[str, Any]) -> bool:
        """Whether a message being published is a task message this codec converts."""

    def to_job(
        self, body: bytes, properties: dict[str, Any], headers: dict[str, Any], queue: str
    ) -> tuple[Job, OutgoingMessage]:
        """The OJS job of a task message bound for OJS queue ``queue``, and its encoded message."""

    def from_job(
        self, job: Job, properties: dict[str, Any], headers: dict[str, Any]
    ) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
        """A delivered job as the framework's task message: ``(body, properties, headers)``."""


@dataclass
class QueueMap:
    """What the transport learnt about the framework's queues, shared by every connection of a prefix.

    ``queues`` maps a framework queue name to its OJS queue name, ``options`` an
    OJS queue to the arguments it was declared with, ``bindings`` an
    ``(exchange, routing_key)`` pair to the framework queue bound with it.
    """

    queues: dict[str, str] = field(default_factory=dict)
    options: dict[str, QueueOptions] = field(default_factory=dict)
    bindings: dict[tuple[str, str], str] = field(default_factory=dict)


_QUEUE_MAPS: dict[str, QueueMap] = {}
_QUEUE_MAPS_LOCK = threading.Lock()


def queue_map(prefix: str) -> QueueMap:
    """The process-wide :class:`QueueMap` of ``prefix``."""
    with _QUEUE_MAPS_LOCK:
        return _QUEUE_MAPS.setdefault(prefix, QueueMap())


@dataclass
class Settings:
    """The OJS transport options of one kombu connection."""

    names: Names
    queue_options: QueueOptions
    passthrough_queues: frozenset[str]
    codec: Any
    confirm_timeout: float

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Settings:
        """Read (and validate) the OJS options of a transport options dict."""
        queue_options = options.get("queue_options") or QueueOptions()
        if isinstance(queue_options, dict):
            queue_options = QueueOptions(**queue_options)
        codec = options.get("codec") or DEFAULT_CODEC
        return cls(
            names=Names(options.get("prefix") or ""),
            queue_options=queue_options,
            passthrough_queues=frozenset(options.get("passthrough_queues") or ()),
            codec=codec,
            confirm_timeout=float(options.get("confirm_timeout") or DEFAULT_CONFIRM_TIMEOUT),
        )

    def load_codec(self) -> TaskCodec:
        """The codec object (imported on first use: ``ojs_celery`` needs Celery only then)."""
        if isinstance(self.codec, str):
            self.codec = symbol_by_name(self.codec)()
        elif isinstance(self.codec, type):
            self.codec = self.codec()
        return self.codec


@dataclass
class _Unsettled:
    """A converted job delivery that has not been acked or rejected yet."""

    raw: amqp.Message
    job: Job
    queue: str


class Channel(pyamqp.Channel):
    """A py-amqp channel speaking the OJS binding for job queues (see the module docs)."""

    def __init__(self, connection, *args, **kwargs):
        super().__init__(connection, *args, **kwargs)
        # py-amqp swaps in its one-at-a-time confirm wrapper per instance; our
        # basic_publish decides per message instead.
        self.__dict__.pop("basic_publish", None)
        self._consumer_queues: dict[str, str] = {}  # consumer tag -> framework queue name
        self._unsettled: dict[int, _Unsettled] = {}

    # -- helpers -------------------------------------------------------------------------------

    @property
    def ojs(self) -> _ConnectionState:
        """The OJS state of the connection this channel belongs to."""
        return self.connection.ojs

    def _job_queue(self, name: str) -> str | None:
        """The OJS queue a framework queue name stands for, or None if it is not a job queue."""
        return self.ojs.queues.queues.get(name)

    # -- declarations --------------------------------------------------------------------------

    def queue_declare(
        self,
        queue="",
        passive=False,
        durable=False,
        exclusive=False,
        auto_delete=True,
        nowait=False,
        arguments=None,
        argsig="BsbbbbbF",
    ):
        """Declare ``ojs.queue.{q}`` (with DLQ and bindings) for a job queue; other queues as usual."""
        state = self.ojs
        ojs_queue = self._job_queue(queue)
        if (
            ojs_queue is None
            and not passive
            and durable
            and not exclusive
            and not auto_delete
            and queue
            and not _OJS_NAME_RE.match(queue)
            and queue not in state.settings.passthrough_queues
        ):
            ojs_queue = state.register_queue(queue, arguments)
        if ojs_queue is None:
            return super().queue_declare(queue, passive, durable, exclusive, auto_delete, nowait, arguments, argsig)
        if not passive:
            state.ensure_queue(ojs_queue)
        if nowait:
            return None
        return super().queue_declare(state.names.job_queue(ojs_queue), passive=True)

    def queue_bind(self, queue, exchange="", routing_key="", nowait=False, arguments=None, argsig="BsssbF"):
        """Remember a job queue's binding (for routing) instead of creating it."""
        ojs_queue = self._job_queue(queue)
        if ojs_queue is None or exchange == self.ojs.names.direct_exchange:
            return super().queue_bind(
                queue if ojs_queue is None else self.ojs.names.job_queue(ojs_queue),
                exchange,
                routing_key,
                nowait,
                arguments,
                argsig,
            )
        self.ojs.queues.bindings[(exchange, routing_key)] = queue
        return None

    def queue_unbind(self, queue, exchange, routing_key="", nowait=False, arguments=None, argsig="BsssF"):
        """Forget a job queue's binding; other queues as usual."""
        if self._job_queue(queue) is not None:
            self.ojs.queues.bindings.pop((exchange, routing_key), None)
            return None
        return super().queue_unbind(queue, exchange, routing_key, nowait, arguments, argsig)

    def queue_purge(self, queue="", nowait=False, argsig="Bsb"):
        """Purge ``ojs.queue.{q}`` for a job queue."""
        return super().queue_purge(self._amqp_name(queue), nowait, argsig)

    def queue_delete(self, queue="", if_unused=False, if_empty=False, nowait=False, argsig="Bsbbb"):
        """Delete ``ojs.queue.{q}`` for a job queue (its DLQ and retry queues stay)."""
        return super().queue_delete(self._amqp_name(queue), if_unused, if_empty, nowait, argsig)

    def _amqp_name(self, queue: str) -> str:
        ojs_queue = self._job_queue(queue)
        return queue if ojs_queue is None else self.ojs.names.job_queue(ojs_queue)

    # -- publishing ----------------------------------------------------------------------------

    def basic_publish(
        self,
        msg,
        exchange="",
        routing_key="",
        mandatory=False,
        immediate=False,
        timeout=None,
        confirm_timeout=None,
        argsig="Bssbb",
    ):
        """Publish ``msg``: task messages and messages for job queues the OJS way, the rest untouched."""
        state = self.ojs
        target = state.route(exchange, routing_key)
        headers = msg.properties.get("application_headers") or {}
        if target is not None and state.codec.is_task(msg.properties, headers):
            return state.publish_task(msg, target, confirm_timeout or timeout)
        if target is not None and exchange not in state.ojs_exchanges:
            exchange, routing_key = state.names.direct_exchange, target
            state.ensure_queue(target)
        confirm = self.connection.confirm_publish
        if confirm and not self._confirm_selected:
            self._confirm_selected = True
            self.confirm_select()
        result = amqp.Channel._basic_publish(
            self, msg, exchange, routing_key, mandatory, immediate, timeout, argsig=argsig
        )
        if confirm:
            self._wait_for_confirm(confirm_timeout or timeout)
        return result

    #: py-amqp's confirm wrapper calls ``_basic_publish``: every publish takes the OJS path.
    _basic_publish = basic_publish

    def basic_publish_confirm(self, *args, **kwargs):
        """Same as :meth:`basic_publish` (which confirms pass-through traffic when ``confirm_publish``)."""
        return self.basic_publish(*args, **kwargs)

    def _wait_for_confirm(self, timeout: float | None) -> None:
        """py-amqp's confirm mode for pass-through traffic: one publish at a time, Nack raises."""

        def on_confirm(method, *args):
            if method == spec.Basic.Nack:
                raise MessageNacked()

        self.wait([spec.Basic.Ack, spec.Basic.Nack], callback=on_confirm, timeout=timeout)

    # -- consuming -----------------------------------------------------------------------------

    def basic_qos(self, prefetch_size, prefetch_count, a_global, argsig="lBb"):
        """Always per-consumer prefetch (``global=False``): the binding's FETCH, and what quorum queues need."""
        return super().basic_qos(prefetch_size, prefetch_count, False, argsig)

    def basic_consume(
        self,
        queue="",
        consumer_tag="",
        no_local=False,
        no_ack=False,
        exclusive=False,
        nowait=False,
        callback=None,
        arguments=None,
        on_cancel=None,
        argsig="BssbbbbF",
    ):
        """Consume ``ojs.queue.{q}`` for a job queue; its deliveries are converted by :meth:`_deliver`."""
        ojs_queue = self._job_queue(queue)
        if ojs_queue is None:
            return super().basic_consume(
                queue, consumer_tag, no_local, no_ack, exclusive, nowait, callback, arguments, on_cancel, argsig
            )
        amqp_name = self.ojs.names.job_queue(ojs_queue)
        tag = super().basic_consume(
            amqp_name,
            consumer_tag,
            no_local,
            no_ack,
            exclusive,
            nowait,
            callback=lambda raw, q=queue, cb=callback: self._deliver(raw, q, cb),
            arguments=arguments,
            on_cancel=on_cancel or (lambda tag, q=amqp_name: self._on_broker_cancel(q, tag)),
            argsig=argsig,
        )
        self._consumer_queues[tag] = queue
        return tag

    def basic_get(self, queue="", no_ack=False, argsig="Bsb"):
        """``Basic.Get`` from ``ojs.queue.{q}`` for a job queue, converted like a delivery."""
        ojs_queue = self._job_queue(queue)
        if ojs_queue is None:
            return super().basic_get(queue, no_ack, argsig)
        raw = super().basic_get(self.ojs.names.job_queue(ojs_queue), no_ack, argsig)
        if raw is None or not _is_envelope(raw):
            return raw
        try:
            job = decode(raw.body, raw.properties, raw.properties.get("application_headers") or {})
        except DecodeError:
            return raw
        message = self._converted(raw, job, queue)
        if not no_ack:
            self._unsettled[raw.delivery_tag] = _Unsettled(raw, job, ojs_queue)
        return message

    def _on_broker_cancel(self, amqp_queue: str, consumer_tag: str) -> None:
        METRICS.consumer_cancellations.labels(amqp_queue).inc()
        logger.warning(
            "the broker cancelled the consumer of %s (Basic.Cancel); the consumer restarts and re-consumes", amqp_queue
        )
        self._consumer_queues.pop(consumer_tag, None)
        raise ConsumerCancelled(consumer_tag, spec.Basic.Cancel)

    def _deliver(self, raw: amqp.Message, queue: str, callback: Callable[[Any], Any]) -> Any:
        """Convert a delivery from job queue ``queue`` and pass it on, or settle it here."""
        if not _is_envelope(raw):
            return callback(raw)  # not OJS (a plain kombu message, a stock Celery producer): untouched
        state = self.ojs
        ojs_queue = state.queues.queues[queue]
        headers = raw.properties.get("application_headers") or {}
        try:
            job = decode(raw.body, raw.properties, headers)
        except DecodeError as exc:
            return self._dead_letter_invalid(raw, ojs_queue, exc.code, str(exc))
        attempt = job.attempt + 1
        if raw.delivery_info.get("redelivered"):
            from ojs_kombu.runtime.settle import worker_lost

            logger.warning("job %s was redelivered: counting attempt %d as failed (worker_lost)", job.id, attempt)
            return self._fail(raw, job, ojs_queue, worker_lost(attempt), decide(job, attempt, error_type="worker_lost"))
        scheduled = job.scheduled_datetime
        if scheduled is not None:
            early_ms = delay_ms_until(scheduled, utcnow())
            if early_ms > EARLY_TOLERANCE_MS:
                return self._delay(raw, job, ojs_queue, early_ms)
        try:
            message = self._converted(raw, job, queue)
        except (ValidationError, ValueError, TypeError) as exc:
            return self._dead_letter_invalid(raw, ojs_queue, "invalid_envelope", str(exc))
        self._unsettled[raw.delivery_tag] = _Unsettled(raw, job, ojs_queue)
        return callback(message)

    def _converted(self, raw: amqp.Message, job: Job, queue: str) -> amqp.Message:
        headers = raw.properties.get("application_headers") or {}
        body, properties, task_headers = self.ojs.codec.from_job(job, raw.properties, headers)
        message = amqp.Message(body, application_headers=task_headers, **properties)
        message.channel = self
        message.delivery_info = {
            **raw.delivery_info,
            # The framework republishes retries to where the delivery came from:
            # the anonymous exchange with its own queue name routes back here.
            "exchange": "",
            "routing_key": queue,
            # Not the first execution: the broker redelivered it, or it is a retry.
            "redelivered": bool(raw.delivery_info.get("redelivered")) or job.attempt > 0,
        }
        return message

    # -- settling ------------------------------------------------------------------------------

    def basic_ack(self, delivery_tag, multiple=False, argsig="Lb"):
        """``Basic.Ack``; forgets the delivery."""
        self._forget(delivery_tag, multiple)
        return super().basic_ack(delivery_tag, multiple, argsig)

    def basic_reject(self, delivery_tag, requeue, argsig="Lb"):
        """``Basic.Nack(requeue=False)`` (dead-lettered); a job is never requeued (see the module docs)."""
        unsettled = self._unsettled.pop(delivery_tag, None)
        if requeue and unsettled is not None:
            job, attempt = unsettled.job, unsettled.job.attempt + 1
            failure = Failure("requeued", "Requeued", f"attempt {attempt} was rejected with requeue=True")
            return self._fail(unsettled.raw, job, unsettled.queue, failure, decide(job, attempt, error_type="requeued"))
        if requeue:
            return super().basic_reject(delivery_tag, requeue, argsig)
        return self.basic_nack(delivery_tag)

    def basic_nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = False) -> None:
        """Send a real ``Basic.Nack`` (py-amqp has none); ``requeue=False`` dead-letters the message."""
        self._forget(delivery_tag, multiple)
        self.send_method(spec.Basic.Nack, "Lbb", (delivery_tag, multiple, requeue))

    def _forget(self, delivery_tag: int, multiple: bool) -> None:
        if multiple:
            for tag in [t for t in self._unsettled if t <= delivery_tag]:
                del self._unsettled[tag]
        else:
            self._unsettled.pop(delivery_tag, None)

    def _fail(self, raw: amqp.Message, job: Job, queue: str, failure: Failure, decision: Decision) -> None:
        """Carry out a :class:`~ojs_kombu.policy.retry.Decision` for a job settled by the transport itself."""
        tag = raw.delivery_tag
        if decision.outcome is Outcome.RETRY:
            from ojs_kombu.runtime.settle import failed_message

            delay_ms = decision.delay_ms or 1
            message = failed_message(_outgoing(raw), record_failure(job, job.attempt + 1, failure), failure)
            names = self.ojs.names
            self.ojs.ensure_retry_queue(queue, delay_ms)
            self._republish_then_ack(
                tag, message, names.retry_exchange, names.retry_routing_key(queue, delay_ms), queue
            )
        elif decision.outcome is Outcome.DISCARD:
            logger.info("job %s discarded: %s", job.id, decision.reason)
            self.basic_ack(tag)
        else:
            logger.info("job %s dead-lettered: %s", job.id, decision.reason)
            self.basic_nack(tag)

    def _delay(self, raw: amqp.Message, job: Job, queue: str, delay_ms: int) -> None:
        """A job that arrived before its ``scheduled_at``: back into the cascade, unchanged, then ack."""
        try:
            message, exchange, key = self.ojs.cascade.route(_outgoing(raw), delay_ms, queue)
        except ValidationError as exc:
            return self._dead_letter_invalid(raw, queue, "invalid_schedule", str(exc))
        self.ojs.ensure_scheduling(queue)
        logger.debug("job %s arrived %d ms early; delaying it again", job.id, delay_ms)
        self._republish_then_ack(raw.delivery_tag, message, exchange, key, queue)
        return None

    def _dead_letter_invalid(self, raw: amqp.Message, queue: str, code: str, text: str) -> None:
        from ojs_kombu.wire.headers import error_headers

        logger.warning(
            "message %s on %s sent to the dead letter queue: %s (%s)",
            raw.properties.get("message_id"),
            queue,
            text,
            code,
        )
        self._republish_then_ack(
            raw.delivery_tag,
            _outgoing(raw, error_headers(code, text)),
            self.ojs.names.dead_letter_exchange,
            queue,
            queue,
        )

    def _republish_then_ack(self, tag: int, message: OutgoingMessage, exchange: str, key: str, queue: str) -> None:
        """Publish (confirmed), then ack ``tag``; Nack it into the DLQ if the broker refuses the publish.

        The confirm is read whenever the connection is next drained (the
        consumer's loop), so a delivery callback never blocks on it.
        """

        def settle(ticket: PublishTicket) -> None:
            if not self.is_open:
                return  # the channel is gone: the broker redelivers the original
            if ticket.error is None:
                self.basic_ack(tag)
            else:
                logger.error(
                    "republishing job %s failed (%s); sending it to its dead letter queue", ticket.job_id, ticket.error
                )
                self.basic_nack(tag)

        self.ojs.publisher.publish(
            message,
            exchange=exchange,
            routing_key=key,
            queue=queue,
            job_id=message.properties.get("message_id"),
            on_done=settle,
        )

    def collect(self):
        """Tear down this channel (py-amqp), dropping the per-delivery state."""
        self._unsettled.clear()
        self._consumer_queues.clear()
        super().collect()


def _is_envelope(raw: amqp.Message) -> bool:
    """An OJS envelope: the OJS content type, or JSON carrying the binding's headers (lenient producers)."""
    content_type = (raw.properties.get("content_type") or "").split(";")[0].strip().lower()
    if content_type == CONTENT_TYPE:
        return True
    headers = raw.properties.get("application_headers") or {}
    return content_type in ACCEPTED_CONTENT_TYPES and Header.QUEUE in headers and "task" not in headers


def _outgoing(raw: amqp.Message, headers: dict[str, Any] | None = None) -> OutgoingMessage:
    """A delivered message for a republish: same body and properties, ``x-death*`` stripped."""
    from ojs_kombu.wire.headers import strip_death_headers

    properties = {k: v for k, v in raw.properties.items() if k != "application_headers"}
    table = strip_death_headers(dict(raw.properties.get("application_headers") or {}))
    if headers:
        table.update(headers)
    body = raw.body if isinstance(raw.body, bytes) else str(raw.body).encode("utf-8")
    return OutgoingMessage(body, properties, table)


class _ConnectionState:
    """What one AMQP connection knows about the OJS deployment: names, topology, publisher."""

    def __init__(self, connection: Connection, settings: Settings):
        self.connection = connection
        self.settings = settings
        self.names = settings.names
        self.queues = queue_map(settings.names.prefix)
        # One topology per AMQP connection: a reconnect declares everything again, lazily.
        self.topology = Topology(self.names, queue_options=settings.queue_options, per_queue=self.queues.options)
        self.cascade = Cascade(self.names)
        self.ojs_exchanges = frozenset(
            {
                self.names.direct_exchange,
                self.names.retry_exchange,
                self.names.dead_letter_exchange,
                self.cascade.top_exchange,
            }
        )
        self._publisher: ConfirmedPublisher | None = None
        self._ensured: set[tuple] = set()

    @property
    def codec(self) -> TaskCodec:
        """The task message codec."""
        return self.settings.load_codec()

    @property
    def publisher(self) -> ConfirmedPublisher:
        """The confirmed publisher of this connection (its own channel), created on first use."""
        if self._publisher is None or not self._publisher.channel.is_open:
            self._publisher = ConfirmedPublisher(self.connection)
        return self._publisher

    # -- queues --------------------------------------------------------------------------------

    def register_queue(self, name: str, arguments: dict[str, Any] | None) -> str:
        """Make framework queue ``name`` a job queue; returns its OJS queue name."""
        ojs_queue = ojs_queue_for(name)
        known = {k: v for k, v in (arguments or {}).items() if k in _QUEUE_ARGUMENT_OPTIONS}
        if known:
            fields = {
                **_fields_of(self.settings.queue_options),
                **{_QUEUE_ARGUMENT_OPTIONS[k]: v for k, v in known.items()},
            }
            self.queues.options[ojs_queue] = QueueOptions(**fields)
        ignored = sorted(set(arguments or {}) - set(known))
        if ignored:
            logger.debug("queue %s: arguments %s are the binding's own or unsupported; not used", name, ignored)
        self.queues.queues[name] = ojs_queue
        return ojs_queue

    def route(self, exchange: str, routing_key: str) -> str | None:
        """The OJS queue a publish to ``exchange``/``routing_key`` is meant for, or None."""
        if exchange == self.names.direct_exchange:
            return routing_key if QUEUE_NAME_RE.fullmatch(routing_key) else None
        if exchange in self.ojs_exchanges:
            return None  # already on the OJS path (the transport's own republishes)
        name = routing_key if exchange == "" else self.queues.bindings.get((exchange, routing_key))
        if name is None:
            return None
        ojs_queue = self.queues.queues.get(name)
        if ojs_queue is None and exchange == "" and name.startswith(self.names.job_queue("")):
            ojs_queue = self.names.queue_from_job_queue(name)
        return ojs_queue

    def ensure_queue(self, queue: str) -> None:
        """Lazily declare job queue ``queue`` with its DLQ and bindings."""
        options = self.queues.options.get(queue)  # learnt on any connection of this prefix
        if options is not None and self.topology.per_queue.get(queue) != options:
            self.topology.per_queue[queue] = options
            self._ensured.discard(("queue", queue))
        self._once(("queue", queue), lambda: self.topology.ensure_queue(self.connection, queue))

    def ensure_scheduling(self, queue: str) -> None:
        """Lazily declare the scheduling cascade and its binding to ``queue``."""
        self._once(("schedule", queue), lambda: self.topology.ensure_scheduling(self.connection, queue, self.cascade))

    def ensure_retry_queue(self, queue: str, delay_ms: int) -> None:
        """Lazily declare ``ojs.queue.retry.{queue}.{delay_ms}``."""
        self._once(
            ("retry", queue, delay_ms), lambda: self.topology.ensure_retry_queue(self.connection, queue, delay_ms)
        )

    def _once(self, key: tuple, declare: Callable[[], None]) -> None:
        # The topology caches too, but checks every spec of the cascade: this is the per-publish fast path.
        if key not in self._ensured:
            declare()
            self._ensured.add(key)

    # -- publishing tasks ----------------------------------------------------------------------

    def publish_task(self, msg: amqp.Message, queue: str, confirm_timeout: float | None) -> None:
        """Publish a task message as an OJS job (confirmed, mandatory) and wait for the confirm."""
        body = msg.body if isinstance(msg.body, bytes) else str(msg.body).encode("utf-8")
        properties = {k: v for k, v in msg.properties.items() if k != "application_headers"}
        headers = dict(msg.properties.get("application_headers") or {})
        job, message = self.codec.to_job(body, properties, headers, queue)
        message, exchange, key = self._destination(message, job, queue)
        ticket = self.publisher.publish(message, exchange=exchange, routing_key=key, queue=queue, job_id=job.id)
        self.publisher.wait([ticket], confirm_timeout or self.settings.confirm_timeout)
        ticket.raise_for_error()

    def _destination(self, message: OutgoingMessage, job: Job, queue: str) -> tuple[OutgoingMessage, str, str]:
        """Where a job goes: its retry queue (a retry), the cascade (a future ETA) or its queue."""
        scheduled = job.scheduled_datetime
        delay_ms = delay_ms_until(scheduled) if scheduled is not None else 0
        if job.attempt > 0:
            delay_ms = ladder_ms(delay_ms)
            self.ensure_queue(queue)
            self.ensure_retry_queue(queue, delay_ms)
            return message, self.names.retry_exchange, self.names.retry_routing_key(queue, delay_ms)
        self.ensure_queue(queue)
        if delay_ms > 0:
            scheduled = self.cascade.route(message, delay_ms, queue)
            self.ensure_scheduling(queue)
            return scheduled
        return message, self.names.direct_exchange, queue


def _fields_of(options: QueueOptions) -> dict[str, Any]:
    return {
        name: getattr(options, name) for name in _QUEUE_ARGUMENT_OPTIONS.values() if getattr(options, name) is not None
    }


class Connection(pyamqp.Connection):
    """A py-amqp connection carrying the OJS state of its channels."""

    Channel = Channel

    def __init__(self, *args, ojs_settings: Settings, **kwargs):
        super().__init__(*args, **kwargs)
        self.ojs = _ConnectionState(self, ojs_settings)
        #: Buffered frame reading (plain TCP), attached by the transport once connected.
        self.frame_reader: FrameReader | None = None


class Transport(pyamqp.Transport):
    """``ojs://``: AMQP 0-9-1 over py-amqp speaking the OJS binding (see the module docs)."""

    Connection = Connection
    driver_name = "ojs"

    def __init__(self, client, **kwargs):
        if not client.heartbeat:
            client.heartbeat = DEFAULT_HEARTBEAT
        super().__init__(client, **kwargs)
        self.settings = Settings.from_options(client.transport_options or {})

    def establish_connection(self):
        """Connect, like py-amqp's transport, with the OJS settings attached to the connection."""
        conninfo = self.client
        for name, default_value in self.default_connection_params.items():
            if not getattr(conninfo, name, None):
                setattr(conninfo, name, default_value)
        if conninfo.hostname == "localhost":
            conninfo.hostname = "127.0.0.1"
        if isinstance(conninfo.ssl, dict) and conninfo.ssl.get("server_hostname", "") is None:
            conninfo.ssl["server_hostname"] = conninfo.hostname
        password = conninfo.password() if callable(conninfo.password) else conninfo.password
        opts = dict(
            {
                "host": conninfo.host,
                "userid": conninfo.userid,
                "password": password,
                "login_method": conninfo.login_method,
                "virtual_host": conninfo.virtual_host,
                "insist": conninfo.insist,
                "ssl": conninfo.ssl,
                "connect_timeout": conninfo.connect_timeout,
                "heartbeat": conninfo.heartbeat,
            },
            **{k: v for k, v in (conninfo.transport_options or {}).items() if k not in _OJS_OPTIONS},
        )
        conn = self.Connection(ojs_settings=self.settings, **opts)
        conn.client = self.client
        conn.connect()
        if framing_supports(conn):
            conn.frame_reader = FrameReader(conn)
        return conn

    def on_readable(self, connection, loop):
        """The event loop's read callback (Celery's worker): every complete frame the socket
        holds, from one ``recv`` (framing.py), instead of kombu's one ``drain_events(timeout=0)``
        per frame; about half the CPU per delivery."""
        reader = getattr(connection, "frame_reader", None)
        if reader is None:
            return super().on_readable(connection, loop)
        if not connection.connected:
            raise RecoverableConnectionError("Socket was disconnected")
        if not reader.has_frame():
            reader.fill()
        reader.dispatch()
        if reader.has_frame():  # a callback read ahead (e.g. a synchronous reply): not signalled by the socket
            loop.call_soon(self.on_readable, connection, loop)
        return None

    def qos_semantics_matches_spec(self, connection):
        """Per-consumer prefetch: Celery then sends ``global=False`` itself."""
        return True


class SSLTransport(Transport):
    """``ojss://``: the same over TLS (port 5671 by default)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.client.ssl:  # TLS on unless the caller passed its own ssl options
            self.client.ssl = True


def register_aliases() -> None:
    """Register ``ojs`` and ``ojss`` in kombu's transport alias table (idempotent)."""
    TRANSPORT_ALIASES.setdefault("ojs", "ojs_kombu.transport:Transport")
    TRANSPORT_ALIASES.setdefault("ojss", "ojs_kombu.transport:SSLTransport")


__all__ = [
    "Channel",
    "Connection",
    "QueueMap",
    "SSLTransport",
    "Settings",
    "TaskCodec",
    "Transport",
    "queue_map",
    "register_aliases",
]
