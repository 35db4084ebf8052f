"""The OJS state of one ``ojs://`` AMQP connection: routing, lazy declarations, publishing tasks."""

from __future__ import annotations

import logging
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from functools import partial
from typing import Any

import amqp

from ojs_kombu.amqp.info import ask_info, publish_control
from ojs_kombu.amqp.locks import UniqueLocks
from ojs_kombu.amqp.permits import Permits
from ojs_kombu.amqp.publisher import ConfirmedPublisher, Destination
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.amqp.workflowlog import sweep_workflow
from ojs_kombu.errors import BrokerConnectionError, PublishTimeoutError
from ojs_kombu.model.fields import JobState
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import QUEUE_NAME_RE, ojs_queue_for
from ojs_kombu.policy.retry import ladder_ms_until
from ojs_kombu.policy.schedule import Cascade
from ojs_kombu.runtime.replace import DEFAULT_REPLACE_PROBE, cancel_and_wait
from ojs_kombu.runtime.unique import Locks, claim, lock_to_release, release_lock
from ojs_kombu.transport.completed import CompletedLogs
from ojs_kombu.transport.control import ConnectionControl
from ojs_kombu.transport.queues import QueueMap
from ojs_kombu.transport.settings import QUEUE_ARGUMENT_OPTIONS, Settings, TaskCodec
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.control import cancel_message

logger = logging.getLogger(__name__)


class ConnectionState:
    """What one AMQP connection knows about the OJS deployment: names, topology, publisher.

    Parameters:
        connection: the py-amqp connection (declarations and the publisher's channel use it).
        settings: the connection's OJS options.
        queues: the :class:`QueueMap` of the settings' prefix.
        completed: the completed job ids of the queues consumed (transport option ``deduplicate``),
            the transport's: None without de-duplication.
    """

    def __init__(self, connection: Any, settings: Settings, queues: QueueMap, completed: CompletedLogs | None = None):
        self.connection = connection
        self.completed = completed
        # (channel, delivery tag) of completed jobs whose record is confirmed: acked by maintain().
        self._recorded: deque[tuple[Any, int]] = deque()
        # Work handed to the connection's loop from other threads (a parked job admitted by its waiter).
        self._soon: deque[Callable[[], None]] = deque()
        #: Makes the transport's permits (for jobs with a rate limit), shared by its connections; set by the transport.
        self.permits: Callable[[], Permits] | None = None
        #: Makes the connection's loop call :meth:`maintain` soon, from any thread (set by the transport
        #: under kombu's event loop; without one, the next ``drain_events`` does).
        self.wake: Callable[[], None] | None = None
        self.settings = settings
        self.names = settings.names
        self.queues = queues
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
        self._ensured: set[Hashable] = set()
        self._control: ConnectionControl | None = None
        self._paused_version = 0
        self._unique_locks: UniqueLocks | None = None
        self._releases: deque[tuple[str, str]] = deque()  # (key, holder id) of jobs that ended
        self._codec: TaskCodec | None = None
        #: The channels consuming job queues (each has ``apply_pauses``).
        self.job_channels: weakref.WeakSet[Any] = weakref.WeakSet()

    @property
    def control(self) -> ConnectionControl:
        """The control streams read on this connection (created on first use: producers never read any)."""
        if self._control is None:
            self._control = ConnectionControl(
                self.names, self.topology, self.settings.load_on_cancel(), info=self.settings.load_info()
            )
        return self._control

    @property
    def codec(self) -> TaskCodec | None:
        """The task message codec (loaded on first use: a codec may need its framework only then),
        or None while the connection has none (no ``codec`` option, none registered)."""
        codec = self._codec
        if codec is None:
            codec = self._codec = self.settings.load_codec()
        return codec

    @property
    def publisher(self) -> ConfirmedPublisher:
        """The confirmed publisher of this connection (its own channel), created on first use."""
        if self._publisher is None or not self._publisher.channel.is_open:
            self._publisher = ConfirmedPublisher(self.connection)
        return self._publisher

    def release(self, job: Job, state: JobState) -> None:
        """Free ``job``'s unique lock now that it ended in ``state`` (from any thread): done by :meth:`maintain`.

        Parameters:
            job: the job (as delivered).
            state: its end state (``completed``, ``discarded``, ``cancelled``).
        """
        key = lock_to_release(job, state)
        if key is not None:
            self._releases.append((key, job.id))

    def _release_pending(self) -> None:
        while self._releases:
            key, holder_id = self._releases.popleft()
            try:
                self._with_locks(partial(release_lock, key=key, holder_id=holder_id))
            except Exception as exc:  # noqa: BLE001  (the lock then ends with its period)
                self._unique_locks = None
                logger.warning(
                    "could not release the unique lock of job %s: %r; it ends with its period", holder_id, exc
                )

    def sweep(self, workflow_id: str) -> None:
        """Delete an ended workflow's record stream and cancel marker on this connection (the Settler's ``sweep``).

        Parameters:
            workflow_id: the root workflow's id.

        Raises:
            BrokerRefusedError: the broker refused a deletion.
        """
        sweep_workflow(self.connection, self.names, workflow_id)

    def ack_recorded(self, channel: Any, delivery_tag: int, ok: bool) -> None:
        """A completed job's record is confirmed (or given up): ack its delivery from the connection's loop.

        Called in the completed-ids log's thread (``on_recorded``); the ack is sent by :meth:`maintain`.
        """
        self._recorded.append((channel, delivery_tag))
        wake = self.wake
        if wake is not None:
            wake()

    def call_soon(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the connection's loop (from any thread): done by :meth:`maintain`.

        Parameters:
            work: what to run.
        """
        self._soon.append(work)
        wake = self.wake
        if wake is not None:
            wake()

    def maintain(self) -> None:
        """Called from the connection's loop: ack the completed jobs whose record is confirmed, run the
        work handed over by other threads, free the unique locks of jobs that ended, re-read cancelled
        control streams, apply pauses and resumes."""
        soon = self._soon
        while soon:
            soon.popleft()()
        recorded = self._recorded
        while recorded:
            channel, delivery_tag = recorded.popleft()
            if channel.is_open:  # closed: the broker redelivers it, and it is skipped then
                channel.basic_ack(delivery_tag)
        if self._releases:
            self._release_pending()
        control = self._control
        if control is None:
            return
        control.maintain(self.connection)
        if control.paused.version != self._paused_version:
            self._paused_version = control.paused.version
            for channel in list(self.job_channels):
                if channel.is_open:
                    channel.apply_pauses(control.paused.queues)

    def is_cancelled(self, job_id: str) -> bool:
        """Whether a control stream read on this connection cancelled ``job_id`` (the Settler's ``cancelled``)."""
        return self._control is not None and self._control.is_cancelled(job_id)

    # -- queues --------------------------------------------------------------------------------

    def register_queue(self, name: str, arguments: dict[str, Any] | None) -> str:
        """Make framework queue ``name`` a job queue.

        Parameters:
            name: the framework's queue name.
            arguments: the arguments it was declared with (``x-max-priority`` and the like are used).

        Returns:
            Its OJS queue name.
        """
        ojs_queue = ojs_queue_for(name)
        known = {k: v for k, v in (arguments or {}).items() if k in QUEUE_ARGUMENT_OPTIONS}
        if known:
            self.queues.options[ojs_queue] = self.settings.options_with(known)
        ignored = sorted(set(arguments or {}) - set(known))
        if ignored:
            logger.debug("queue %s: arguments %s are the binding's own or unsupported; not used", name, ignored)
        self.queues.arguments[name] = arguments
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
        """Lazily declare job queue ``queue`` with its DLQ and bindings, and the binding that
        delivers its scheduled jobs (:meth:`Topology.ensure_consumable
        <ojs_kombu.amqp.topology.Topology.ensure_consumable>`: a consumer declares its queue here)."""
        options = self.queues.options.get(queue)  # learnt on any connection of this prefix
        if options is not None and self.topology.per_queue.get(queue) != options:
            self.topology.per_queue[queue] = options
            self._ensured.discard(("queue", queue))
        self._once(("queue", queue), lambda: self.topology.ensure_consumable(self.connection, queue, self.cascade))

    def ensure_scheduling(self, queue: str) -> None:
        """Lazily declare the scheduling cascade and its binding to ``queue``."""
        self._once(("schedule", queue), lambda: self.topology.ensure_scheduling(self.connection, queue, self.cascade))

    def ensure_retry_queue(self, queue: str, delay_ms: int) -> None:
        """Lazily declare ``ojs.queue.retry.{queue}.{delay_ms}``."""
        self._once(
            ("retry", queue, delay_ms), lambda: self.topology.ensure_retry_queue(self.connection, queue, delay_ms)
        )

    def _once(self, key: Hashable, declare: Callable[[], None]) -> None:
        # The topology caches too, but checks every spec of the cascade: this is the per-publish fast path.
        if key not in self._ensured:
            declare()
            self._ensured.add(key)

    # -- publishing tasks ----------------------------------------------------------------------

    def publish_task(self, msg: amqp.Message, queue: str, confirm_timeout: float | None) -> None:
        """Publish a task message as an OJS job (confirmed, mandatory) and wait for the confirm.

        Parameters:
            msg: the framework's task message.
            queue: the OJS queue it is for.
            confirm_timeout: seconds to wait for the confirm (None: the settings' ``confirm_timeout``).

        A job with a ``unique`` policy (``apply_async(..., ojs_unique={...})``) takes its lock
        first (:func:`ojs_kombu.runtime.unique.claim`); a duplicate under ``ignore`` is not published.

        Raises:
            DuplicateJobError: a unique job's key is held by another job (``on_conflict="reject"``).
            ValidationError: the codec could not make a valid job of it.
            PublishError: the broker returned or nacked it, or did not confirm it in time.
        """
        body = msg.body if isinstance(msg.body, bytes) else str(msg.body).encode("utf-8")
        properties = {k: v for k, v in msg.properties.items() if k != "application_headers"}
        headers = dict(msg.properties.get("application_headers") or {})
        codec = self.codec
        assert codec is not None  # only task messages come here: the codec recognised them
        job, message = codec.to_job(body, properties, headers, queue)
        key = None
        if job.unique is not None and job.attempt == 0:  # a retry's job holds its lock already
            claimed = claim(job, self._with_locks, partial(self._replace, queue=queue))
            if claimed.existing_id is not None:
                return  # a duplicate under on_conflict="ignore": nothing is published
            key, job = claimed.key, claimed.job
        try:
            self._publish_job(job, message, queue, confirm_timeout)
        except Exception as exc:
            if key is not None and not isinstance(exc, (PublishTimeoutError, BrokerConnectionError)):
                self._with_locks(lambda locks: locks.release(key, job.id))  # it was not published
            raise

    def _publish_job(self, job: Job, message: OutgoingMessage, queue: str, confirm_timeout: float | None) -> None:
        publisher = self.publisher  # a new channel is set up before any delay is measured
        if job.attempt == 0 and job.scheduled_at is None:  # most tasks: no clock to read
            self.ensure_queue(queue)
            ticket = publisher.publish(
                message, exchange=self.names.direct_exchange, routing_key=queue, queue=queue, job_id=job.id
            )
        else:
            destination, prepare = self._delayed(message, job, queue)
            ticket = publisher.publish_when_ready(destination, queue=queue, prepare=prepare, job_id=job.id)
        publisher.wait([ticket], confirm_timeout or self.settings.confirm_timeout)
        ticket.raise_for_error()

    def _with_locks(self, operation: Callable[[Locks], Any]) -> Any:
        """Run ``operation`` on this connection's unique locks (made on first use), or on Redis's (``unique_backend``)."""
        redis_locks = self.settings.redis_locks()
        if redis_locks is not None:
            return operation(redis_locks)
        if self._unique_locks is None:
            self._unique_locks = UniqueLocks(self.connection, names=self.names)
        return operation(self._unique_locks)

    def _replace(self, existing: str, scheduled_at: str | None, *, queue: str) -> None:
        """``replace``: cancel the holder ``existing`` and wait while it runs, as the Client does
        (:func:`~ojs_kombu.runtime.replace.cancel_and_wait`, ``unique_replace_timeout``)."""
        cancel_and_wait(
            existing,
            scheduled_at,
            cancel=lambda: self.publish_cancel(existing, queue),
            info=lambda probe: self.ask_info(existing, queue, probe),
            probe=DEFAULT_REPLACE_PROBE,
            timeout=self.settings.unique_replace_timeout,
        )

    def ask_info(self, job_id: str, queue: str, timeout: float) -> JobInfo | None:
        """INFO about ``job_id`` from the workers of OJS queue ``queue`` (:func:`~ojs_kombu.amqp.info.ask_info`).

        Parameters:
            job_id: the job's id.
            queue: the OJS queue (its control stream is declared first, once per connection).
            timeout: seconds to wait for answers.

        Returns:
            The best answer, or None when no worker answered.

        Raises:
            PublishError: the broker returned or nacked the request, or did not confirm it in time.
        """
        self._ensure_control(queue)
        return ask_info(
            self.connection,
            self.publisher,
            self.names,
            job_id,
            queue,
            timeout=timeout,
            confirm_timeout=self.settings.confirm_timeout,
        )

    def _ensure_control(self, queue: str) -> None:
        self._once(
            ("control", queue), lambda: self.topology.declare(self.connection, self.topology.control_specs(queue))
        )

    def publish_cancel(self, job_id: str, queue: str, confirm_timeout: float | None = None) -> None:
        """CANCEL job ``job_id`` of OJS queue ``queue``: a confirmed publish to its control stream.

        The control stream is declared first (once per connection), so the cancel
        is retained even when no worker of ``queue`` has started yet.

        Parameters:
            job_id: the job's id.
            queue: the OJS queue.
            confirm_timeout: seconds to wait for the confirm (None: the settings' ``confirm_timeout``).

        Raises:
            ValidationError: ``job_id`` is empty.
            PublishError: the broker returned or nacked it, or did not confirm it in time.
        """
        message = cancel_message(job_id)
        self._ensure_control(queue)
        publish_control(self.publisher, self.names, queue, message, confirm_timeout or self.settings.confirm_timeout)

    def _delayed(
        self, message: OutgoingMessage, job: Job, queue: str
    ) -> tuple[Callable[[], Destination], Callable[[Any, Destination], None]]:
        """Where a retry (its retry queue) or a task with an ETA (the cascade) goes, as a function of the
        clock, and what declares it: asked for after the declarations, so they do not make it late."""
        scheduled = job.scheduled_datetime
        if job.attempt > 0:  # a retry: the ladder step for the time left until its ETA
            steps: dict[str, int] = {}  # routing key -> its step, for prepare

            def retry() -> Destination:
                step = 1 if scheduled is None else ladder_ms_until(scheduled)
                key = self.names.retry_routing_key(queue, step)
                steps[key] = step
                return message, self.names.retry_exchange, key

            def prepare_retry(connection: Any, destination: Destination) -> None:
                self.ensure_queue(queue)
                self.ensure_retry_queue(queue, steps[destination[2]])

            return retry, prepare_retry
        assert scheduled is not None  # publish_task: a first attempt comes here only with an ETA

        def prepare_scheduled(connection: Any, destination: Destination) -> None:
            self.ensure_queue(queue)
            if destination[1] != self.names.direct_exchange:  # still ahead: through the cascade
                self.ensure_scheduling(queue)

        return lambda: self.cascade.destination(message, scheduled, queue), prepare_scheduled


__all__ = ["ConnectionState"]
