"""The binding's AMQP entities as data: queue options and declaration specs (binding §4, §7.2).

Pure descriptions; :mod:`ojs_kombu.amqp.topology` declares them on a connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ojs_kombu.errors import ValidationError

Overflow = Literal["drop-head", "reject-publish", "reject-publish-dlx"]
QueueType = Literal["classic", "quorum"]


@dataclass(frozen=True)
class QueueOptions:
    """Optional job queue arguments (binding §7.2).  Unset options are not sent.

    ``max_priority`` enables AMQP priorities (OJS priority clamped to 0..9 is
    sent as the message priority, DESIGN §8); ``queue_type="quorum"`` is the
    durable choice on a cluster (AMQP-032).
    """

    max_priority: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: Overflow | None = None
    message_ttl: int | None = None
    queue_type: QueueType | None = None

    def __post_init__(self) -> None:
        for name in ("max_priority", "max_length", "max_length_bytes", "message_ttl"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValidationError(f"{name} must be a non-negative integer, got {value!r}", field=name)
        if self.max_priority is not None and not 1 <= self.max_priority <= 255:
            raise ValidationError("max_priority must be between 1 and 255 (10 is the OJS choice)", field="max_priority")
        if self.overflow not in (None, "drop-head", "reject-publish", "reject-publish-dlx"):
            raise ValidationError(f"unknown overflow behaviour {self.overflow!r}", field="overflow")
        if self.queue_type not in (None, "classic", "quorum"):
            raise ValidationError(f"unknown queue type {self.queue_type!r}", field="queue_type")
        if self.queue_type == "quorum" and self.max_priority is not None:
            raise ValidationError("quorum queues do not support x-max-priority on RabbitMQ 3.x", field="max_priority")

    def arguments(self) -> dict[str, Any]:
        """The ``x-*`` queue arguments these options stand for."""
        args: dict[str, Any] = {}
        for key, value in (
            ("x-max-priority", self.max_priority),
            ("x-max-length", self.max_length),
            ("x-max-length-bytes", self.max_length_bytes),
            ("x-overflow", self.overflow),
            ("x-message-ttl", self.message_ttl),
            ("x-queue-type", self.queue_type),
        ):
            if value is not None:
                args[key] = value
        return args


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
    "BindingSpec",
    "ExchangeSpec",
    "Overflow",
    "QueueOptions",
    "QueueSpec",
    "QueueType",
    "Spec",
    "frozen_arguments",
]
