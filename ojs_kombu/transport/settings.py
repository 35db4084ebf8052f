"""The OJS options of an ``ojs://`` connection (``transport_options`` / ``broker_transport_options``),
and the task message codecs framework adapters register (:func:`register_codec`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, NamedTuple, Protocol, cast

from kombu.utils.imports import symbol_by_name

from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import Names
from ojs_kombu.model.ratelimit import RateLimitPolicy
from ojs_kombu.runtime.lifecycle import Lifecycle
from ojs_kombu.runtime.redis_locks import RedisLocks
from ojs_kombu.runtime.replace import DEFAULT_REPLACE_TIMEOUT, check_seconds
from ojs_kombu.runtime.unique import check_backend
from ojs_kombu.runtime.workflow import DEFAULT_SWEEP_AFTER, check_retention
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.completed import CompletedOptions
from ojs_kombu.wire.entities import QueueOptions

DEFAULT_CONFIRM_TIMEOUT = 30.0

#: The transport options that are the binding's (removed before py-amqp sees the options).
OJS_OPTIONS = (
    "prefix",
    "queue_options",
    "queue_type",
    "passthrough_queues",
    "codec",
    "confirm_timeout",
    "on_cancel",
    "lifecycle",
    "info",
    "rate_limits",
    "deduplicate",
    "completed_options",
    "unique_backend",
    "unique_replace_timeout",
    "workflow_retention",
)

#: ``x-*`` queue arguments of a framework queue that become fields of its OJS queue's options.
QUEUE_ARGUMENT_OPTIONS = {
    "x-max-priority": "max_priority",
    "x-max-length": "max_length",
    "x-max-length-bytes": "max_length_bytes",
    "x-overflow": "overflow",
    "x-message-ttl": "message_ttl",
    "x-queue-type": "queue_type",
    "x-delivery-limit": "delivery_limit",
    "x-consumer-timeout": "consumer_timeout",
    "x-consumer-disconnected-timeout": "consumer_disconnected_timeout",
}


class TaskCodec(Protocol):
    """Turns a framework's task messages into OJS jobs and back (see :mod:`ojs_celery.protocol`)."""

    def is_task(self, properties: dict[str, Any], headers: dict[str, Any]) -> bool:
        """Whether a message being published is a task message this codec converts."""

    def to_job(
        self, body: bytes, properties: dict[str, Any], headers: dict[str, Any], queue: str
    ) -> tuple[Job, OutgoingMessage]:
        """The OJS job of a task message bound for OJS queue ``queue``, and its encoded message."""

    def task_message(self, job: Job, properties: dict[str, Any], headers: dict[str, Any]) -> TaskMessage:
        """A delivered job as the framework's task message, with its body decoded."""


#: What :func:`register_codec` was last given (empty: nothing registered).
_REGISTERED: list[TaskCodec | type | str] = []

#: The entry point group an installed framework adapter names its codec in (``ojs_celery``'s package
#: metadata: ``celery = "ojs_celery.protocol:CeleryCodec"``), for a process that never imported it.
CODEC_ENTRY_POINTS = "ojs_kombu.codecs"


def installed_codec() -> str | None:
    """The ``"module:Class"`` of the codec an installed adapter declares (:data:`CODEC_ENTRY_POINTS`), if any.

    A stock ``celery.Celery(broker="ojs://…")`` app never imports ``ojs_celery``, so nothing
    registered a codec; the adapter's package metadata still names it, and the transport stays
    ignorant of which framework that is.  With several, the first by name.
    """
    found = sorted(entry_points(group=CODEC_ENTRY_POINTS), key=lambda point: point.name)
    return found[0].value if found else None


def register_codec(codec: TaskCodec | type | str) -> None:
    """Make ``codec`` the task message codec of the ``ojs://`` connections that set no ``codec`` option.

    A framework adapter registers its codec when it is imported (``ojs_celery`` registers
    Celery's), so the transport itself names no framework.  The last registration wins; a
    connection's ``codec`` transport option overrides it.  Connections already open keep the
    codec they loaded.

    Parameters:
        codec: a :class:`TaskCodec`, a class of one (made per connection), or the
            ``"module:Class"`` path of one (imported on first use).
    """
    _REGISTERED[:] = [codec]


class TaskMessage(NamedTuple):
    """A delivered job as a framework task message (what :meth:`TaskCodec.task_message` returns)."""

    #: The message body, as the framework's own producer would have written it.
    body: bytes
    #: The message properties (no ``application_headers``).
    properties: dict[str, Any]
    #: The message headers (``application_headers``).
    headers: dict[str, Any]
    #: What the framework's consumer decodes ``body`` to, already built by the codec (the
    #: consumer need not parse the body again); None to let it decode ``body`` itself.
    payload: Any


@dataclass
class Settings:
    """The OJS transport options of one kombu connection (see :mod:`ojs_kombu.transport`)."""

    names: Names
    queue_options: QueueOptions
    passthrough_queues: frozenset[str]
    codec: TaskCodec | type | str | None
    confirm_timeout: float
    on_cancel: Callable[[str], None] | str | None = None
    lifecycle: Lifecycle | Callable[[], Lifecycle] | str | None = None
    info: Callable[[str], JobInfo | None] | str | None = None
    rate_limits: Callable[[Job], RateLimitPolicy | None] | str | None = None
    deduplicate: bool = False
    completed_options: CompletedOptions | None = None
    #: Where unique jobs' locks are: None (RabbitMQ queues) or a Redis URL (``Client(unique_backend=...)``).
    unique_backend: str | None = None
    #: Seconds a ``replace`` waits for a running holder to end once cancelled, before it rejects.
    unique_replace_timeout: float = DEFAULT_REPLACE_TIMEOUT
    #: Seconds an ended workflow's record stream is kept before its sweep job deletes it (None: kept).
    workflow_retention: float | None = DEFAULT_SWEEP_AFTER
    _redis_locks: RedisLocks | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Settings:
        """Read the OJS options of a transport options dict.

        Parameters:
            options: kombu's ``transport_options`` (other keys are ignored).

        Returns:
            The settings.

        Raises:
            TypeError: ``queue_options`` or ``completed_options`` has fields their class does not know.
            ValidationError: a bad ``queue_options``, ``queue_type`` (``"classic"`` or ``"quorum"``)
                ``unique_backend`` (None or a Redis URL), ``unique_replace_timeout`` (seconds) or ``workflow_retention`` (seconds or None).
        """
        queue_options = options.get("queue_options") or QueueOptions()
        if isinstance(queue_options, dict):
            queue_options = QueueOptions(**queue_options)
        queue_options = queue_options.with_queue_type(options.get("queue_type"))
        completed_options = options.get("completed_options")
        if isinstance(completed_options, dict):
            completed_options = CompletedOptions(**completed_options)
        return cls(
            names=Names(options.get("prefix") or ""),
            queue_options=queue_options,
            passthrough_queues=frozenset(options.get("passthrough_queues") or ()),
            codec=options.get("codec"),
            confirm_timeout=float(options.get("confirm_timeout") or DEFAULT_CONFIRM_TIMEOUT),
            on_cancel=options.get("on_cancel"),
            lifecycle=options.get("lifecycle"),
            info=options.get("info"),
            rate_limits=options.get("rate_limits"),
            deduplicate=bool(options.get("deduplicate")),
            completed_options=completed_options,
            unique_backend=check_backend(options.get("unique_backend")),
            unique_replace_timeout=check_seconds(
                "unique_replace_timeout", options.get("unique_replace_timeout", DEFAULT_REPLACE_TIMEOUT), zero=True
            ),
            workflow_retention=check_retention(options.get("workflow_retention", DEFAULT_SWEEP_AFTER)),
        )

    def redis_locks(self) -> RedisLocks | None:
        """The Redis unique locks of ``unique_backend`` (made on first use, shared by the connection's
        channels: thread-safe), or None when the locks are RabbitMQ's."""
        if self.unique_backend is not None and self._redis_locks is None:
            self._redis_locks = RedisLocks(self.unique_backend, names=self.names)
        return self._redis_locks

    def load_codec(self) -> TaskCodec | None:
        """The codec object: the ``codec`` option, else the registered codec (:func:`register_codec`).

        Imported and made on first use (a codec may need its framework only then).

        Returns:
            The codec, or None when the option is not set, no codec is registered and no installed
            adapter declares one (:func:`installed_codec`).
        """
        if self.codec is None:
            if not _REGISTERED and (declared := installed_codec()) is not None:
                register_codec(declared)
            if not _REGISTERED:
                return None
            self.codec = _REGISTERED[0]
        codec = self._imported("codec")
        if isinstance(codec, type):
            self.codec = codec()
        return cast(TaskCodec, self.codec)

    def load_on_cancel(self) -> Callable[[str], None] | None:
        """The ``on_cancel`` hook (imported on first use when given as ``"module:function"``).

        Raises:
            TypeError: ``on_cancel`` is neither callable nor the path of a callable.
        """
        hook: Callable[[str], None] | None = self._callable_option("on_cancel")
        return hook

    def load_info(self) -> Callable[[str], JobInfo | None] | None:
        """The ``info`` function answering INFO requests (imported on first use when given as a path).

        Raises:
            TypeError: ``info`` is neither callable nor the path of a callable.
        """
        answer: Callable[[str], JobInfo | None] | None = self._callable_option("info")
        return answer

    def load_rate_limits(self) -> Callable[[Job], RateLimitPolicy | None] | None:
        """The ``rate_limits`` function: a policy of a job's own besides its ``rate_limit`` (a
        framework option mapped onto one, e.g. a Celery task's ``rate_limit``), or None.

        Raises:
            TypeError: ``rate_limits`` is neither callable nor the path of a callable.
        """
        policy: Callable[[Job], RateLimitPolicy | None] | None = self._callable_option("rate_limits")
        return policy

    def load_lifecycle(self) -> Lifecycle | None:
        """The :class:`Lifecycle` the transport's Settler emits to (``cancelled`` on delivery, ``retried``, ...).

        The option is a :class:`Lifecycle`, or a function returning one (called per
        channel, e.g. a per-process hub), or the ``"module:function"`` path of one.

        Raises:
            TypeError: the option gives no :class:`Lifecycle`.
        """
        found = self._imported("lifecycle")
        if found is not None and not isinstance(found, Lifecycle) and callable(found):
            found = found()
        if found is not None and not isinstance(found, Lifecycle):
            raise TypeError(f"the transport option lifecycle must give a Lifecycle, got {found!r}")
        return found

    def _imported(self, name: str) -> Any:
        """The option ``name``, imported (and kept) when given as ``"module:attribute"``."""
        value = getattr(self, name)
        if isinstance(value, str):
            value = symbol_by_name(value)
            setattr(self, name, value)
        return value

    def _callable_option(self, name: str) -> Any:
        """The option ``name`` (see :meth:`_imported`), checked callable.

        Raises:
            TypeError: the option is neither None, callable nor the path of a callable.
        """
        value = self._imported(name)
        if value is not None and not callable(value):
            raise TypeError(f"the transport option {name} must be callable, got {value!r}")
        return value

    def options_with(self, arguments: dict[str, Any]) -> QueueOptions:
        """The queue options with the fields of the ``x-*`` queue ``arguments`` a framework declared
        (``delay_queue_type`` is the transport's: a framework has no queue argument for it).

        Parameters:
            arguments: only the keys of :data:`QUEUE_ARGUMENT_OPTIONS`.
        """
        base = self.queue_options
        fields = {
            name: getattr(base, name) for name in QUEUE_ARGUMENT_OPTIONS.values() if getattr(base, name) is not None
        }
        fields["delay_queue_type"] = base.delay_queue_type
        fields.update({QUEUE_ARGUMENT_OPTIONS[k]: v for k, v in arguments.items()})
        return QueueOptions(**fields)


__all__ = [
    "DEFAULT_CONFIRM_TIMEOUT",
    "OJS_OPTIONS",
    "QUEUE_ARGUMENT_OPTIONS",
    "Settings",
    "TaskCodec",
    "TaskMessage",
    "register_codec",
]
