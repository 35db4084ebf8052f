"""One exception hierarchy for everything ``ojs_kombu`` raises.

Every error the library raises derives from :class:`OjsError`, so callers can
catch the whole family with one ``except``.  The tree::

    OjsError
    ├── ValidationError          bad argument / envelope (also a ValueError)
    │   ├── DecodeError          a received message is not a usable OJS job
    │   ├── InvalidWorkflowError  a workflow definition breaks the workflows spec
    │   └── ResultTooLargeError  a result over what a workflow carries (workflows spec §7.5)
    ├── TopologyError            declaring exchanges / queues failed
    │   ├── TopologyConflictError  406 PRECONDITION_FAILED: inequivalent arguments
    │   └── QueueArgumentRefusedError  (also a BrokerRefusedError) an argument the broker does not accept
    ├── PublishError             a job was not accepted by the broker
    │   ├── UnroutableError      Basic.Return: no queue bound for the routing key
    │   ├── PublishNackedError   the broker answered Basic.Nack to our publish
    │   └── PublishTimeoutError  no confirm arrived in time (outcome unknown)
    ├── WorkflowStateError       a workflow state transition the workflows spec does not list
    ├── DuplicateJobError        a unique job's key is held by another job (on_conflict="reject")
    ├── BrokerConnectionError    the broker could not be reached within the retry budget
    │   └── TlsVerificationError  (also a BrokerRefusedError) the TLS certificate failed verification
    ├── BrokerRefusedError       the broker refused for good: retrying cannot help
    │   ├── QueueArgumentRefusedError  406 invalid arg (see TopologyError)
    │   ├── AccessRefusedError   403 ACCESS_REFUSED, 530 NOT_ALLOWED: credentials, vhost, permissions
    │   └── NotFoundError        404 NOT_FOUND: an entity that must exist does not
    ├── WorkerError              a Worker stopped on its own (its consumer died); the cause is chained
    └── ManagementError          a management HTTP API request failed (also a RuntimeError)

py-amqp and kombu exceptions are turned into these in one place,
:mod:`ojs_kombu.amqp.errors` (``map_exceptions``, ``is_permanent``).  Transient
failures (a dropped connection, a refused TCP connect) are retried with the
back-off of DESIGN §9 before they become :class:`BrokerConnectionError`; a
:class:`BrokerRefusedError` is raised at once and never retried.

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
    ``{"field": ..., "message": ...}``.  ``code`` is the OJS error code, ``invalid_request``
    (a subclass may name a narrower one).
    """

    code: str = "invalid_request"

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
    names them (as reported by the broker); ``entity`` is the AMQP name; ``hint``,
    when given, ends the message (what to do about it).
    """

    def __init__(self, entity: str, differences: list[ArgumentDifference], reply_text: str, *, hint: str = ""):
        names = (
            ", ".join(f"{d.argument} (requested {d.requested}, existing {d.existing})" for d in differences)
            or reply_text
        )
        super().__init__(f"{entity!r} already exists with different arguments: {names}" + (f"; {hint}" if hint else ""))
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


class DuplicateJobError(OjsError):
    """A unique job was refused: another job holds its uniqueness key (``on_conflict="reject"``).

    Attributes:
        existing_id: the id of the job holding the key, or None when it could not be read
            (the holder's record expired or was released in the meantime).
        key: the uniqueness key (SHA-256 hex of the job's chosen dimensions).  Derived from
            the job's arguments: log it at DEBUG at most (unique-jobs spec §12).
        code: the OJS error code, ``duplicate`` (unique-jobs spec §5.1).
    """

    code = "duplicate"

    def __init__(self, message: str, *, existing_id: str | None, key: str):
        super().__init__(message)
        self.existing_id = existing_id
        self.key = key


class BrokerConnectionError(OjsError, ConnectionError):
    """The broker could not be reached, even after the reconnect back-off."""


class BrokerRefusedError(OjsError):
    """The broker refused an operation for good: the same request would be refused again.

    Attributes:
        reply_code: the AMQP reply code (403, 404, 530 ...), or 0 when unknown.
        reply_text: the broker's reply text (it never contains a password).
        method: the AMQP method refused (``"Connection.open"``, ``"Queue.declare"`` ...), or ``""``.
    """

    def __init__(self, message: str, *, reply_code: int = 0, reply_text: str = "", method: str = ""):
        super().__init__(message)
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.method = method


class AccessRefusedError(BrokerRefusedError):
    """Login or access refused: wrong credentials (403), a virtual host that does not exist or that
    the user may not use (530 NOT_ALLOWED), or a resource the user has no permission for (403)."""


class TlsVerificationError(BrokerConnectionError, BrokerRefusedError):
    """The broker's TLS certificate failed verification: a CA not trusted, or a host name it
    does not carry.  A :class:`BrokerConnectionError` (nothing was reached) that is also
    permanent (a :class:`BrokerRefusedError`): the Client raises it at once and a Worker
    stops with it, as for a wrong password, instead of retrying a handshake that fails the
    same way each time."""


class QueueArgumentRefusedError(TopologyError, BrokerRefusedError):
    """The broker does not accept a queue argument for that type of queue (406 ``invalid arg``).

    Raised when the broker refuses the declaration, and before it is sent when the broker's
    version is known to refuse it (``reply_code`` is then 0): for example ``x-consumer-timeout``
    (``QueueOptions.consumer_timeout``) on a classic queue of RabbitMQ 4.3.  Permanent: the same
    declaration is refused again, so a Worker stops with it rather than reconnecting.

    Attributes:
        entity: the queue's AMQP name.
        argument: the argument refused (``"x-consumer-timeout"``).
        queue_type: the type of queue it was refused for (``"classic"``), or ``""`` when not said.
        broker_version: the broker's version (``"4.3.6"``), or ``""`` when unknown.
    """

    def __init__(
        self,
        message: str,
        *,
        entity: str,
        argument: str,
        queue_type: str = "",
        broker_version: str = "",
        reply_code: int = 0,
        reply_text: str = "",
    ):
        super().__init__(message, reply_code=reply_code, reply_text=reply_text, method="Queue.declare")
        self.entity = entity
        self.argument = argument
        self.queue_type = queue_type
        self.broker_version = broker_version


class NotFoundError(BrokerRefusedError):
    """404 NOT_FOUND where the entity must already exist (a passive declare, a dead letter queue to read)."""


class QueueUnavailableError(BrokerRefusedError):
    """A queue the broker has declared but cannot serve, for longer than a member takes to recover.

    A stream or quorum queue declared a few seconds before its node was killed can come back
    without its member (RabbitMQ had not written down that the member exists): the queue is
    listed, but every ``Basic.Consume`` on it closes the connection with 541 INTERNAL_ERROR and
    every publish to a stream with 506 "Stream not found".  Nothing a client retries cures it;
    deleting the queue and declaring it again does (its messages are lost already).  A queue
    that lost its quorum because cluster nodes are down fails the same way: start them instead.  A Worker
    stops with it (``WorkerError.__cause__``) instead of reconnecting for ever; its presence
    beacon (the events stream) logs it and stops publishing.

    Attributes:
        entity: the queue's AMQP name.
        seconds: how long it was failing when the error was raised.
    """

    def __init__(self, message: str, *, entity: str, seconds: float, reply_code: int = 0, reply_text: str = ""):
        super().__init__(message, reply_code=reply_code, reply_text=reply_text)
        self.entity = entity
        self.seconds = seconds


class Discard(Exception):
    """Raise from a handler to drop the job: acknowledged, not retried, not dead-lettered."""


class DeadLetter(Exception):
    """Raise from a handler to send the job to its dead letter queue at once."""


class BatchItemFailed(Exception):
    """Raised by a batch handler (:meth:`Worker.batch_handler <ojs_kombu.runtime.worker.Worker.batch_handler>`):
    the job at ``index`` of the batch failed with ``exc``; the others succeeded.

    Parameters:
        index: the failed job's position in the list the handler received.
        exc: its failure (its type and message are recorded; its retry policy decides).
    """

    def __init__(self, index: int, exc: BaseException) -> None:
        super().__init__(index, exc)
        self.index = index
        self.exc = exc


class Cancelled(BaseException):
    """Raised in a running handler's thread when its job is cancelled (``Client.cancel``).

    A ``BaseException``, like ``asyncio.CancelledError``, so a handler's ``except Exception``
    does not swallow it.  The job is acknowledged, never retried.  ``Worker(cancel_running=
    "cooperative")`` never raises it: the handler polls ``current_job().cancelled`` instead.
    """


class ClientClosedError(OjsError):
    """The client was closed: a call made after :meth:`~ojs_kombu.AsyncClient.aclose`, or one still
    waiting when it closed (an enqueue that had not started publishing is not published)."""


class PermitLostError(OjsError):
    """A concurrency permit could not be given back because its connection was lost: the broker
    took it back already (:class:`ojs_kombu.amqp.permits.Permits`), or the Permits was closed."""


class WorkerError(OjsError):
    """The worker stopped on its own: its consumer ended without being asked to.

    Raised by :meth:`ojs_kombu.Worker.run` after the graceful shutdown, and kept in
    :attr:`ojs_kombu.Worker.error`.  ``__cause__`` is what ended the consumer (for example a
    :class:`~ojs_kombu.errors.BrokerConnectionError` or a
    :class:`~ojs_kombu.errors.TopologyConflictError`), or ``None``.
    """


class ManagementError(OjsError, RuntimeError):
    """A request to the RabbitMQ management HTTP API failed (:mod:`ojs_kombu.amqp.management`).

    The message names the method, the path and the HTTP answer (never the credentials, which
    travel in a header).

    Attributes:
        status: the HTTP status code, or ``None`` when no HTTP answer arrived (connection
            refused, timeout ...).
        method: the HTTP method (``"GET"`` ...).
        path: the API path (``"/api/queues/%2F"`` ...).
    """

    def __init__(self, message: str, *, status: int | None = None, method: str = "", path: str = ""):
        super().__init__(message)
        self.status = status
        self.method = method
        self.path = path


class MetricsServerError(OjsError, OSError):
    """The Prometheus metrics endpoint could not listen (its port is in use, the address is not
    this host's, a privileged port ...).  ``__cause__`` is the ``OSError``."""


class InvalidWorkflowError(ValidationError):
    """A workflow definition breaks the workflows spec (``invalid_workflow``, ojs-workflows.md §11.1).

    Raised when the workflow is built, before anything is enqueued (§10.2: a workflow too deep is
    refused at creation).  ``field`` is a path such as ``"steps[1].jobs[0].type"``.
    """

    code = "invalid_workflow"


class WorkflowStateError(OjsError):
    """A workflow or step state transition the spec does not list (ojs-workflows.md §8.2).

    Attributes:
        current: the state it is in.
        requested: the state it was asked to move to.
    """

    def __init__(self, message: str, *, current: str, requested: str):
        super().__init__(message)
        self.current = current
        self.requested = requested


class ResultTooLargeError(ValidationError):
    """A job's result is bigger than a workflow carries (ojs-workflows.md §7.5; ``result_too_large``).

    Attributes:
        size: the result's size, UTF-8 bytes of its compact JSON.
        limit: the limit it is over.
    """

    code = "result_too_large"

    def __init__(self, message: str, *, size: int, limit: int, field: str | None = "result"):
        super().__init__(message, field=field)
        self.size = size
        self.limit = limit


__all__ = [
    "AccessRefusedError",
    "ArgumentDifference",
    "BrokerConnectionError",
    "BrokerRefusedError",
    "Cancelled",
    "ClientClosedError",
    "DeadLetter",
    "DecodeError",
    "Discard",
    "ManagementError",
    "DuplicateJobError",
    "MetricsServerError",
    "NotFoundError",
    "OjsError",
    "PermitLostError",
    "PublishError",
    "PublishNackedError",
    "PublishTimeoutError",
    "QueueArgumentRefusedError",
    "QueueUnavailableError",
    "TlsVerificationError",
    "TopologyConflictError",
    "TopologyError",
    "UnroutableError",
    "ValidationError",
    "WorkerError",
    "InvalidWorkflowError",
    "ResultTooLargeError",
    "WorkflowStateError",
]
