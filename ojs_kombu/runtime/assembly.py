"""The wiring of a worker of the binding, written once: consumer, control reader, settler, presence.

:class:`~ojs_kombu.runtime.worker.Worker` and the Dramatiq adapter's broker
(:class:`ojs_dramatiq.OjsBroker`) are both made of the same parts: an
:class:`Assembly` holds what their consumers share (the deployment's names, topology
and scheduling cascade, the connection settings, the cancels and pauses replayed from
the control streams, the lifecycle and the activity behind INFO) and builds, per
consumer, the :class:`Consuming` parts: a :class:`~ojs_kombu.runtime.consumer.Consumer`
that replays the queues' control streams (:class:`~ojs_kombu.runtime.control.ControlReader`)
before it consumes them, and the :class:`~ojs_kombu.runtime.settle.Settler` that settles
its deliveries; and, per worker, its presence :class:`~ojs_kombu.runtime.presence.Beacon`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ojs_kombu.amqp.failover import ConnectionSettings
from ojs_kombu.amqp.permits import Permits
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import ValidationError
from ojs_kombu.model.naming import Names
from ojs_kombu.policy.schedule import Cascade
from ojs_kombu.runtime.activity import worker_lifecycle
from ojs_kombu.runtime.completed import CompletedLog, dedupe_prefetch
from ojs_kombu.runtime.consumer import Consumer
from ojs_kombu.runtime.control import Cancellations, CancelRunning, ControlReader, PausedQueues
from ojs_kombu.runtime.delivery import Delivery
from ojs_kombu.runtime.presence import DEFAULT_PRESENCE_INTERVAL, Beacon, check_presence_interval
from ojs_kombu.runtime.settle import DeadLetterMode, Settler
from ojs_kombu.runtime.unique import UniqueRelease
from ojs_kombu.runtime.workflow import DEFAULT_SWEEP_AFTER, WorkflowHook, check_retention
from ojs_kombu.wire.completed import CompletedOptions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Consuming:
    """The parts of one consumer: its :class:`Consumer` and the :class:`Settler` of its deliveries."""

    consumer: Consumer
    settler: Settler
    completed: CompletedLog | None = None
    """The completed job ids (``deduplicate=True``): replayed before the consumer's first job queue,
    stopped (its records flushed, their deliveries acked) before the consumer stops."""


class Assembly:
    """What the consumers of one worker share, and how each one is built.

    Parameters:
        connection: how every connection of the parts reaches the broker (URL or failover list,
            heartbeat, TLS, transport options); each part names its own connection.
        names: the deployment's entity names.
        topology: declares what consuming needs.
        cascade: the scheduling cascade (early jobs and ``delay`` go back into it).
        dead_letter_mode: ``"nack"`` or ``"republish"`` (see :class:`Settler`).
        cancel_running: what cancelling a running job does (see :class:`Cancellations`).
        presence_interval: seconds between two presences of a :meth:`beacon`.
        deduplicate: execution de-duplication (DESIGN §19): every consumer gets a
            :class:`~ojs_kombu.runtime.completed.CompletedLog` of its queues, its settler skips
            the completed ids and records each success before its ack, and its prefetch grows by
            :data:`~ojs_kombu.runtime.completed.DEDUPE_EXTRA_PREFETCH`.
        completed_options: bounds of what ``deduplicate`` remembers.
        unique_backend: where unique jobs' locks are (None: RabbitMQ; a Redis URL), see :class:`UniqueRelease`.
        workflow_retention: seconds an ended workflow's record stream is kept before its sweep job
            deletes it (``None``: kept), see :class:`~ojs_kombu.runtime.workflow.WorkflowRunner`.

    Raises:
        ValidationError: ``dead_letter_mode``, ``cancel_running``, ``presence_interval``, ``unique_backend``
            or ``workflow_retention`` is invalid.
    """

    def __init__(
        self,
        connection: ConnectionSettings,
        names: Names,
        topology: Topology,
        cascade: Cascade,
        *,
        dead_letter_mode: DeadLetterMode | str = "nack",
        cancel_running: CancelRunning = "interrupt",
        presence_interval: float = DEFAULT_PRESENCE_INTERVAL,
        deduplicate: bool = False,
        completed_options: CompletedOptions | None = None,
        unique_backend: str | None = None,
        workflow_retention: float | None = DEFAULT_SWEEP_AFTER,
    ) -> None:
        if dead_letter_mode not in ("nack", "republish"):
            raise ValidationError("dead_letter_mode must be 'nack' or 'republish'", field="dead_letter_mode")
        self.connection = connection
        self.url = url = connection.url
        self.names = names
        self.topology = topology
        self.cascade = cascade
        self.dead_letter_mode = dead_letter_mode
        self.presence_interval = check_presence_interval(presence_interval)
        self.deduplicate = deduplicate
        self.completed_options = completed_options or CompletedOptions()
        #: The cancels replayed from the control streams, and the jobs running now.
        self.cancellations = Cancellations(cancel_running)
        #: The queues paused by ``Client.pause``, as the control readers replay them.
        self.paused = PausedQueues()
        self.lifecycle, self.activity = worker_lifecycle()
        #: The id the worker's presence and job events carry.
        self.worker_id: str = self.lifecycle.worker_id
        #: Frees the unique lock of a job that ends (its own connection, opened by the first job with a
        #: ``unique`` policy); :meth:`close` closes it.
        self.unique_release = UniqueRelease(
            url, names, ssl=connection.ssl, transport_options=connection.transport_options, backend=unique_backend
        )
        #: Advances the workflows of the jobs its settlers settle for good (a connection of its own, opened on first use).
        self.workflow = WorkflowHook(
            self._workflow_connection, topology, sweep_after=check_retention(workflow_retention)
        )
        self._workflow_failover = connection.failover(connection_name="ojs_kombu workflows", heartbeat=0)

    def permits(self, connection_name: str) -> Permits:
        """A connection for the concurrency limits' permits (:class:`~ojs_kombu.runtime.limits.Limiter`).

        Parameters:
            connection_name: what the management UI shows for it.

        Returns:
            The permits, not yet connected (it connects on first use).
        """
        settings = self.connection
        return Permits(
            settings.url,
            names=self.names,
            ssl=settings.ssl,
            transport_options=settings.transport_options,
            connection_name=connection_name,
        )

    def _workflow_connection(self) -> Any:
        # No heartbeats: the hook's connection idles between jobs with nobody to send them; a
        # connection found dead is replaced by the hook (its actions are idempotent).
        connection = self._workflow_failover.connection()
        try:
            self._workflow_failover.connect(connection, timeout=10.0)
        except Exception:
            self._workflow_failover.failed(connection)
            raise
        return connection

    def consuming(
        self,
        queues: Sequence[str],
        prefetch: int,
        on_delivery: Callable[[Delivery], None],
        *,
        connection_name: str,
        connect_retries: int | None = None,
        on_pass: Callable[[], None] | None = None,
    ) -> Consuming:
        """A consumer of the OJS ``queues`` (declared as consuming needs, their control streams
        replayed first) and its settler.

        Parameters:
            queues: the OJS queue names.
            prefetch: ``Basic.Qos`` prefetch count.
            on_delivery: called in the consumer's thread with each delivery.
            connection_name: shown by the broker's management UI.
            connect_retries: consecutive failed connection attempts before the consumer gives up
                (``None``: forever).
            on_pass: called after each pass of the consumer's loop.

        Returns:
            The consumer (not started) and its settler.
        """
        topology, cascade = self.topology, self.cascade
        completed = None
        if self.deduplicate:
            completed = CompletedLog(
                self.url,
                queues,
                names=self.names,
                topology=topology,
                options=self.completed_options,
                heartbeat=self.connection.heartbeat,
                ssl=self.connection.ssl,
                transport_options=self.connection.transport_options,
                connection_name=f"{connection_name} completed",
            )
            prefetch = dedupe_prefetch(prefetch)

        def declare(connection: Any) -> None:
            for queue in queues:
                topology.ensure_consumable(connection, queue, cascade)
            if completed is not None and not completed.start():  # caught up before any job is consumed
                logger.warning(
                    "the completed job ids of %s were not replayed within %.0fs; consuming without them "
                    "meanwhile (a duplicate of a job completed before may run again)",
                    ", ".join(queues),
                    completed.replay_timeout,
                )

        consumer = Consumer(
            self.url,
            {self.names.job_queue(q): q for q in queues},
            prefetch,
            on_delivery,
            topology=topology,
            declare=declare,
            control=ControlReader(
                self.names, topology, queues, self.cancellations, paused=self.paused, info=self.activity.lookup
            ),
            heartbeat=self.connection.heartbeat,
            connect_retries=connect_retries,
            connection_name=connection_name,
            ssl=self.connection.ssl,
            transport_options=self.connection.transport_options,
            on_pass=on_pass,
        )
        settler = Settler(
            consumer,
            self.names,
            topology,
            cascade,
            dead_letter_mode=self.dead_letter_mode,
            cancelled=self.cancellations.is_cancelled,
            completed=completed,
            lifecycle=self.lifecycle,
            workflow=self.workflow,
            unique=self.unique_release,
        )
        return Consuming(consumer, settler, completed)

    def close(self) -> None:
        """Close what the parts share (the unique-lock releaser's and the workflow hook's connections);
        after the consumers stopped."""
        self.unique_release.close()
        self.workflow.close()

    def beacon(
        self,
        queues: Iterable[str],
        concurrency: int,
        *,
        connection_name: str,
        on_stalled: Callable[[str, str], None] | None = None,
    ) -> Beacon:
        """The presence beacon of a worker consuming ``queues`` with ``concurrency`` (not started).

        Parameters:
            queues: the OJS queues the worker consumes.
            concurrency: the jobs it runs at once.
            connection_name: the beacon connection's, shown by the management UI.
            on_stalled: called when its presences stay unconfirmed (see :class:`Beacon`).

        Returns:
            The beacon; :meth:`Beacon.offer` takes the job events to publish.
        """
        return Beacon(
            self.connection.named(connection_name),
            self.names,
            self.topology,
            worker_id=self.worker_id,
            queues=queues,
            concurrency=concurrency,
            active=self.activity.active_jobs,
            interval=self.presence_interval,
            on_stalled=on_stalled,
        )


__all__ = ["Assembly", "Consuming"]
