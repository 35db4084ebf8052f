"""The binding's AMQP entities as data: queue options and declaration specs (binding §4, §7.2).

Pure descriptions; :mod:`ojs_kombu.amqp.topology` declares them on a connection.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from ojs_kombu.errors import ValidationError

Overflow = Literal["drop-head", "reject-publish", "reject-publish-dlx"]
QueueType = Literal["classic", "quorum"]

#: The arguments of every quorum queue the binding declares (DESIGN §16): dead-lettering
#: (which carries retries, scheduled jobs and terminal failures) is at-least-once, which
#: RabbitMQ allows only with ``x-overflow=reject-publish``.
QUORUM_ARGUMENTS: dict[str, Any] = {
    "x-queue-type": "quorum",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
}
#: ``x-delivery-limit`` of a quorum job queue unless ``delivery_limit`` says otherwise: RabbitMQ
#: 4.x's default, set explicitly so that 3.x (unlimited by default) behaves the same.
DEFAULT_DELIVERY_LIMIT = 20
#: ``x-delivery-limit`` of a quorum dead letter queue: in effect none.  A dead letter has nowhere
#: further to go, and browsing a DLQ (``Client.dead_letters``: ``Basic.Get``, then the channel
#: closes) returns its letters; on RabbitMQ 4.x the default limit of 20 would drop them.  (-1,
#: "unlimited" on 4.x, drops a message at its first return on 3.x.)
DEAD_LETTER_DELIVERY_LIMIT = 2**31 - 1


#: The type of a queue declared without ``x-queue-type`` (a virtual host's ``default_queue_type``,
#: RabbitMQ 3.13+, may say otherwise).
DEFAULT_QUEUE_TYPE = "classic"

#: Milliseconds in each unit of a RabbitMQ duration (``x-max-age``): as ``rabbit_amqqueue:check_max_age``
#: counts them (a month is 30 days, a year 365).
DURATION_UNITS_MS = {
    "Y": 365 * 86_400_000,
    "M": 30 * 86_400_000,
    "D": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
}
_DURATION = re.compile(r"(?P<value>[0-9]+)(?P<unit>[YMDhms]?)")
#: Queue arguments whose value is a duration string (``"7D"``, ``"2h"``).
DURATION_ARGUMENTS = frozenset({"x-max-age"})


def duration_ms(text: str) -> int | None:
    """The milliseconds of a RabbitMQ duration.

    Parameters:
        text: a number and a unit of :data:`DURATION_UNITS_MS` (``"2h"``), or digits alone, read as
            milliseconds: how RabbitMQ 4.3 shows an ``x-max-age`` in a 406 reply (``'7200000'``).

    Returns:
        The milliseconds, or ``None`` when ``text`` is not a duration.
    """
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        return None
    return int(match["value"]) * DURATION_UNITS_MS.get(match["unit"], 1)


def normalise_argument(name: str, value: Any) -> Any:
    """One form for the value of queue argument ``name``, so that values that mean the same compare equal.

    RabbitMQ compares arguments literally up to 4.2 (``x-max-age`` ``"2h"`` and ``"120m"`` are
    inequivalent) and 4.3 compares durations in milliseconds; an integer's AMQP type (``signedint``,
    ``long``) never matters to it.  Every comparison of arguments in the library and its tests goes
    through this function (and :func:`normalise_arguments`), so the answer is the same on every version.

    Parameters:
        name: the argument (``x-max-age`` ...).
        value: its value as declared, listed by the management API or read from a 406 reply.

    Returns:
        A duration argument in milliseconds (an ``int``; a value that is not a duration as it is), an
        integer as a plain ``int``, anything else unchanged.
    """
    if name in DURATION_ARGUMENTS and isinstance(value, str):
        ms = duration_ms(value)
        return value if ms is None else ms
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return value


def normalise_arguments(arguments: Mapping[str, Any] | None, *, queue_type: str | None = None) -> dict[str, Any]:
    """The arguments of a queue in one form: see :func:`normalise_argument`, plus its type.

    A queue declared without ``x-queue-type`` gets the default type; RabbitMQ 4.x lists a classic
    queue's arguments with ``x-queue-type: classic`` and 3.x without, and both are the same queue.

    Parameters:
        arguments: declared, listed by the management API, or ``None``.
        queue_type: the queue's type when ``arguments`` may not say it (the management API's
            ``type``); default :data:`DEFAULT_QUEUE_TYPE`.

    Returns:
        A new dict whose ``x-queue-type`` is always set.
    """
    normal = {name: normalise_argument(name, value) for name, value in (arguments or {}).items()}
    normal.setdefault("x-queue-type", queue_type or DEFAULT_QUEUE_TYPE)
    return normal


def queue_type_arguments(queue_type: QueueType | None) -> dict[str, Any]:
    """The arguments a queue of ``queue_type`` is declared with besides its own.

    Parameters:
        queue_type: ``"quorum"``, ``"classic"`` or ``None`` (the broker's default type).

    Returns:
        :data:`QUORUM_ARGUMENTS` for quorum, ``{"x-queue-type": "classic"}`` for an explicit
        classic queue, else nothing.
    """
    if queue_type == "quorum":
        return dict(QUORUM_ARGUMENTS)
    return {"x-queue-type": queue_type} if queue_type else {}


@dataclass(frozen=True)
class QueueOptions:
    """Optional job queue arguments (binding §7.2).  Unset options are not sent.

    ``max_priority`` enables AMQP priorities (OJS priority clamped to 0..9 is
    sent as the message priority, DESIGN §8); ``queue_type="quorum"`` is the
    durable choice on a cluster (AMQP-032): the job queue, and with it its dead
    letter queue, retry queues and the scheduling cascade, are declared with
    :data:`QUORUM_ARGUMENTS` (``docs/cluster.md``).  A quorum job queue also gets
    ``x-delivery-limit`` (``delivery_limit``, default :data:`DEFAULT_DELIVERY_LIMIT`):
    a message returned to it that many times (a consumer's channel or connection
    lost while holding it, a ``Basic.Reject(requeue=True)``; on RabbitMQ 4.3 not a
    ``Basic.Nack(requeue=True)``, see ``docs/cluster.md``) is dead-lettered into its DLQ.
    ``consumer_timeout`` (milliseconds, ``x-consumer-timeout``, RabbitMQ ≥ 3.12; older
    brokers accept and ignore it) must exceed the longest job a worker holds unacked:
    past it the broker takes the delivery back (``docs/rabbitmq-4.md``).  RabbitMQ 4.3
    has no consumer timeout for classic queues and refuses the argument on them: declaring
    such a queue raises :class:`~ojs_kombu.errors.QueueArgumentRefusedError`.
    ``consumer_disconnected_timeout`` (milliseconds, ``x-consumer-disconnected-timeout``,
    quorum queues, RabbitMQ ≥ 4.3; older brokers accept and ignore it): how long the queue
    keeps the deliveries of a consumer whose node became unreachable (a node crash, a
    partition) before it delivers them again elsewhere; RabbitMQ's default is 60 s, during
    which those jobs wait (``docs/cluster.md``, Failover).  Shorter means sooner, and on a
    partition that heals, more duplicates.
    ``delay_queue_type`` is the type of the queues a job waits in, the retry queues and
    the levels of the scheduling cascade (:attr:`delay_type`): ``"quorum"`` by default,
    whatever the job queue's type, because every hop there is a dead-lettering and a
    classic queue dead-letters at most once (a RabbitMQ 4.3 node killed and restarted lost
    287–736 of 1,000 scheduled jobs; quorum hops with ``x-dead-letter-strategy=at-least-once``
    lost none, ``docs/reliability.md``).  ``None``: the job queue's own type, as before
    (``docs/cluster.md``, *Mixed set-ups*, for existing classic cascades).

    Raises:
        ValidationError: a negative or non-integer size, an unknown ``overflow`` or
            ``queue_type``; with ``queue_type="quorum"``: ``max_priority`` (refused by
            RabbitMQ 3.x), an ``overflow`` other than ``"reject-publish"`` (``drop-head``
            would turn at-least-once dead-lettering off, ``reject-publish-dlx`` is not
            supported), ``delay_queue_type="classic"`` (its hops would be at-most-once);
            ``delivery_limit`` or ``consumer_disconnected_timeout`` on a queue that is not quorum.
    """

    max_priority: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: Overflow | None = None
    message_ttl: int | None = None
    queue_type: QueueType | None = None
    delivery_limit: int | None = None
    consumer_timeout: int | None = None
    consumer_disconnected_timeout: int | None = None
    delay_queue_type: QueueType | None = "quorum"

    def __post_init__(self) -> None:
        for name in (
            "max_priority",
            "max_length",
            "max_length_bytes",
            "message_ttl",
            "delivery_limit",
            "consumer_timeout",
            "consumer_disconnected_timeout",
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValidationError(f"{name} must be a non-negative integer, got {value!r}", field=name)
        if self.max_priority is not None and not 1 <= self.max_priority <= 255:
            raise ValidationError("max_priority must be between 1 and 255 (10 is the OJS choice)", field="max_priority")
        if self.overflow not in (None, "drop-head", "reject-publish", "reject-publish-dlx"):
            raise ValidationError(f"unknown overflow behaviour {self.overflow!r}", field="overflow")
        if self.queue_type not in (None, "classic", "quorum"):
            raise ValidationError(f"unknown queue type {self.queue_type!r}", field="queue_type")
        if self.delay_queue_type not in (None, "classic", "quorum"):
            raise ValidationError(f"unknown queue type {self.delay_queue_type!r}", field="delay_queue_type")
        if self.queue_type == "quorum" and self.delay_queue_type == "classic":
            raise ValidationError(
                "delay_queue_type='classic' with a quorum job queue: the retry and scheduling hops would be "
                "at-most-once and unreplicated",
                field="delay_queue_type",
            )
        if self.queue_type == "quorum" and self.max_priority is not None:
            raise ValidationError("quorum queues do not support x-max-priority on RabbitMQ 3.x", field="max_priority")
        if self.queue_type == "quorum" and self.overflow not in (None, "reject-publish"):
            raise ValidationError(
                f"overflow={self.overflow!r} on a quorum queue: only 'reject-publish' keeps the at-least-once "
                "dead-lettering that carries retries, scheduled jobs and dead letters",
                field="overflow",
            )
        if self.delivery_limit is not None and self.queue_type != "quorum":
            raise ValidationError("delivery_limit applies to quorum queues only", field="delivery_limit")
        if self.consumer_disconnected_timeout is not None and self.queue_type != "quorum":
            raise ValidationError(
                "consumer_disconnected_timeout applies to quorum queues only", field="consumer_disconnected_timeout"
            )

    def with_queue_type(self, queue_type: QueueType | None) -> QueueOptions:
        """These options with ``queue_type`` (``None``: unchanged).

        Raises:
            ValidationError: the options do not fit that queue type (see the class).
        """
        return self if queue_type is None else replace(self, queue_type=queue_type)

    @property
    def delay_type(self) -> QueueType | None:
        """The type of the retry queues and scheduling cascade levels: ``delay_queue_type``, or the
        job queue's type when that is quorum or ``delay_queue_type`` is ``None`` (``None``: the
        broker's default type, declared without ``x-queue-type``)."""
        if self.queue_type == "quorum" or self.delay_queue_type is None:
            return self.queue_type
        return self.delay_queue_type

    def arguments(self) -> dict[str, Any]:
        """The ``x-*`` queue arguments of the job queue these options stand for."""
        args: dict[str, Any] = {}
        for key, value in (
            ("x-max-priority", self.max_priority),
            ("x-max-length", self.max_length),
            ("x-max-length-bytes", self.max_length_bytes),
            ("x-overflow", self.overflow),
            ("x-message-ttl", self.message_ttl),
            ("x-consumer-timeout", self.consumer_timeout),
            ("x-consumer-disconnected-timeout", self.consumer_disconnected_timeout),
        ):
            if value is not None:
                args[key] = value
        args.update(queue_type_arguments(self.queue_type))
        if self.queue_type == "quorum":
            args["x-delivery-limit"] = DEFAULT_DELIVERY_LIMIT if self.delivery_limit is None else self.delivery_limit
        return args


def stream_arguments(max_age: str, max_length_bytes: int, max_segment_size_bytes: int) -> dict[str, Any]:
    """The arguments of a stream bounded by age and size (the control, events and completed-ids streams).

    Parameters:
        max_age: ``x-max-age`` (RabbitMQ units ``Y M D h m s``).
        max_length_bytes: ``x-max-length-bytes``.
        max_segment_size_bytes: ``x-stream-max-segment-size-bytes`` (a stream is trimmed by whole segments).

    Returns:
        The ``Queue.Declare`` arguments, ``x-queue-type`` ``stream`` included.
    """
    return {
        "x-queue-type": "stream",
        "x-max-age": max_age,
        "x-max-length-bytes": max_length_bytes,
        "x-stream-max-segment-size-bytes": max_segment_size_bytes,
    }


def frozen_arguments(arguments: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((arguments or {}).items()))


@dataclass(frozen=True)
class ExchangeSpec:
    """A durable exchange to declare, with its arguments (e.g. ``alternate-exchange``)."""

    name: str
    type: str = "direct"
    arguments: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class QueueSpec:
    """A durable, non-exclusive, non-auto-delete queue to declare, with its arguments."""

    name: str
    arguments: tuple[tuple[str, Any], ...] = ()

    @property
    def argument_dict(self) -> dict[str, Any]:
        """The arguments as a dict."""
        return dict(self.arguments)


@dataclass(frozen=True)
class BindingSpec:
    """A binding of ``destination`` (a queue, or an exchange if ``to_exchange``) to ``exchange``."""

    destination: str
    exchange: str
    routing_key: str
    to_exchange: bool = False


Spec = ExchangeSpec | QueueSpec | BindingSpec


__all__ = [
    "DEAD_LETTER_DELIVERY_LIMIT",
    "DEFAULT_DELIVERY_LIMIT",
    "DEFAULT_QUEUE_TYPE",
    "DURATION_ARGUMENTS",
    "DURATION_UNITS_MS",
    "QUORUM_ARGUMENTS",
    "BindingSpec",
    "ExchangeSpec",
    "Overflow",
    "QueueOptions",
    "QueueSpec",
    "QueueType",
    "Spec",
    "duration_ms",
    "frozen_arguments",
    "normalise_argument",
    "normalise_arguments",
    "queue_type_arguments",
]
