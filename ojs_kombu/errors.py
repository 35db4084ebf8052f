"""One exception hierarchy for everything ``ojs_kombu`` raises.

Every error the library raises derives from :class:`OjsError`, so callers can
catch the whole family with one ``except``.  The tree::

    OjsError
    ├── ValidationError          bad argument / envelope (also a ValueError)
    │   └── DecodeError          a received message is not a usable OJS job
    ├── TopologyError            declaring exchanges / queues failed
    │   └── TopologyConflictError  406 PRECONDITION_FAILED: inequivalent arguments
    ├── PublishError             a job was not accepted by the broker
    │   ├── UnroutableError      Basic.Return: no queue bound for the routing key
    │   ├── PublishNackedError   the broker answered Basic.Nack to our publish
    │   └── PublishTimeoutError  no confirm arrived in time (outcome unknown)
    └── BrokerConnectionError    the broker could not be reached after all retries

Handler outcomes (:class:`Discard`, :class:`DeadLetter`) are exceptions a job
handler raises on purpose; they are not errors of the library and therefore do
not derive from :class:`OjsError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class OjsError(Exception):
    """Base class of every error raised by ``ojs_kombu``."""


class ValidationError(OjsError, ValueError):
    """An argument or envelope does not satisfy the Open Job Spec.

    ``field`` names the offending field (dotted path, e.g. ``"args[2].when"``)
    when one can be named; ``errors`` lists every problem found, each as
    ``{"field": ..., "message": ...}``.
    """

    def __init__(self, message: str, *, field: str | None = None, errors: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.field = field
        self.errors = errors if errors is not None else [{"field": field, "message": message}]


class DecodeError(ValidationError):
    """A delivered message cannot be turned into an OJS job.

    ``code`` is the OJS error code written to ``x-ojs-error-code`` when the
    message is dead-lettered (e.g. ``"invalid_envelope"``, ``"decode_error"``).
    """

    def __init__(self, message: str, *, code: str = "invalid_envelope", field: str | None = None):
        super().__init__(message, field=field)
        self.code = code


class TopologyError(OjsError):
    """Declaring an exchange, queue or binding failed."""


@dataclass(frozen=True)
class ArgumentDifference:
    """One queue/exchange argument the broker reports as inequivalent."""

    argument: str
    requested: str
    existing: str


class TopologyConflictError(TopologyError):
    """The broker refused a declaration with 406 PRECONDITION_FAILED.

    An entity of that name already exists with other arguments.  ``differences``
    names them (as reported by the broker); ``entity`` is the AMQP name.
    """

    def __init__(self, entity: str, differences: list[ArgumentDifference], reply_text: str):
        names = (
            ", ".join(f"{d.argument} (requested {d.requested}, existing {d.existing})" for d in differences)
            or reply_text
        )
        super().__init__(f"{entity!r} already exists with different arguments: {names}")
        self.entity = entity
        self.differences = differences
        self.reply_text = reply_text


class PublishError(OjsError):
    """A job was not accepted by the broker.  ``job_id`` names the job."""

    def __init__(self, message: str, *, job_id: str | None = None):
        super().__init__(message)
        self.job_id = job_id


class UnroutableError(PublishError):
    """The broker returned the message (``Basic.Return``): no queue is bound for it."""

    def __init__(
        self,
        message: str,
        *,
        job_id: str | None = None,
        reply_code: int = 312,
        exchange: str = "",
        routing_key: str = "",
    ):
        super().__init__(message, job_id=job_id)
        self.reply_code = reply_code
        self.exchange = exchange
        self.routing_key = routing_key


class PublishNackedError(PublishError):
    """The broker answered ``Basic.Nack``: it did not take responsibility for the job
    (e.g. ``x-overflow=reject-publish`` on a full queue)."""


class PublishTimeoutError(PublishError):
    """No publisher confirm arrived in time.  The job may or may not be queued."""


class BrokerConnectionError(OjsError, ConnectionError):
    """The broker could not be reached, even after the reconnect back-off."""


class Discard(Exception):
    """Raise from a handler to drop the job: acknowledged, not retried, not dead-lettered."""


class DeadLetter(Exception):
    """Raise from a handler to send the job to its dead letter queue at once."""


__all__ = [
    "ArgumentDifference",
    "BrokerConnectionError",
    "DeadLetter",
    "DecodeError",
    "Discard",
    "OjsError",
    "PublishError",
    "PublishNackedError",
    "PublishTimeoutError",
    "TopologyConflictError",
    "TopologyError",
    "UnroutableError",
    "ValidationError",
]
