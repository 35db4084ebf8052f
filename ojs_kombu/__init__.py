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

from .client import Client, EnqueueResult
from .codec import CONTENT_TYPE, Header, decode, encode
from .deadletter import DeadLetterEntry
from .envelope import Job, JobError, RetryPolicy, UniquePolicy
from .errors import (
    ArgumentDifference,
    BrokerConnectionError,
    DeadLetter,
    DecodeError,
    Discard,
    OjsError,
    PublishError,
    PublishNackedError,
    PublishTimeoutError,
    TopologyConflictError,
    TopologyError,
    UnroutableError,
    ValidationError,
)
from .naming import Names, job_type_for
from .topology import QueueOptions, Topology
from .transport import register_aliases
from .worker import Worker, current_job

register_aliases()

__version__ = "0.1.0"

__all__ = [
    "CONTENT_TYPE",
    "ArgumentDifference",
    "BrokerConnectionError",
    "Client",
    "DeadLetter",
    "DeadLetterEntry",
    "DecodeError",
    "Discard",
    "EnqueueResult",
    "Header",
    "Job",
    "JobError",
    "Names",
    "OjsError",
    "PublishError",
    "PublishNackedError",
    "PublishTimeoutError",
    "QueueOptions",
    "RetryPolicy",
    "Topology",
    "TopologyConflictError",
    "TopologyError",
    "UniquePolicy",
    "UnroutableError",
    "ValidationError",
    "Worker",
    "current_job",
    "decode",
    "encode",
    "job_type_for",
    "register_aliases",
]
