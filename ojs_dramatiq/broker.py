"""``OjsBroker``: a Dramatiq broker that speaks the OJS AMQP binding, on ``ojs_kombu``.

::

    import dramatiq
    from ojs_dramatiq import OjsBroker

    dramatiq.set_broker(OjsBroker("amqp://guest:guest@localhost:5672/%2F"))

    @dramatiq.actor(max_retries=3)
    def send_email(address, *, template="welcome"):
        ...

What changes against ``RabbitmqBroker`` (the actors do not):

* the topology is the binding's: ``ojs.queue.{q}`` on ``ojs.exchange.direct``
  with its dead letter queue ``ojs.queue.dlx.{q}``; no ``.DQ`` / ``.XQ`` queues;
* every message is an OJS job envelope (see :mod:`ojs_dramatiq.encoder`),
  published with confirms and ``mandatory`` (both always on);
* ``delay=`` goes through the scheduling cascade: workers never hold delayed
  messages, nothing waits unacked, nothing runs early;
* a retry decided by the stock ``Retries`` middleware is published to
  ``ojs.queue.retry.{q}.{ms}`` (attempt+1, error headers), confirmed, then the
  original is acked; a failed message is ``Basic.Nack(requeue=False)``-ed into
  ``ojs.queue.dlx.{q}``;
* a message redelivered because its worker died counts as a failed attempt;
* :meth:`OjsBroker.cancel` (or ``ojs_kombu.Client.cancel`` from any OJS producer) cancels a
  message wherever it is: every consumer replays the control stream ``ojs.queue.control.{q}``
  before it consumes, so a queued, delayed or retrying message is acked and dropped when it is
  delivered, also on a worker started after the cancel; a running one is interrupted (see
  :mod:`ojs_dramatiq.running`); :meth:`OjsBroker.pause` / :meth:`OjsBroker.resume` stop and
  restart the consumers of a queue in every worker.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import dramatiq
from amqp.channel import Channel
from amqp.exceptions import NotFound
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.errors import QueueJoinTimeout
from dramatiq.message import Message
from dramatiq.middleware import Middleware, Retries
from kombu.connection import Connection

from ojs_kombu.amqp.connection import DEFAULT_HEARTBEAT, close_quietly
from ojs_kombu.amqp.failover import ConnectionSettings
from ojs_kombu.amqp.permits import Permits
from ojs_kombu.amqp.reconnect import Budgeted, Reconnector
from ojs_kombu.amqp.urls import BrokerUrls
from ojs_kombu.client import Client
from ojs_kombu.errors import UnroutableError
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import job_type_for
from ojs_kombu.model.policies import RetryPolicy
from ojs_kombu.policy.retry import ladder_ms
from ojs_kombu.runtime.assembly import Assembly
from ojs_kombu.runtime.control import CancelRunning
from ojs_kombu.runtime.presence import DEFAULT_PRESENCE_INTERVAL, Beacon
from ojs_kombu.runtime.workflow import DEFAULT_SWEEP_AFTER
from ojs_kombu.wire.completed import CompletedOptions

from .consumer import OjsConsumer, OjsMessageProxy
from .encoder import job_to_message, message_to_job, ojs_queue_for, retry_policy_for
from .errors import dramatiq_error, dramatiq_errors
from .groups import OjsGroupCallbacks
from .parameters import split_options
from .presence import OjsPresence
from .running import OjsRunning

logger = logging.getLogger(__name__)

T = TypeVar("T")


class _Releasable(Protocol):
    def release(self) -> None: ...


class OjsBroker(dramatiq.Broker):
    """A Dramatiq broker on RabbitMQ that speaks the OJS AMQP 0-9-1 binding.

    Parameters:
      url: the broker URL, as given to ``RabbitmqBroker`` (``amqp://u:p@host:5672/%2F``)
        or to kombu (``amqp://u:p@host//``); ``;``-separated URLs or a list fail over.
        Default ``$OJS_AMQP_URL``, else ``amqp://guest:guest@localhost:5672//``.
      prefix: multi-tenant prefix of every entity name (``tenant1.ojs.queue.default``).
      middleware: the middleware, as for any Dramatiq broker (default: Dramatiq's defaults).
      max_priority: declare job queues with ``x-max-priority`` (1..255) so that the
        ``broker_priority`` option orders messages (OJS priority, clamped to 0..9).
      confirm_delivery: accepted for compatibility with ``RabbitmqBroker``; publisher
        confirms are always on.
      dead_letter_mode: how a failed message reaches ``ojs.queue.dlx.{q}``: ``"nack"``
        (``Basic.Nack(requeue=False)``, the binding's FAIL; RabbitMQ adds ``x-death``; the final
        error is recorded in the control stream first, for the dead letter readers) or
        ``"republish"`` (published there with the final error in the envelope and the
        ``x-ojs-error-*`` headers, confirmed, then acked).
      parameters: ``RabbitmqBroker``'s other form instead of ``url``: a list of dicts of pika
        connection parameters (or ``pika.ConnectionParameters`` objects), a failover list.
      cancel_running: what cancelling a running message does besides setting its
        :func:`~ojs_dramatiq.current_cancelled` event: ``"interrupt"`` raises
        :class:`ojs_kombu.Cancelled` in the actor's thread (as ``TimeLimit`` does);
        ``"cooperative"`` leaves it to the actor.
      events: also publish the job lifecycle events to the events stream (``Client.events``);
        the worker presence (``Client.workers``) is always published, every ``presence_interval`` s.
      presence_interval: seconds between two presences of a booted worker.
      deduplicate: execution de-duplication, as ``Worker(deduplicate=True)`` (``docs/reliability.md``):
        each consumer records the id of every message whose actor succeeded in
        ``ojs.stream.completed.{q}`` (confirmed, then the ack) and acks without running a
        delivery whose job completed already.
      completed_options: bounds of what ``deduplicate`` remembers (:class:`ojs_kombu.CompletedOptions`).
      unique_backend: where the ``ojs_unique`` jobs' locks are: None (RabbitMQ queues) or a Redis
        URL (``ojs_kombu.Client(unique_backend=...)``): the same for every broker of a deployment.
      **options: ``RabbitmqBroker``'s pika keyword arguments ``host``, ``port``,
        ``virtual_host``, ``credentials`` (``pika.PlainCredentials``) and ``heartbeat``, instead
        of ``url`` (translated into an AMQP URL by :func:`ojs_dramatiq.parameters.url_for_parameters`;
        the pika parameters without a py-amqp equivalent, such as ``ssl_options``, are refused
        with a ``TypeError`` naming what to use instead); the kombu connection options
        ``heartbeat``, ``ssl``, ``transport_options``; the :class:`ojs_kombu.Client` options
        ``queue_options``, ``queue_type`` (``"quorum"``: quorum queues end to end, ``docs/cluster.md``), ``pool_size``, ``confirm_timeout``, ``connect_retries``, ``app_id``,
        ``on_conflict``, ``window``, ``connection_name``, ``control`` (retention of the control
        streams, a :class:`ojs_kombu.wire.control.ControlOptions`) and ``declare`` (``False``: never
        declare job queues when publishing, for producers without the configure permission).

    Attributes:
      cancellations: the cancels every consumer of this broker knows (replayed from the control
        streams), and the messages its worker threads run.
      paused: the OJS queues paused by :meth:`pause`, as the consumers read them.
      lifecycle: the job events of this broker's workers (``started`` ... ``cancelled``); subscribe
        to it with ``broker.lifecycle.subscribe(callback)``.
      activity: what this process's workers run and ran lately: the answers to
        ``ojs_kombu.Client.info`` (INFO) and the jobs their presence lists.

    Raises:
      TypeError: for an unknown keyword argument, a pika parameter that cannot be honoured, or
        ``url`` together with ``parameters`` / pika keyword arguments.
      ValueError: for a bad ``max_priority``, ``dead_letter_mode``, ``cancel_running`` or
        connection parameter.

    Errors of :meth:`enqueue` (and ``send()``): Dramatiq's, so that code written for
    ``RabbitmqBroker`` that catches :class:`dramatiq.errors.BrokerError` keeps working; the
    ``ojs_kombu`` error is the ``__cause__`` (:mod:`ojs_dramatiq.errors`):

    ==============================  ======================  ==========================================
    ``ojs_kombu`` error             Dramatiq error          why
    ==============================  ======================  ==========================================
    ``BrokerConnectionError``       ``ConnectionClosed``    what ``RabbitmqBroker.enqueue`` raises when
                                                            the broker cannot be reached
    ``PublishTimeoutError``         ``ConnectionClosed``    the broker stopped answering (as pika's
                                                            blocked-connection timeout); the job may
                                                            have been queued all the same
    ``UnroutableError``             ``QueueNotFound``       no queue is bound for the message, even
                                                            after declaring it again
    ``PublishNackedError``          ``BrokerError``         the broker refused the message (a full
                                                            ``reject-publish`` queue ...)
    any other ``OjsError``          ``BrokerError``         a ``TopologyError``, a channel the broker
                                                            closed, a closed broker ...
    ``ValidationError``             raised as is            a bad argument: a ``ValueError``, as
                                                            Dramatiq's JSON encoder raises a
                                                            ``TypeError``; no retry would succeed
    ==============================  ======================  ==========================================
    """

    def __init__(
        self,
        url: BrokerUrls | None = None,
        *,
        prefix: str = "",
        middleware: list[Middleware] | None = None,
        max_priority: int | None = None,
        confirm_delivery: bool = True,
        dead_letter_mode: str = "nack",
        parameters: Sequence[Any] | None = None,
        cancel_running: CancelRunning = "interrupt",
        events: bool = False,
        presence_interval: float = DEFAULT_PRESENCE_INTERVAL,
        deduplicate: bool = False,
        completed_options: CompletedOptions | None = None,
        unique_backend: str | None = None,
        workflow_retention: float | None = DEFAULT_SWEEP_AFTER,
        **options: Any,
    ):
        self._running: OjsRunning | None = None
        super().__init__(middleware=middleware)
        self.actor_options.add("ojs_unique")  # @dramatiq.actor(ojs_unique={...}): the jobs' unique policy
        if max_priority is not None and not 0 < max_priority <= 255:
            raise ValueError("max_priority must be a value between 0 and 255")
        self.dead_letter_mode = dead_letter_mode
        url, kombu_options, client_options = split_options(url, parameters, options, max_priority)
        self.max_priority = max_priority
        self.heartbeat: float = kombu_options.get("heartbeat", DEFAULT_HEARTBEAT)
        self.ssl = kombu_options.get("ssl")
        self.transport_options = kombu_options.get("transport_options")
        self.client = Client(
            url,
            prefix=prefix,
            heartbeat=self.heartbeat,
            ssl=self.ssl,
            transport_options=self.transport_options,
            unique_backend=unique_backend,
            **client_options,
        )
        self.names = self.client.names
        self.topology = self.client.topology
        self.cascade = self.client.cascade
        #: The parts of this broker's consumers (as an ``ojs_kombu.Worker``'s): control readers,
        #: settlers, presence, and what they share.
        connection = ConnectionSettings(self.client.url, self.heartbeat, self.ssl, self.transport_options)
        self.assembly = Assembly(
            connection,
            self.names,
            self.topology,
            self.cascade,
            dead_letter_mode=dead_letter_mode,
            cancel_running=cancel_running,
            presence_interval=presence_interval,
            deduplicate=deduplicate,
            completed_options=completed_options,
            unique_backend=unique_backend,
            workflow_retention=workflow_retention,
        )
        self.cancellations, self.paused = self.assembly.cancellations, self.assembly.paused
        self.lifecycle, self.activity = self.assembly.lifecycle, self.assembly.activity
        self.presence_interval = self.assembly.presence_interval
        self._presence = OjsPresence(self._beacon_for)
        if events:
            self.lifecycle.subscribe(self._presence.offer)
        self.add_middleware(self._presence)
        self._running = OjsRunning(self.cancellations, self.lifecycle, self.activity)
        self.add_middleware(self._running)
        #: The Dramatiq queue names declared so far (canonical names only: there are no delay queues).
        self.queues: set[str] = set()
        self._ojs_queues: dict[str, str] = {}
        self._actor_names: dict[str, str] = {}
        self._consumers: dict[str, weakref.WeakSet[OjsConsumer]] = {}
        self._admin: Connection | None = None
        self._admin_lock = threading.Lock()
        self._permits: Permits | None = None
        self._admin_failover = connection.failover(
            connection_name=f"ojs_dramatiq inspection {self.client.connection_name}", heartbeat=0
        )

    @property
    def url(self) -> str:
        """The broker URL (with its password; see :func:`ojs_kombu.amqp.connection.safe_url`)."""
        return self.client.url

    def __repr__(self) -> str:
        return f"<OjsBroker {self.client!r}>"

    @property
    def permits(self) -> Permits:
        """The concurrency permits of this broker's process (a connection of its own, opened on first
        use; :class:`~ojs_dramatiq.OjsConcurrentRateLimiter` takes them)."""
        with self._admin_lock:
            if self._permits is None:
                self._permits = self.assembly.permits(f"ojs_dramatiq permits {self.client.connection_name}")
            return self._permits

    def add_middleware(
        self, middleware: Middleware, *, before: type[Middleware] | None = None, after: type[Middleware] | None = None
    ) -> None:
        """Add ``middleware`` as any Dramatiq broker does, keeping :class:`~ojs_dramatiq.OjsRunning` last.

        Last, because Dramatiq runs after-hooks in reverse order: it settles a cancelled message
        before ``Retries`` (even one added later) could retry or dead-letter it.  An
        :class:`~ojs_dramatiq.OjsGroupCallbacks` learns its broker here.
        """
        super().add_middleware(middleware, before=before, after=after)
        if isinstance(middleware, OjsGroupCallbacks):
            middleware.broker = self
        running = self._running
        if running is not None and self.middleware[-1] is not running:
            self.middleware.remove(running)
            self.middleware.append(running)

    # -- declarations ----------------------------------------------------------------------

    def declare_actor(self, actor: dramatiq.Actor[Any, Any]) -> None:
        """Declare ``actor`` and remember which OJS job type reaches it."""
        super().declare_actor(actor)
        self._actor_names[job_type_for(actor.actor_name)] = actor.actor_name

    def declare_queue(self, queue_name: str, *, ensure: bool = False) -> None:
        """Declare Dramatiq queue ``queue_name``: OJS job queue ``ojs.queue.{q}`` and its DLQ.

        The AMQP entities are declared lazily, by the first publish or consumer
        (``ensure=True``: now).  No delay queue is declared.

        Raises:
          ojs_kombu.ValidationError: (a ``ValueError``) for a name that has no valid OJS
            queue name (see :func:`~ojs_dramatiq.encoder.ojs_queue_for`).
          dramatiq.errors.BrokerError: (``ensure=True``) when the declaration failed, as
            :meth:`enqueue` raises it.
        """
        if queue_name not in self.queues:
            ojs_queue = ojs_queue_for(queue_name)
            self.emit_before("declare_queue", queue_name)
            self._ojs_queues[queue_name] = ojs_queue
            self.queues.add(queue_name)
            self.emit_after("declare_queue", queue_name)
        if ensure:
            with dramatiq_errors():
                self.client.declare_queue(self._ojs_queues[queue_name])

    def ojs_queue(self, queue_name: str) -> str:
        """The OJS queue name of Dramatiq queue ``queue_name``."""
        return self._ojs_queues.get(queue_name) or ojs_queue_for(queue_name)

    def get_declared_queues(self) -> set[str]:
        """The Dramatiq queues declared so far."""
        return self.queues.copy()

    # -- producing -------------------------------------------------------------------------

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        """Publish ``message`` as an OJS job (confirmed); ``delay`` ms ahead through the scheduler.

        The ``Retries`` middleware re-enqueues the message it is retrying with a
        delay: that becomes the OJS retry path (``ojs.queue.retry.{q}.{ms}``,
        attempt+1, error headers, confirmed), and the original delivery is acked
        once the broker has confirmed the retry.

        Parameters:
          message: the message (or a proxy of one) to publish.
          delay: milliseconds to wait before the message may run (``None``: at once).

        Returns:
          The message.

        Raises:
          dramatiq.errors.ConnectionClosed: when the broker cannot be reached, or stopped
            answering before it confirmed the publish.
          dramatiq.errors.QueueNotFound: when the message could not be routed to its queue.
          dramatiq.errors.BrokerError: when the broker did not take the job otherwise (the
            ``ojs_kombu`` error, as for every one of these, is the ``__cause__``: see the table
            in the class docstring).
          ojs_kombu.ValidationError: for arguments or options JSON cannot carry (a ``ValueError``).
        """
        if isinstance(message, OjsMessageProxy) and delay is not None:
            return self._retry(message, delay)
        if isinstance(message, MessageProxy):
            message = message._message
        self.declare_queue(message.queue_name)
        self.emit_before("enqueue", message, delay)
        job = self.job_for(message, delay_ms=delay)
        with dramatiq_errors():
            try:
                self.client.enqueue_job(job)
            except UnroutableError:
                # The queue was deleted behind our back (Dramatiq #832): declare it again, once.
                logger.warning("job %s was unroutable; declaring queue %r again", job.id, job.queue)
                self.topology.forget(job.queue)
                self.client.enqueue_job(job)
        self.emit_after("enqueue", message, delay)
        return message

    def enqueue_many(self, messages: Iterable[Message[Any]], *, delay: int | None = None) -> list[Message[Any]]:
        """Publish many messages pipelined on one channel, then wait for all confirms.

        Much faster than ``send()`` in a loop (one confirm round trip per message),
        e.g. ``broker.enqueue_many(actor.message(i) for i in range(10_000))``.
        Every message is published even if some fail; the first error is then raised,
        as :meth:`enqueue` raises it.

        Raises:
          dramatiq.errors.BrokerError: as :meth:`enqueue` (a subclass, with the
            ``ojs_kombu`` error of the first failed message as ``__cause__``).
          ojs_kombu.ValidationError: for the first message JSON cannot carry.
        """
        messages = [m._message if isinstance(m, MessageProxy) else m for m in messages]
        jobs = []
        for message in messages:
            self.declare_queue(message.queue_name)
            self.emit_before("enqueue", message, delay)
            jobs.append(self.job_for(message, delay_ms=delay))
        with dramatiq_errors():
            results = self.client.enqueue_many(jobs)
        for message, result in zip(messages, results, strict=True):
            if result.ok:
                self.emit_after("enqueue", message, delay)
        with dramatiq_errors():
            for result in results:
                result.unwrap()
        return messages

    def job_for(self, message: Message[Any], *, delay_ms: int | None = None) -> Job:
        """The OJS job ``message`` is sent as (retry policy and timeout from the actor's options)."""
        actor = self.actors.get(message.actor_name)
        actor_options = actor.options if actor is not None else {}
        return message_to_job(
            message,
            retry=self._retry_policy(message, actor_options),
            delay_ms=delay_ms,
            timeout_ms=message.options.get("time_limit", actor_options.get("time_limit")),
            unique=message.options.get("ojs_unique", actor_options.get("ojs_unique")),
        )

    def _retry_policy(self, message: Message[Any], actor_options: dict[str, Any]) -> RetryPolicy:
        retries = next((m for m in self.middleware if isinstance(m, Retries)), None)
        if retries is None:
            return retry_policy_for(0, 1, 1)

        def option(name: str, default: Any) -> Any:
            return message.options.get(name, actor_options.get(name, default))

        return retry_policy_for(
            option("max_retries", retries.max_retries),
            option("min_backoff", retries.min_backoff),
            option("max_backoff", retries.max_backoff),
        )

    def _retry(self, message: OjsMessageProxy, delay: int) -> Message[Any]:
        self.emit_before("enqueue", message, delay)
        message.origin.retry(message, ladder_ms(delay))
        self.emit_after("enqueue", message, delay)
        return message._message

    # -- control ---------------------------------------------------------------------------

    def cancel(self, message_id: str, *, queue_name: str) -> None:
        """Cancel message ``message_id`` of Dramatiq queue ``queue_name``, wherever it is.

        Publishes an OJS cancel (``type=ojs.control.cancel``, body ``{"job_id": message_id}``,
        confirmed) to the control stream of the queue's OJS queue, as
        :meth:`ojs_kombu.Client.cancel` does.  Every consumer of the queue, in every worker
        process, including those started later (within the stream's retention), then acks and
        drops the message when it is delivered: queued, delayed (``delay=``) or waiting for a
        retry, it never runs again and never reaches the dead letter queue.  A running message is
        interrupted (see :mod:`ojs_dramatiq.running`).  Cancelling a finished or unknown message
        is harmless.

        Parameters:
          message_id: the Dramatiq ``message_id`` (what ``send()`` returned), or the OJS job id.
          queue_name: the Dramatiq queue of the message.

        Raises:
          ojs_kombu.ValidationError: (a ``ValueError``) a bad queue name or message id.
          dramatiq.errors.BrokerError: the broker did not take the cancel, as :meth:`enqueue`
            raises it (``ConnectionClosed`` when it cannot be reached ...).
        """
        with dramatiq_errors():
            self.client.cancel(message_id, queue=self.ojs_queue(queue_name))

    def pause(self, queue_name: str) -> None:
        """Pause Dramatiq queue ``queue_name``: every consumer of it stops consuming (``Basic.Cancel``).

        Workers finish the messages they hold; new ones wait in the queue.  The pause outlives
        worker restarts (the control stream is replayed at start) until :meth:`resume`.

        Raises:
          ojs_kombu.ValidationError, dramatiq.errors.BrokerError: as :meth:`cancel`.
        """
        with dramatiq_errors():
            self.client.pause(self.ojs_queue(queue_name))

    def resume(self, queue_name: str) -> None:
        """Resume Dramatiq queue ``queue_name`` after :meth:`pause`: its consumers consume again.

        Raises:
          ojs_kombu.ValidationError, dramatiq.errors.BrokerError: as :meth:`cancel`.
        """
        with dramatiq_errors():
            self.client.resume(self.ojs_queue(queue_name))

    # -- consuming -------------------------------------------------------------------------

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 30000) -> Consumer:
        """A consumer of ``queue_name`` on its own connection (``Basic.Qos(prefetch)``)."""
        self.declare_queue(queue_name)
        consumer = OjsConsumer(
            self.assembly,
            queue_name,
            self.ojs_queue(queue_name),
            prefetch,
            timeout,
            lambda job: self._message_for(job, queue_name),
            lambda: self.permits,
        )
        self._consumers.setdefault(queue_name, weakref.WeakSet()).add(consumer)
        return consumer

    def _message_for(self, job: Job, queue_name: str) -> Message[Any]:
        return job_to_message(job, queue_name, self._actor_names)

    # -- test helpers (as RabbitmqBroker's) ------------------------------------------------

    def get_queue_message_counts(self, queue_name: str) -> tuple[int, int, int]:
        """``(ready, delayed, dead)``: ready messages of ``ojs.queue.{q}``; messages in its
        retry queues plus those in the scheduling cascade (shared by every queue of
        this prefix); messages in ``ojs.queue.dlx.{q}``.  Meant for tests.

        Retry queues are counted when this process declared them (its consumers did).
        """
        ojs_queue = self.ojs_queue(queue_name)
        retry_queues = self._retry_queues(ojs_queue)

        def count(conn: Connection) -> tuple[int, int, int]:
            self.topology.ensure_scheduling(conn.connection, ojs_queue, self.cascade)
            channel = conn.default_channel
            ready = _count(channel, self.names.job_queue(ojs_queue))
            delayed = sum(_count(channel, q) for q in retry_queues)
            delayed += sum(_count(channel, self.cascade.queue(k)) for k in range(self.cascade.levels))
            return ready, delayed, _count(channel, self.names.dead_letter_queue(ojs_queue))

        return self._with_admin(count)

    def flush(self, queue_name: str) -> None:
        """Drop every message of ``queue_name``: job queue, its retry queues and its DLQ."""
        ojs_queue = self.ojs_queue(queue_name)
        names = [
            self.names.job_queue(ojs_queue),
            self.names.dead_letter_queue(ojs_queue),
            *self._retry_queues(ojs_queue),
        ]
        self._with_admin(lambda conn: _purge(conn, names))

    def flush_all(self) -> None:
        """Drop every message of every declared queue, and every scheduled message of this prefix."""
        for queue_name in self.queues:
            self.flush(queue_name)
        levels = [self.cascade.queue(k) for k in range(self.cascade.levels)]
        self._with_admin(lambda conn: _purge(conn, levels))

    def join(
        self, queue_name: str, min_successes: int = 10, idle_time: int = 100, *, timeout: int | None = None
    ) -> None:
        """Wait until ``queue_name`` has nothing ready, delayed (retry queues, scheduler)
        nor in flight in this process, ``min_successes`` polls in a row, ``idle_time`` ms apart.

        Meant for tests.  Messages being processed by a worker in another process
        are not seen (AMQP does not report unacked counts), hence ``min_successes``.

        Raises:
          QueueJoinTimeout: when ``timeout`` (ms) passes first.
        """
        deadline = timeout and time.monotonic() + timeout / 1000
        successes = 0
        while successes < min_successes:
            if deadline and time.monotonic() >= deadline:
                raise dramatiq_error(QueueJoinTimeout, queue_name)
            ready, delayed, _ = self.get_queue_message_counts(queue_name)
            if ready + delayed + self.in_flight(queue_name) == 0:
                successes += 1
            else:
                successes = 0
            time.sleep(idle_time / 1000)

    def _beacon_for(self, worker: Any) -> Beacon:
        """The presence beacon of a booted Dramatiq worker (:class:`~ojs_dramatiq.presence.OjsPresence`)."""
        queues = worker.consumer_whitelist or self.get_declared_queues()
        return self.assembly.beacon(
            sorted({self.ojs_queue(q) for q in queues}),
            worker.worker_threads,
            connection_name=f"ojs_dramatiq worker {self.assembly.worker_id} events",
        )

    def in_flight(self, queue_name: str) -> int:
        """Messages of ``queue_name`` delivered to this process's consumers and not yet settled."""
        return sum(c.unsettled for c in list(self._consumers.get(queue_name, ())))

    def close(self) -> None:
        """Close the publishing connections and the inspection connection."""
        self.client.close()
        self.assembly.close()
        with self._admin_lock:
            self._drop_admin()
            permits, self._permits = self._permits, None
        if permits is not None:
            permits.close()

    def _retry_queues(self, ojs_queue: str) -> list[str]:
        head = self.names.retry_queue(ojs_queue, 0)[:-1]
        return [q for q in self.topology.declared_queues() if q.startswith(head) and q[len(head) :].isdigit()]

    def _with_admin(self, operation: Callable[[Connection], T]) -> T:
        """Run ``operation(conn)`` on the inspection connection, reconnecting as the Client's
        operations do: the next node, the §9 back-off, for ``publish_timeout`` seconds (and
        ``connect_retries``); a permanent refusal (403, 530) at once, typed.  A channel error
        is tried once more on the same node."""
        client = self.client
        retry = Reconnector(
            Budgeted(client.publish_timeout, client.connect_retries),
            self._admin_failover,
            url=client.url,
            name="ojs_dramatiq inspection connection",
        )
        channel_retry = False
        with self._admin_lock:
            while True:
                if self._admin is None:
                    self._admin = self._admin_failover.connection()
                conn = self._admin
                try:
                    if not conn.connected:
                        retry.connecting()
                        self._admin_failover.connect(conn, timeout=retry.attempt_timeout(conn.connect_timeout))
                        retry.succeeded()
                    return operation(conn)
                except conn.connection_errors as exc:
                    self._drop_admin()
                    time.sleep(retry.failed(exc, conn))
                except conn.channel_errors:
                    self._drop_admin()
                    if channel_retry:
                        raise
                    channel_retry = True

    def _drop_admin(self) -> None:
        if self._admin is not None:
            admin: _Releasable = self._admin  # kombu's release() is not annotated
            admin.release()
            self._admin = None


def _count(channel: Channel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).message_count)


def _purge(conn: Connection, queues: Iterable[str]) -> None:
    for queue in queues:
        channel = conn.connection.channel()
        try:
            channel.queue_purge(queue)
        except NotFound:
            pass  # never declared: nothing to purge
        finally:
            close_quietly(channel)  # closed by the broker after a 404


__all__ = ["OjsBroker", "OjsMessageProxy"]
