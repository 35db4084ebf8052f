"""Declaring the binding's exchanges, queues and bindings (binding §4, §7; DESIGN §4).

:class:`Topology` knows which entities a job queue needs (the direct and dead
letter exchanges, ``ojs.queue.{q}`` with its dead-letter arguments, the dead
letter queue ``ojs.queue.dlx.{q}`` and both bindings), declares them eagerly
(:meth:`Topology.declare_queue`) or lazily on first use
(:meth:`Topology.ensure_queue`), remembers everything it declared, and
re-declares it in order after a reconnect (:meth:`Topology.redeclare`).

A queue that already exists with other arguments makes RabbitMQ answer
``406 PRECONDITION_FAILED`` and close the channel.  The binding says never to
re-declare with other arguments, so the topology records a
:class:`~ojs_kombu.errors.TopologyConflictError` naming the differing
arguments, logs it, checks the queue exists with a passive declare on a fresh
channel and uses it as it is (``on_conflict="use-existing"``, the default), or
raises (``on_conflict="raise"``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from typing import Any, Literal

from amqp.exceptions import PreconditionFailed

from ojs_kombu.errors import ArgumentDifference, TopologyConflictError, TopologyError, ValidationError
from ojs_kombu.model.naming import Names, validate_queue_name
from ojs_kombu.wire.entities import BindingSpec, ExchangeSpec, QueueOptions, QueueSpec, Spec, frozen_arguments

logger = logging.getLogger(__name__)

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<arg>[^']+)' for (?:queue|exchange) '(?P<name>[^']+)' in vhost '[^']*': "
    r"received (?P<requested>.+?) but current is (?P<existing>.+)$"
)


def parse_precondition_failed(entity: str, reply_text: str) -> TopologyConflictError:
    """Turn RabbitMQ's 406 reply text into a TopologyConflictError naming the differing argument."""
    differences = []
    match = _INEQUIVALENT.search(reply_text or "")
    if match:
        differences.append(ArgumentDifference(match["arg"], match["requested"], match["existing"]))
    return TopologyConflictError(entity, differences, reply_text or "")


class Topology:
    """Declares and remembers the OJS entities of one deployment (one prefix).

    ``queue_options`` apply to every job queue; ``per_queue`` overrides them for
    named queues.  Thread-safe: declarations are serialised by a lock.
    """

    def __init__(
        self,
        names: Names | None = None,
        *,
        queue_options: QueueOptions | None = None,
        per_queue: dict[str, QueueOptions] | None = None,
        on_conflict: Literal["use-existing", "raise"] = "use-existing",
    ):
        if on_conflict not in ("use-existing", "raise"):
            raise ValidationError(
                f"on_conflict must be 'use-existing' or 'raise', got {on_conflict!r}", field="on_conflict"
            )
        self.names = names or Names()
        self.queue_options = queue_options or QueueOptions()
        self.per_queue = dict(per_queue or {})
        self.on_conflict = on_conflict
        self.conflicts: list[TopologyConflictError] = []
        self._declared: dict[Spec, None] = {}  # insertion-ordered set
        self._lock = threading.RLock()

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
        """Arguments of ``ojs.queue.dlx.{queue}``: only the queue type, so a quorum deployment stays quorum."""
        queue_type = self.options_for(queue).queue_type
        return {"x-queue-type": queue_type} if queue_type else {}

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
        ]

    def retry_queue_specs(self, queue: str, delay_ms: int) -> list[Spec]:
        """A retry delay queue with exactly the arguments of binding §8.2, and its binding."""
        validate_queue_name(queue)
        n = self.names
        name = n.retry_queue(queue, delay_ms)
        args = {
            "x-dead-letter-exchange": n.direct_exchange,
            "x-dead-letter-routing-key": queue,
            "x-message-ttl": int(delay_ms),
        }
        return [
            *self.base_specs(),
            QueueSpec(name, frozen_arguments(args)),
            BindingSpec(name, n.retry_exchange, n.retry_routing_key(queue, delay_ms)),
        ]

    # -- declaring -----------------------------------------------------------------------------

    def declare_queue(self, connection, queue: str) -> None:
        """Eagerly declare ``queue`` (job queue, DLQ, exchanges, bindings), even if cached."""
        self.declare(connection, self.queue_specs(queue), force=True)

    def ensure_queue(self, connection, queue: str) -> None:
        """Lazily declare ``queue``: only what this topology has not declared yet."""
        self.declare(connection, self.queue_specs(queue))

    def ensure_retry_queue(self, connection, queue: str, delay_ms: int) -> None:
        """Lazily declare the retry queue ``ojs.queue.retry.{queue}.{delay_ms}``."""
        self.declare(connection, self.retry_queue_specs(queue, delay_ms))

    def ensure_scheduling(self, connection, queue: str, cascade) -> None:
        """Lazily declare ``queue``, the scheduling cascade (a
        :class:`~ojs_kombu.policy.schedule.Cascade`) and the binding that delivers
        scheduled jobs into ``ojs.queue.{queue}``."""
        self.declare(connection, [*self.queue_specs(queue), *cascade.specs(), cascade.queue_binding(queue)])

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

    def delete_declared(self, connection) -> int:
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
            _close_quietly(channel)
        return sum(not isinstance(s, BindingSpec) for s in specs)

    def redeclare(self, connection) -> None:
        """Re-declare everything declared so far: exchanges, then queues, then bindings."""
        with self._lock:
            specs = list(self._declared)
            ordered = (
                [s for s in specs if isinstance(s, ExchangeSpec)]
                + [s for s in specs if isinstance(s, QueueSpec)]
                + [s for s in specs if isinstance(s, BindingSpec)]
            )
            self.declare(connection, ordered, force=True)

    def declare(self, connection, specs: Iterable[Spec], *, force: bool = False) -> None:
        """Declare ``specs`` in order on a channel of ``connection`` (a py-amqp/kombu connection)."""
        with self._lock:
            todo = [s for s in specs if force or s not in self._declared]
            if not todo:
                return
            channel = connection.channel()
            try:
                for spec in todo:
                    channel = self._declare_one(connection, channel, spec)
                    self._declared[spec] = None
            finally:
                _close_quietly(channel)

    def _declare_one(self, connection, channel, spec: Spec):
        if isinstance(spec, BindingSpec):
            if spec.to_exchange:
                channel.exchange_bind(destination=spec.destination, source=spec.exchange, routing_key=spec.routing_key)
            else:
                channel.queue_bind(queue=spec.destination, exchange=spec.exchange, routing_key=spec.routing_key)
            return channel
        try:
            if isinstance(spec, ExchangeSpec):
                channel.exchange_declare(
                    spec.name, spec.type, durable=True, auto_delete=False, arguments=dict(spec.arguments) or None
                )
            else:
                channel.queue_declare(
                    spec.name, durable=True, exclusive=False, auto_delete=False, arguments=spec.argument_dict or None
                )
            return channel
        except PreconditionFailed as exc:
            conflict = parse_precondition_failed(spec.name, getattr(exc, "reply_text", str(exc)))
            self.conflicts.append(conflict)
            if self.on_conflict == "raise":
                raise conflict from None
            logger.warning("%s; using the existing entity as it is (never re-declared with other arguments)", conflict)
            # The 406 closed the channel: confirm the entity exists on a fresh one.
            channel = connection.channel()
            try:
                if isinstance(spec, ExchangeSpec):
                    channel.exchange_declare(spec.name, spec.type, passive=True)
                else:
                    channel.queue_declare(spec.name, passive=True)
            except Exception as passive_exc:
                raise TopologyError(f"{spec.name!r} could not be declared nor found: {passive_exc}") from passive_exc
            return channel


def _close_quietly(channel) -> None:
    try:
        channel.close()
    except Exception:  # noqa: BLE001 - the channel may already be closed by the broker
        pass


__all__ = [
    "BindingSpec",
    "ExchangeSpec",
    "QueueOptions",
    "QueueSpec",
    "Topology",
    "parse_precondition_failed",
]
