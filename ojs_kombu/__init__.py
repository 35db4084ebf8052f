"""ojs_kombu: the Open Job Spec AMQP 0-9-1 binding on kombu / py-amqp.

The public API::

    from ojs_kombu import Client, RetryPolicy, Worker

    with Client() as client:                      # $OJS_AMQP_URL or amqp://localhost
        client.enqueue("email.send", ["a@example.com"], queue="email",
                       retry=RetryPolicy(max_attempts=5))

    worker = Worker(queues=["email"])

    @worker.handler("email.send")
    def send(address):
        ...

    worker.run()

Importing the package registers the ``ojs://`` and ``ojss://`` kombu transports.
"""

from typing import TYPE_CHECKING

from ojs_kombu.amqp.permits import Permit, Permits, PermitState
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.client import Client, EnqueueResult, JobOptions
from ojs_kombu.errors import (
    AccessRefusedError,
    ArgumentDifference,
    BatchItemFailed,
    BrokerConnectionError,
    BrokerRefusedError,
    Cancelled,
    ClientClosedError,
    DeadLetter,
    DecodeError,
    Discard,
    DuplicateJobError,
    InvalidWorkflowError,
    ManagementError,
    MetricsServerError,
    NotFoundError,
    OjsError,
    PermitLostError,
    PublishError,
    PublishNackedError,
    PublishTimeoutError,
    QueueArgumentRefusedError,
    QueueUnavailableError,
    ResultTooLargeError,
    TlsVerificationError,
    TopologyConflictError,
    TopologyError,
    UnroutableError,
    ValidationError,
    WorkerError,
    WorkflowStateError,
)
from ojs_kombu.lazy import lazy_exports
from ojs_kombu.model.info import JobInfo, JobState
from ojs_kombu.model.job import Job, JobError
from ojs_kombu.model.naming import Names, job_type_for
from ojs_kombu.model.policies import RetryPolicy, UniquePolicy
from ojs_kombu.model.ratelimit import RateLimitPolicy, RateWindow
from ojs_kombu.model.workflow import Batch, Chain, Group, batch, chain, group
from ojs_kombu.model.workflow_info import StepInfo, WorkflowInfo
from ojs_kombu.observability.server import MetricsServer, serve_metrics
from ojs_kombu.runtime.cron import CronRegistry, CronScheduler, RegisteredCron
from ojs_kombu.runtime.deadletter import DeadLetterEntry
from ojs_kombu.runtime.manifest import conformance_manifest
from ojs_kombu.runtime.worker import Worker, current_job
from ojs_kombu.transport import register_aliases
from ojs_kombu.wire.codec import CONTENT_TYPE, decode, encode
from ojs_kombu.wire.completed import CompletedOptions
from ojs_kombu.wire.control import ControlOptions
from ojs_kombu.wire.entities import QueueOptions
from ojs_kombu.wire.events import ActiveJob, EventsOptions, JobEventRecord, WorkerPresence
from ojs_kombu.wire.headers import Header

if TYPE_CHECKING:
    from ojs_kombu.aio import AsyncClient

# Loaded on first use: asyncio stays out of processes that do not use it.
_EXPORTS = {"AsyncClient": ".aio"}

register_aliases()

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__version__ = "0.1.0"

__all__ = [
    "CONTENT_TYPE",
    "CronRegistry",
    "CronScheduler",
    "RegisteredCron",
    "Batch",
    "Chain",
    "Group",
    "StepInfo",
    "WorkflowInfo",
    "batch",
    "chain",
    "group",
    "AccessRefusedError",
    "ActiveJob",
    "ArgumentDifference",
    "BatchItemFailed",
    "AsyncClient",
    "BrokerConnectionError",
    "BrokerRefusedError",
    "Cancelled",
    "Client",
    "ClientClosedError",
    "CompletedOptions",
    "ControlOptions",
    "DeadLetter",
    "DeadLetterEntry",
    "DecodeError",
    "Discard",
    "DuplicateJobError",
    "InvalidWorkflowError",
    "ResultTooLargeError",
    "WorkflowStateError",
    "EnqueueResult",
    "EventsOptions",
    "Header",
    "Job",
    "JobError",
    "JobEventRecord",
    "JobInfo",
    "JobOptions",
    "JobState",
    "MetricsServer",
    "ManagementError",
    "MetricsServerError",
    "Names",
    "NotFoundError",
    "OjsError",
    "PublishError",
    "PublishNackedError",
    "PublishTimeoutError",
    "QueueArgumentRefusedError",
    "QueueUnavailableError",
    "QueueOptions",
    "Permit",
    "PermitLostError",
    "PermitState",
    "Permits",
    "RateLimitPolicy",
    "RateWindow",
    "RetryPolicy",
    "Topology",
    "TlsVerificationError",
    "TopologyConflictError",
    "TopologyError",
    "UniquePolicy",
    "UnroutableError",
    "ValidationError",
    "Worker",
    "WorkerError",
    "WorkerPresence",
    "conformance_manifest",
    "current_job",
    "decode",
    "encode",
    "job_type_for",
    "register_aliases",
    "serve_metrics",
]
