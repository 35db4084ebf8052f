"""Declaring the binding's exchanges, queues and bindings (binding §4, §7; DESIGN §4).

:class:`Topology` knows which entities a job queue needs (the direct and dead
letter exchanges, ``ojs.queue.{q}`` with its dead-letter arguments, the dead
letter queue ``ojs.queue.dlx.{q}`` and both bindings), declares them eagerly
(:meth:`Topology.declare_queue`) or lazily on first use
(:meth:`Topology.ensure_queue`), remembers everything it declared, and
re-declares it in order after a reconnect (:meth:`Topology.redeclare`).  A batch of
declarations is pipelined: every method is sent, then the replies are read in order, so the
116 entities of a queue with the scheduling cascade cost one round trip rather than 116
(re-declaring them: 72 ms -> 18 ms, medians at load ~6).

A queue that already exists with other arguments makes RabbitMQ answer
``406 PRECONDITION_FAILED`` and close the channel.  The binding says never to
re-declare with other arguments, so the topology records a
:class:`~ojs_kombu.errors.TopologyConflictError` naming the differing
arguments (one record per entity, the latest), logs it, and then:

* when a queue declared with dead-letter arguments (``ojs.queue.{q}``, a retry
  queue, a scheduling level) exists with another ``x-dead-letter-exchange`` or
  ``x-dead-letter-routing-key``, or without them, it is refused with that
  error whatever ``on_conflict`` says: every message it dead-letters would
  miss ``ojs.queue.dlx.{q}`` (or its next hop) and be dropped;
* otherwise, with ``on_conflict="use-existing"`` (the default), it checks the
  entity exists with a passive declare on a fresh channel and uses it as it is;
  with ``on_conflict="raise"`` it raises.

RabbitMQ names only the first inequivalent argument it finds, and it checks
``x-message-ttl`` or ``x-max-length`` before the dead-letter arguments.  To
learn every difference the topology therefore re-declares the queue with the
existing value of each argument the broker named (read from the reply text),
until the broker accepts: that declaration is equivalent to the existing queue,
so it changes nothing.  When a reply cannot be read (an argument type it does
not know), the differences found so far are kept and the passive fallback
applies.

Differences are compared by meaning, not form (:func:`~ojs_kombu.wire.entities.normalise_arguments`):
RabbitMQ up to 4.2 compares arguments literally, so an ``x-max-age`` of ``"60m"`` differs
from ``"1h"``, where 4.3 compares the milliseconds and accepts it; and RabbitMQ 4.x names
an absent ``x-queue-type`` ``'classic'`` in its reply.  A queue that differs only in form
is the same queue: it is used as it is, with no conflict recorded, on every version.

A 406 ``invalid arg`` is not a conflict: the broker does not accept that argument on that
type of queue at all (``x-consumer-timeout`` on a classic queue of RabbitMQ 4.3).  It is raised
as :class:`~ojs_kombu.errors.QueueArgumentRefusedError`, with what to do instead, and before
anything is sent when the declaration names the queue's type and the broker's version is
known to refuse it (:func:`check_arguments`).

The control stream ``ojs.queue.control.{q}`` (DESIGN §14) is declared with its
job queue.  When it exists as another kind of queue (another OJS implementation
declared it classic), the 406 is recorded and logged like any conflict, but
whatever ``on_conflict`` says the topology neither raises nor binds that queue:
it marks the queue's control plane as degraded (:meth:`Topology.control_is_stream`
is False), and workers fall back to per-worker exclusive queues bound with key
``control.{q}`` (live control messages only, no replay).

The events stream ``ojs.stream.events`` (DESIGN §14), bound to the topic exchange
``ojs.exchange.events`` with ``#``, is declared by workers and by the Client's
readers (:meth:`Topology.ensure_events`).  A 406 on it is recorded and logged and
never raised either: when the existing queue is a stream with other retention
arguments it is used as it is; when it is not a stream (or its arguments cannot be
learnt) the events plane is degraded (:meth:`Topology.events_is_stream` is False):
it is not bound, presence and job events are published to the exchange for whatever
else is bound there, and :meth:`Client.workers() <ojs_kombu.client.Client.workers>`
/ ``events()`` raise :class:`~ojs_kombu.errors.TopologyError`.

Permanent refusals (403 on a declaration, 404 on the passive declare) become
:class:`~ojs_kombu.errors.BrokerRefusedError` subclasses (:mod:`ojs_kombu.amqp.errors`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Literal, get_args

from amqp import Channel, Connection
from amqp import spec as amqp_spec
from amqp.exceptions import PreconditionFailed

from ojs_kombu.amqp.connection import close_quietly
from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.probe import probe_queue, reply_text
from ojs_kombu.amqp.refusals import (
    check_arguments,
    existing_value,
    parse_invalid_argument,
    parse_precondition_failed,
)
from ojs_kombu.amqp.version import rabbitmq_version
from ojs_kombu.errors import TopologyConflictError, ValidationError
from ojs_kombu.model.naming import Names, validate_queue_name
from ojs_kombu.policy.schedule import Cascade
from ojs_kombu.wire.completed import CompletedOptions
from ojs_kombu.wire.control import ControlOptions
from ojs_kombu.wire.cron import cron_stream_arguments
from ojs_kombu.wire.entities import (
    DEAD_LETTER_DELIVERY_LIMIT,
    BindingSpec,
    ExchangeSpec,
    QueueOptions,
    QueueSpec,
    Spec,
    frozen_arguments,
    queue_type_arguments,
)
from ojs_kombu.wire.events import EventsOptions

logger = logging.getLogger(__name__)

OnConflict = Literal["use-existing", "raise"]
"""What a :class:`Topology` does when an entity exists with other arguments (see the module docstring)."""

ON_CONFLICT_CHOICES: tuple[str, ...] = get_args(OnConflict)

#: The arguments that decide where a queue's dead letters go.
DEAD_LETTER_ARGUMENTS = frozenset({"x-dead-letter-exchange", "x-dead-letter-routing-key"})


class Topology:
    """Declares and remembers the OJS entities of one deployment (one prefix).

    ``queue_options`` apply to every job queue; ``per_queue`` overrides them for
    named queues.  Thread-safe: declarations are serialised by a lock.

    Parameters:
        names: the entity names (prefix); default the unprefixed names.
        queue_options: optional arguments of every job queue.
        per_queue: options of named queues, replacing ``queue_options`` for them.
        on_conflict: ``"use-existing"`` (warn, use the existing entity) or ``"raise"``
            when an entity exists with other arguments; dead-letter arguments are never
            accepted when they differ (see the module docstring).
        control: retention of the control streams ``ojs.queue.control.{q}``.
        events: retention of the events stream ``ojs.stream.events``.

    Raises:
        ValidationError: ``on_conflict`` is not one of :data:`OnConflict`.
    """

    def __init__(
        self,
        names: Names | None = None,
        *,
        queue_options: QueueOptions | None = None,
        per_queue: dict[str, QueueOptions] | None = None,
        on_conflict: OnConflict = "use-existing",
        control: ControlOptions | None = None,
        events: EventsOptions | None = None,
    ):
        if on_conflict not in ON_CONFLICT_CHOICES:
            raise ValidationError(
                f"on_conflict must be one of {', '.join(map(repr, ON_CONFLICT_CHOICES))}, got {on_conflict!r}",
                field="on_conflict",
            )
        self.names = names or Names()
        self.queue_options = queue_options or QueueOptions()
        self.per_queue = dict(per_queue or {})
        self.on_conflict: OnConflict = on_conflict
        self.control = control or ControlOptions()
        self._control_queues: dict[str, str] = {}  # ojs.queue.control.{q} -> q
        self._control_degraded: set[str] = set()  # OJS queues whose control queue is not a stream
        self.events = events or EventsOptions()
        self._events_degraded = False  # ojs.stream.events exists and is not a stream
        self._conflicts: dict[str, TopologyConflictError] = {}  # entity -> latest conflict
        self._cascade_queues: set[str] = set()  # the scheduling levels' queues (shared by all job queues)
        self._cascade_warned = False  # one warning for the whole cascade, not one per level
        self._declared: dict[Spec, None] = {}  # insertion-ordered set
        self._warned: dict[str, str] = {}  # entity -> the conflict last logged as a warning
        self._lock = threading.RLock()

    @property
    def conflicts(self) -> list[TopologyConflictError]:
        """The latest conflict of each entity found to differ, in the order first found.

        Re-declaring an entity replaces its record, so this never grows beyond the
        number of conflicting entities.
        """
        with self._lock:
            return list(self._conflicts.values())

    # -- what a queue needs --------------------------------------------------------------------

    def options_for(self, queue: str) -> QueueOptions:
        """The queue options that apply to ``queue``."""
        return self.per_queue.get(queue, self.queue_options)

    def job_queue_arguments(self, queue: str) -> dict[str, Any]:
        """The exact arguments ``ojs.queue.{queue}`` is declared with."""
        args = {
            "x-dead-letter-exchange": self.names.dead_letter_exchange,
            "x-dead-letter-routing-key": queue,
        }
        args.update(self.options_for(queue).arguments())
        return args

    def dead_letter_queue_arguments(self, queue: str) -> dict[str, Any]:
        """Arguments of ``ojs.queue.dlx.{queue}``: only those of the queue type, so a quorum deployment
        stays quorum (with :data:`~ojs_kombu.wire.entities.DEAD_LETTER_DELIVERY_LIMIT`)."""
        queue_type = self.options_for(queue).queue_type
        args = queue_type_arguments(queue_type)
        if queue_type == "quorum":
            args["x-delivery-limit"] = DEAD_LETTER_DELIVERY_LIMIT
        return args

    def base_specs(self) -> list[Spec]:
        """The exchanges every deployment has: direct, dead letter and retry."""
        n = self.names
        return [ExchangeSpec(n.direct_exchange), ExchangeSpec(n.dead_letter_exchange), ExchangeSpec(n.retry_exchange)]

    def queue_specs(self, queue: str) -> list[Spec]:
        """Everything one job queue needs, in declaration order."""
        validate_queue_name(queue)
        n = self.names
        return [
            *self.base_specs(),
            QueueSpec(n.job_queue(queue), frozen_arguments(self.job_queue_arguments(queue))),
            QueueSpec(n.dead_letter_queue(queue), frozen_arguments(self.dead_letter_queue_arguments(queue))),
            BindingSpec(n.job_queue(queue), n.direct_exchange, queue),
            BindingSpec(n.dead_letter_queue(queue), n.dead_letter_exchange, queue),
            *self._control_stream_specs(queue),
        ]

    def control_specs(self, queue: str) -> list[Spec]:
        """The control stream ``ojs.queue.control.{queue}``, its binding (key ``control.{queue}``) and
        the direct exchange that binding needs: a cancel may be a deployment's first declaration."""
        return [ExchangeSpec(self.names.direct_exchange), *self._control_stream_specs(queue)]

    def _control_stream_specs(self, queue: str) -> list[Spec]:
        n = self.names
        name = n.control_queue(queue)
        self._control_queues[name] = queue
        return [
            QueueSpec(name, frozen_arguments(self.control.arguments())),
            BindingSpec(name, n.direct_exchange, n.control_routing_key(queue)),
        ]

    def control_is_stream(self, queue: str) -> bool:
        """Whether the control queue of ``queue`` is the stream (False: degraded, see the module docstring)."""
        with self._lock:
            return queue not in self._control_degraded

    def completed_specs(self, queue: str, options: CompletedOptions) -> list[Spec]:
        """The stream ``ojs.stream.completed.{queue}`` of execution de-duplication (DESIGN §19).

        Published to through the default exchange (routing key = its name): no binding.
        """
        validate_queue_name(queue)
        return [QueueSpec(self.names.completed_stream(queue), frozen_arguments(options.arguments()))]

    def events_specs(self) -> list[Spec]:
        """The events exchange (topic), the events stream and their binding (key ``#``)."""
        n = self.names
        return [
            ExchangeSpec(n.events_exchange, "topic"),
            QueueSpec(n.events_stream, frozen_arguments(self.events.arguments())),
            BindingSpec(n.events_stream, n.events_exchange, "#"),
        ]

    def cron_specs(self) -> list[Spec]:
        """The cron stream ``ojs.stream.cron`` (definitions and ticks, DESIGN §20; published to
        through the default exchange)."""
        return [QueueSpec(self.names.cron_stream, frozen_arguments(cron_stream_arguments()))]

    def ensure_cron(self, connection: Connection) -> None:
        """Lazily declare the cron stream (:meth:`cron_specs`).

        Raises:
            TopologyConflictError: it exists with other arguments (e.g. not as a stream).
            AccessRefusedError: the user may not declare it (403).
        """
        self.declare(connection, self.cron_specs())

    def events_is_stream(self) -> bool:
        """Whether ``ojs.stream.events`` is our stream (False: degraded, see the module docstring)."""
        return not self._events_degraded

    def retry_queue_specs(self, queue: str, delay_ms: int) -> list[Spec]:
        """A retry delay queue with exactly the arguments of binding §8.2, and its binding."""
        validate_queue_name(queue)
        n = self.names
        name = n.retry_queue(queue, delay_ms)
        args = {
            "x-dead-letter-exchange": n.direct_exchange,
            "x-dead-letter-routing-key": queue,
            "x-message-ttl": int(delay_ms),
            **queue_type_arguments(self.options_for(queue).delay_type),
        }
        return [
            *self.base_specs(),
            QueueSpec(name, frozen_arguments(args)),
            BindingSpec(name, n.retry_exchange, n.retry_routing_key(queue, delay_ms)),
        ]

    # -- declaring -----------------------------------------------------------------------------

    def declare_queue(self, connection: Connection, queue: str) -> None:
        """Eagerly declare ``queue`` (job queue, DLQ, exchanges, bindings), even if cached."""
        self.declare(connection, self.queue_specs(queue), force=True)

    def ensure_queue(self, connection: Connection, queue: str) -> None:
        """Lazily declare ``queue``: only what this topology has not declared yet."""
        self.declare(connection, self.queue_specs(queue))

    def ensure_retry_queue(self, connection: Connection, queue: str, delay_ms: int) -> None:
        """Lazily declare the retry queue ``ojs.queue.retry.{queue}.{delay_ms}``."""
        self.declare(connection, self.retry_queue_specs(queue, delay_ms))

    def ensure_scheduling(self, connection: Connection, queue: str, cascade: Cascade) -> None:
        """Lazily declare ``queue``, the scheduling ``cascade`` and the binding that delivers
        scheduled jobs into ``ojs.queue.{queue}``.

        The cascade's queues are of ``queue``'s :attr:`~ojs_kombu.wire.entities.QueueOptions.delay_type`
        (quorum by default).  The cascade is shared by every job queue of the prefix: when it
        exists as another type, it is used as it is (see :meth:`declare`; one warning names
        what is lost), unless ``on_conflict="raise"``.
        """
        specs = cascade.specs(self.options_for(queue).delay_type)
        with self._lock:
            self._cascade_queues.update(s.name for s in specs if isinstance(s, QueueSpec))
        self.declare(connection, [*self.queue_specs(queue), *specs, cascade.queue_binding(queue)])

    def consumable_specs(self, queue: str, cascade: Cascade) -> list[Spec]:
        """What a consumer of ``queue`` needs: the job queue with its DLQ (:meth:`queue_specs`), the
        cascade's delivery exchange and the binding that delivers ``queue``'s scheduled jobs."""
        return [*self.queue_specs(queue), ExchangeSpec(cascade.delivery_exchange), cascade.queue_binding(queue)]

    def ensure_consumable(self, connection: Connection, queue: str, cascade: Cascade) -> None:
        """Lazily declare what consuming ``queue`` needs (:meth:`consumable_specs`), not the cascade.

        Whoever *schedules* a job (the Client, a retry or an early delivery settled by a
        worker, the ``ojs://`` transport) declares the cascade first
        (:meth:`ensure_scheduling`), so a consumer skips its levels: about a hundred round
        trips of start-up.  The delivery binding is declared with the queue, and again
        whenever the queue is (after :meth:`forget`, e.g. the queue was deleted), so jobs
        waiting in the cascade for it still arrive.

        Parameters:
            connection: an open py-amqp connection.
            queue: the OJS queue consumed.
            cascade: the scheduling cascade of this prefix.

        Raises:
            TopologyConflictError: an entity exists with other arguments (see :meth:`declare`).
            AccessRefusedError: the user may not declare it (403).
        """
        self.declare(connection, self.consumable_specs(queue, cascade))

    def ensure_events(self, connection: Connection, *, force: bool = False) -> None:
        """Declare the events exchange and stream (lazily, or again with ``force``).

        Raises:
            AccessRefusedError: the user may not declare them (403).
        """
        self.declare(connection, self.events_specs(), force=force)

    def is_declared(self, queue: str) -> bool:
        """Whether the job queue ``queue`` has been declared by this topology."""
        return (
            QueueSpec(self.names.job_queue(queue), frozen_arguments(self.job_queue_arguments(queue))) in self._declared
        )

    def declared_queues(self) -> list[str]:
        """The AMQP names of every queue this topology has declared, in declaration order."""
        with self._lock:
            return [spec.name for spec in self._declared if isinstance(spec, QueueSpec)]

    def forget(self, queue: str | None = None) -> None:
        """Forget declarations (all, or those of one job queue) so they are declared again."""
        with self._lock:
            if queue is None:
                self._declared.clear()
            else:
                for spec in self.queue_specs(queue)[3:]:
                    self._declared.pop(spec, None)
                # Other bindings to the job queue (the scheduling cascade's) vanished with it too.
                job_queue = self.names.job_queue(queue)
                for spec in [s for s in self._declared if isinstance(s, BindingSpec) and s.destination == job_queue]:
                    self._declared.pop(spec, None)

    def delete_declared(self, connection: Connection) -> int:
        """Delete every queue and exchange this topology declared (messages included!).

        For tests, demos and tearing down a tenant; returns how many entities went.
        """
        with self._lock:
            specs = list(self._declared)
            self._declared.clear()
        channel = connection.channel()
        try:
            for spec in specs:
                if isinstance(spec, QueueSpec):
                    channel.queue_delete(spec.name)
                elif isinstance(spec, ExchangeSpec):
                    channel.exchange_delete(spec.name)
        finally:
            close_quietly(channel)
        return sum(not isinstance(s, BindingSpec) for s in specs)

    def redeclare(self, connection: Connection) -> None:
        """Re-declare everything declared so far: exchanges, then queues, then bindings."""
        with self._lock:
            specs = list(self._declared)
        ordered = (
            [s for s in specs if isinstance(s, ExchangeSpec)]
            + [s for s in specs if isinstance(s, QueueSpec)]
            + [s for s in specs if isinstance(s, BindingSpec)]
        )
        self.declare(connection, ordered, force=True)

    def declare(self, connection: Connection, specs: Iterable[Spec], *, force: bool = False) -> None:
        """Declare ``specs`` in order on a channel of ``connection`` (a py-amqp connection).

        Parameters:
            connection: an open py-amqp connection.
            specs: what to declare, in order.
            force: declare even what this topology has declared before.

        Raises:
            TopologyConflictError: an entity exists with other arguments and ``on_conflict``
                is ``"raise"``, or its dead-letter arguments differ.
            QueueArgumentRefusedError: the broker does not accept an argument on that type of
                queue (raised before anything is sent when its version is known to refuse it,
                see :func:`check_arguments`).
            AccessRefusedError: the user may not declare it (403).
            NotFoundError: the passive declare after a conflict found nothing.
        """
        # The lock guards this topology's records, never a wait for the broker: the connections
        # sharing the topology (a Worker's consumer and beacon, a Client's pool) declare in
        # parallel, so a declaration stuck on one node (a minority node waits 30 s for the
        # metadata store of RabbitMQ 4.x) does not hold back another connection's failover.
        with self._lock:
            todo = [s for s in specs if force or s not in self._declared]
        if not todo:
            return
        check_arguments(todo, rabbitmq_version(connection))
        channel = connection.channel()
        try:
            while todo:
                channel, todo = self._declare_pipelined(connection, channel, todo)
        finally:
            close_quietly(channel)

    def _declare_pipelined(
        self, connection: Connection, channel: Channel, specs: list[Spec]
    ) -> tuple[Channel, list[Spec]]:
        """Send every declaration of ``specs``, then read their replies in order (one round trip).

        A refusal closes the channel, and RabbitMQ discards what was sent after it; so the
        reply that did not come is the refused entity's.  Its conflict is handled as in
        :meth:`declare` and the rest is returned, to be sent again on the channel returned.
        """
        sent: list[tuple[Spec, Any]] = []
        with map_exceptions():
            for spec in specs:
                sent.append((spec, self._send(channel, spec)))
            for index, (spec, reply) in enumerate(sent):
                if reply is not None:
                    try:
                        channel.wait(reply)
                    except PreconditionFailed as exc:
                        if isinstance(spec, BindingSpec):
                            raise
                        refused = parse_invalid_argument(reply_text(exc), rabbitmq_version(connection))
                        if refused is not None:
                            raise refused from None
                        with self._lock:  # a conflict is rare: its probe may hold the lock
                            replaced = self._refused(
                                connection, spec, parse_precondition_failed(spec.name, reply_text(exc))
                            )
                            # Used as it exists: cached like an accepted entity, so the next use
                            # neither re-declares it nor warns again (a redeclare() finds it again: see _log).
                            self._declared[spec] = None
                        close_quietly(channel)  # py-amqp reopened it after the 406
                        return replaced, [s for s, _ in sent[index + 1 :]]
                    with self._lock:
                        self._accepted(spec)
                with self._lock:
                    self._declared[spec] = None
        return channel, []

    def _send(self, channel: Channel, spec: Spec) -> Any:
        """Send the declaration of ``spec`` without waiting; return the method of its reply (None: skipped)."""
        if isinstance(spec, BindingSpec):
            control_queue = self._control_queues.get(spec.destination)
            if control_queue is not None and control_queue in self._control_degraded:
                return None  # never bind someone else's classic queue: workers bind their own
            if spec.destination == self.names.events_stream and self._events_degraded:
                return None
            if spec.to_exchange:
                channel.send_method(
                    amqp_spec.Exchange.Bind,
                    "BsssbF",
                    (0, spec.destination, spec.exchange, spec.routing_key, False, None),
                )
                return amqp_spec.Exchange.BindOk
            channel.send_method(
                amqp_spec.Queue.Bind, "BsssbF", (0, spec.destination, spec.exchange, spec.routing_key, False, None)
            )
            return amqp_spec.Queue.BindOk
        if isinstance(spec, ExchangeSpec):
            arguments = dict(spec.arguments) or None
            # ticket, exchange, type, passive, durable, auto_delete, internal, nowait, arguments
            channel.send_method(
                amqp_spec.Exchange.Declare,
                "BssbbbbbF",
                (0, spec.name, spec.type, False, True, False, False, False, arguments),
            )
            return amqp_spec.Exchange.DeclareOk
        # ticket, queue, passive, durable, exclusive, auto_delete, nowait, arguments
        channel.send_method(
            amqp_spec.Queue.Declare,
            "BsbbbbbF",
            (0, spec.name, False, True, False, False, False, spec.argument_dict or None),
        )
        return amqp_spec.Queue.DeclareOk

    def _accepted(self, spec: Spec) -> None:
        """The broker declared ``spec`` as asked: a control or events stream is ours again."""
        if isinstance(spec, QueueSpec):
            self._control_degraded.discard(self._control_queues.get(spec.name, ""))
            if spec.name == self.names.events_stream:
                self._events_degraded = False

    def _refused(
        self, connection: Connection, spec: ExchangeSpec | QueueSpec, conflict: TopologyConflictError
    ) -> Channel:
        """A 406 on ``spec``: the channel to go on with, or raise (see the module docstring)."""
        channel: Channel | None = None
        if isinstance(spec, QueueSpec):
            conflict, channel = probe_queue(connection, spec, conflict)
            if channel is not None and not conflict.differences:
                return self._equivalent(spec, conflict, channel)
        if isinstance(spec, QueueSpec) and spec.name == self.names.events_stream:
            return self._events_conflict(connection, spec, conflict, channel)
        if isinstance(spec, QueueSpec) and spec.name in self._control_queues:
            return self._control_conflict(connection, spec, conflict, channel)
        return self._conflict(connection, spec, conflict, channel)

    def _equivalent(self, spec: QueueSpec, conflict: TopologyConflictError, channel: Channel) -> Channel:
        """``spec`` exists with arguments that differ only in form (``x-max-age`` ``"60m"`` for ``"1h"``):
        the same queue, used as it is without a conflict (RabbitMQ 4.3 accepts such a declaration itself)."""
        self._conflicts.pop(spec.name, None)
        self._accepted(spec)
        logger.debug("%r exists with arguments equivalent to ours (%s)", spec.name, conflict.reply_text)
        return channel

    def _control_conflict(
        self, connection: Connection, spec: QueueSpec, conflict: TopologyConflictError, channel: Channel | None
    ) -> Channel:
        """The control queue exists but is not our stream: record, log, degrade (never raise)."""
        if channel is not None:
            close_quietly(channel)
        self._conflicts.pop(spec.name, None)
        self._conflicts[spec.name] = conflict
        self._control_degraded.add(self._control_queues[spec.name])
        self._log(conflict)(
            "%s; the control plane of this queue is degraded: workers use exclusive queues bound with key "
            "%r (cancels reach live workers only, nothing is replayed to a worker started later)",
            conflict,
            self.names.control_routing_key(self._control_queues[spec.name]),
        )
        return connection.channel()  # the 406 closed the channel

    def _events_conflict(
        self, connection: Connection, spec: QueueSpec, conflict: TopologyConflictError, channel: Channel | None
    ) -> Channel:
        """The events stream exists with other arguments: record, log, use it or degrade (never raise)."""
        self._conflicts.pop(spec.name, None)
        self._conflicts[spec.name] = conflict
        is_stream = channel is not None and all(d.argument != "x-queue-type" for d in conflict.differences)
        self._events_degraded = not is_stream
        if channel is not None and is_stream:
            self._log(conflict)("%s; using the existing events stream as it is", conflict)
            return channel
        if channel is not None:
            close_quietly(channel)
        self._log(conflict)(
            "%s; it is not the events stream: presence and job events are published to %s only, "
            "and Client.workers() / Client.events() cannot read them",
            conflict,
            self.names.events_exchange,
        )
        return connection.channel()  # the 406 closed the channel

    def _conflict(
        self,
        connection: Connection,
        spec: ExchangeSpec | QueueSpec,
        conflict: TopologyConflictError,
        channel: Channel | None,
    ) -> Channel:
        """Record a 406 on ``spec``, then refuse it or return a channel on which it exists as it is."""
        self._conflicts.pop(spec.name, None)  # re-inserted: the latest record, one per entity
        self._conflicts[spec.name] = conflict
        dead_letters = isinstance(spec, QueueSpec) and bool(DEAD_LETTER_ARGUMENTS & set(spec.argument_dict))
        lost = dead_letters and any(d.argument in DEAD_LETTER_ARGUMENTS for d in conflict.differences)
        if lost or self.on_conflict == "raise":
            if channel is not None:
                close_quietly(channel)
            if lost:
                raise TopologyConflictError(
                    conflict.entity,
                    conflict.differences,
                    conflict.reply_text,
                    hint="its dead letters would not reach their queue, so it is never used as it is "
                    "(whatever on_conflict says): delete it or declare it with the binding's arguments",
                ) from None
            raise conflict from None
        self._warn_use_existing(spec, conflict)
        if channel is not None:
            return channel  # the probe's last declaration matched the existing queue
        # The 406 closed the channel: confirm the entity exists on a fresh one.
        channel = connection.channel()
        with map_exceptions(must_exist=True):
            if isinstance(spec, ExchangeSpec):
                channel.exchange_declare(spec.name, spec.type, passive=True)
            else:
                channel.queue_declare(spec.name, passive=True)
        return channel

    def _log(self, conflict: TopologyConflictError) -> Callable[..., None]:
        """``logger.warning`` the first time ``conflict`` is found, ``logger.debug`` when found again.

        A re-declaration after a reconnect (:meth:`redeclare`) or a :meth:`forget` finds the same
        conflict again: it was logged already, and a different one is logged anew.
        """
        text = str(conflict)
        if self._warned.get(conflict.entity) == text:
            return logger.debug
        self._warned[conflict.entity] = text
        return logger.warning

    def _warn_use_existing(self, spec: ExchangeSpec | QueueSpec, conflict: TopologyConflictError) -> None:
        """Log that ``spec`` is used as it exists; for the cascade once, naming it as a whole."""
        lost = _lost_guarantees(spec, conflict)
        if isinstance(spec, QueueSpec) and spec.name in self._cascade_queues:
            if self._cascade_warned:
                logger.debug("%s; using the existing scheduling level as it is", conflict)
                return
            self._cascade_warned = True
            (logger.warning if lost else logger.info)(
                "%s; the scheduling cascade (%d level queues, shared by every job queue of this prefix) "
                "exists with other arguments and is used as it is%s",
                conflict,
                len(self._cascade_queues),
                f": {lost}" if lost else "",
            )
            return
        self._log(conflict)(
            "%s; using the existing entity as it is (never re-declared with other arguments)%s",
            conflict,
            f": {lost}" if lost else "",
        )


def _lost_guarantees(spec: ExchangeSpec | QueueSpec, conflict: TopologyConflictError) -> str:
    """What a quorum deployment loses by using ``spec`` as it exists ('' when nothing)."""
    if not isinstance(spec, QueueSpec) or spec.argument_dict.get("x-queue-type") != "quorum":
        return ""
    differing = {d.argument for d in conflict.differences}
    lost = []
    if "x-queue-type" in differing:
        lost.append("it is not a quorum queue, so it is not replicated and a node loss takes its messages")
    if DEAD_LETTER_ARGUMENTS & set(spec.argument_dict) and differing & {"x-queue-type", "x-dead-letter-strategy"}:
        lost.append(
            "its dead-lettering (which carries retries, scheduled jobs and failed jobs on) is at-most-once, "
            "not x-dead-letter-strategy=at-least-once: a message it dead-letters while its target is unavailable "
            "is dropped"
        )
    return "; ".join(lost)


__all__ = [
    "DEAD_LETTER_ARGUMENTS",
    "ON_CONFLICT_CHOICES",
    "BindingSpec",
    "ExchangeSpec",
    "OnConflict",
    "QueueOptions",
    "QueueSpec",
    "Topology",
    "check_arguments",
    "existing_value",
    "parse_invalid_argument",
    "parse_precondition_failed",
]
