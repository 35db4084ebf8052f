"""Names: the rules of job types and queue names (DESIGN §3), and every AMQP entity name of the binding (§4.1).

The patterns and limits of job.schema.json live here only: :func:`check_job_type` and
:func:`check_queue_name` serve the envelope's validators, :func:`validate_job_type` and
:func:`validate_queue_name` the public API.

>>> names = Names()
>>> names.job_queue("email")
'ojs.queue.email'
>>> Names(prefix="tenant1").dead_letter_queue("email")
'tenant1.ojs.queue.dlx.email'

OJS queue names may contain dots, so a queue called ``dlx.email`` would be
``ojs.queue.dlx.email``: the dead letter queue of ``email``.  Names starting
with one of :data:`RESERVED_QUEUE_PREFIXES` are therefore refused (DESIGN §3).

Framework task names (Celery ``Reports.BuildPDF``, Dramatiq ``LegacyActor``)
need not match the OJS job type pattern; :func:`job_type_for` maps them
deterministically onto a valid type.  The adapters keep the original name in
``meta.celery`` / ``meta.dramatiq`` so it round-trips.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ojs_kombu.errors import ValidationError
from ojs_kombu.model._problems import Problem, public_error, short_repr

JOB_TYPE_PATTERN = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$"
"""Job type: dot-separated lowercase segments (job.schema.json); at most :data:`MAX_JOB_TYPE_LENGTH`."""

QUEUE_NAME_PATTERN = r"^[a-z0-9][a-z0-9\-\.]*$"
"""OJS queue name (job.schema.json, DESIGN §3); at most :data:`MAX_QUEUE_NAME_LENGTH`."""

MAX_JOB_TYPE_LENGTH = 255
"""Longest job type the schema allows."""

MAX_QUEUE_NAME_LENGTH = 128
"""Longest queue name the schema allows."""

JOB_TYPE_RE = re.compile(JOB_TYPE_PATTERN)
""":data:`JOB_TYPE_PATTERN` compiled; use ``fullmatch`` (and mind the length)."""

QUEUE_NAME_RE = re.compile(QUEUE_NAME_PATTERN)
""":data:`QUEUE_NAME_PATTERN` compiled; use ``fullmatch`` (and mind the length)."""

PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$")

#: Queue names that would collide with the binding's own per-queue entities.
RESERVED_QUEUE_PREFIXES = ("dlx.", "retry.", "control.")
#: OJS queue names whose ``ojs.queue.{name}`` is one of the binding's own queues: the cron leader lease.
RESERVED_QUEUE_NAMES = ("cron.leader",)

SWEEP_JOB_TYPE = "ojs.workflow.sweep"
"""The internal job that deletes an ended workflow's record stream (args ``[workflow_id]``): every
consumer's triage handles it, no framework sees it (``docs/workflows.md``, Clean-up)."""
#: Job types a producer cannot create (:func:`check_new_job_type`): the library's own jobs.
RESERVED_JOB_TYPES = (SWEEP_JOB_TYPE,)

CONTROL_TYPE_CANCEL = "ojs.control.cancel"
CONTROL_TYPE_HEARTBEAT = "ojs.control.heartbeat"
CONTROL_TYPE_INFO = "ojs.control.info"
CONTROL_TYPE_PAUSE = "ojs.control.pause"
CONTROL_TYPE_RESUME = "ojs.control.resume"

EVENT_TYPE_WORKER = "ojs.event.worker"
"""``type`` property of a worker presence on the events stream (DESIGN §14)."""
EVENT_TYPE_JOB_PREFIX = "ojs.event.job."
"""``type`` property of a job lifecycle event: this prefix and the event (``ojs.event.job.started``)."""
EVENT_TYPE_CRON_PREFIX = "ojs.event.cron."
#: ``type`` property prefix of a rate limit event on the events stream (``ojs.event.rate_limit.exceeded``).
EVENT_TYPE_RATE_LIMIT_PREFIX = "ojs.event.rate_limit."
"""``type`` property of a cron event (ojs-cron.md §9): this prefix and ``triggered`` or ``skipped``."""


def check_job_type(value: Any) -> str:
    """Return ``value`` if it is a valid OJS job type.

    Raises:
        Problem: not a string, not dot-separated lowercase segments, or longer than :data:`MAX_JOB_TYPE_LENGTH`.
    """
    if not isinstance(value, str):
        raise Problem(f"job type must be a string, got {type(value).__name__}")
    if len(value) > MAX_JOB_TYPE_LENGTH or JOB_TYPE_RE.fullmatch(value) is None:
        raise Problem(
            f"job type {short_repr(value)} is invalid: use dot-separated lowercase segments, each "
            f"[a-z][a-z0-9_]* (e.g. 'email.send'), at most {MAX_JOB_TYPE_LENGTH} characters"
        )
    return value


def check_new_job_type(value: Any) -> str:
    """Return ``value`` if it is a valid job type a producer may create (not one of :data:`RESERVED_JOB_TYPES`).

    Raises:
        Problem: as :func:`check_job_type`, or the type is reserved.
    """
    if value in RESERVED_JOB_TYPES:
        raise Problem(f"job type {value!r} is reserved: the library enqueues it itself")
    return check_job_type(value)


def check_queue_name(value: Any) -> str:
    """Return ``value`` if it is a valid OJS queue name (reserved prefixes allowed: a received job may use them).

    Raises:
        Problem: not a string, not matching :data:`QUEUE_NAME_PATTERN`, or longer than :data:`MAX_QUEUE_NAME_LENGTH`.
    """
    if not isinstance(value, str):
        raise Problem(f"queue name must be a string, got {type(value).__name__}")
    if len(value) > MAX_QUEUE_NAME_LENGTH or QUEUE_NAME_RE.fullmatch(value) is None:
        raise Problem(
            f"queue name {short_repr(value)} is invalid: use lowercase letters, digits, '-' and '.', starting "
            f"with a letter or digit (e.g. 'default'), at most {MAX_QUEUE_NAME_LENGTH} characters"
        )
    return value


def check_new_queue_name(value: Any) -> str:
    """Return ``value`` if it is a valid queue name without a reserved prefix (what producers and workers may use).

    Raises:
        Problem: as :func:`check_queue_name`, or the name starts with one of :data:`RESERVED_QUEUE_PREFIXES`.
    """
    queue = check_queue_name(value)
    if queue in RESERVED_QUEUE_NAMES:
        raise Problem(f"queue name {queue!r} is reserved: ojs.queue.{queue} is the cron scheduler's leader lease")
    if queue.startswith(RESERVED_QUEUE_PREFIXES):
        raise Problem(
            f"queue name {queue!r} starts with a reserved prefix ({', '.join(RESERVED_QUEUE_PREFIXES)}): "
            "it would collide with the dead letter, retry or control queue of another queue"
        )
    return queue


def validate_queue_name(queue: str) -> str:
    """Return ``queue`` if it is a valid, unreserved OJS queue name.

    Raises:
        ValidationError: ``field="queue"``; the message says which rule the name breaks.
    """
    try:
        return check_new_queue_name(queue)
    except Problem as problem:
        raise public_error(problem, "queue") from None


def validate_job_type(job_type: str) -> str:
    """Return ``job_type`` if it is a valid OJS job type.

    Raises:
        ValidationError: ``field="type"``; the message points at :func:`job_type_for` for framework task names.
    """
    try:
        return check_new_job_type(job_type)
    except Problem as problem:
        problem.text += " (use ojs_kombu.model.naming.job_type_for() to map a framework task name)"
        raise public_error(problem, "type") from None


_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_INVALID_CHARS = re.compile(r"[^a-z0-9_]+")


@lru_cache(maxsize=4096)
def job_type_for(name: str) -> str:
    """Map a framework task/actor name onto a valid OJS job type, deterministically.

    Names that already are valid types are returned unchanged.  Otherwise each
    dot-separated segment is snake-cased (``BuildPDF`` -> ``build_pdf``), other
    characters become ``_`` and a segment that does not start with a letter gets
    an ``x`` in front.  ``Reports.BuildPDF`` -> ``reports.build_pdf``,
    ``send-email`` -> ``send_email``, ``tasks.2fa`` -> ``tasks.x2fa``.
    """
    if JOB_TYPE_RE.fullmatch(name) and len(name) <= MAX_JOB_TYPE_LENGTH:
        return name
    segments = []
    for raw in name.split("."):
        segment = _CAMEL_BOUNDARY.sub("_", raw).lower()
        segment = _INVALID_CHARS.sub("_", segment).strip("_")
        if not segment:
            continue
        if not segment[0].isalpha():
            segment = "x" + segment
        segments.append(segment)
    mapped = ".".join(segments) or "unnamed"
    return mapped[:MAX_JOB_TYPE_LENGTH].rstrip("._")


def ojs_queue_for(name: str) -> str:
    """Map a framework queue name (Celery, Dramatiq) onto a valid OJS queue name, deterministically.

    Valid names are returned unchanged; otherwise the name is lowercased and
    every run of other characters becomes ``-`` (``Reports_High`` -> ``reports-high``).
    Raises :class:`~ojs_kombu.errors.ValidationError` when nothing usable remains
    or the result starts with a reserved prefix (``dlx.``, ``retry.``, ``control.``).
    """
    if not QUEUE_NAME_RE.fullmatch(name):
        name = re.sub(r"[^a-z0-9\-.]+", "-", name.lower()).strip("-.")
    return validate_queue_name(name)


@dataclass(frozen=True)
class Names:
    """The AMQP names of one OJS deployment, with an optional multi-tenant prefix."""

    prefix: str = ""

    def __post_init__(self) -> None:
        if self.prefix and not PREFIX_RE.fullmatch(self.prefix):
            raise ValidationError(f"invalid entity prefix {self.prefix!r}", field="prefix")

    def _name(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    @property
    def direct_exchange(self) -> str:
        """The exchange jobs are published to (``ojs.exchange.direct``)."""
        return self._name("ojs.exchange.direct")

    @property
    def dead_letter_exchange(self) -> str:
        """The exchange job queues dead-letter into (``ojs.exchange.dlx``)."""
        return self._name("ojs.exchange.dlx")

    @property
    def retry_exchange(self) -> str:
        """The exchange retries are published to (``ojs.exchange.retry``)."""
        return self._name("ojs.exchange.retry")

    @property
    def delayed_exchange(self) -> str:
        """The delayed-message-plugin exchange name (``ojs.exchange.delayed``)."""
        return self._name("ojs.exchange.delayed")

    @property
    def schedule_delivery_exchange(self) -> str:
        """The scheduling cascade's delivery exchange (``ojs.exchange.schedule``)."""
        return self._name("ojs.exchange.schedule")

    def schedule_exchange(self, level: int) -> str:
        """The scheduling cascade's exchange of ``level`` (``ojs.exchange.schedule.07``)."""
        return self._name(f"ojs.exchange.schedule.{level:02d}")

    def schedule_queue(self, level: int) -> str:
        """The scheduling cascade's TTL queue of ``level`` (``ojs.schedule.07``).

        Outside the ``ojs.queue.`` namespace, so no job queue name can collide with it.
        """
        return self._name(f"ojs.schedule.{level:02d}")

    def job_queue(self, queue: str) -> str:
        """``ojs.queue.{queue}``."""
        return self._name(f"ojs.queue.{queue}")

    def dead_letter_queue(self, queue: str) -> str:
        """``ojs.queue.dlx.{queue}``."""
        return self._name(f"ojs.queue.dlx.{queue}")

    def retry_queue(self, queue: str, delay_ms: int) -> str:
        """``ojs.queue.retry.{queue}.{delay_ms}``."""
        return self._name(f"ojs.queue.retry.{queue}.{int(delay_ms)}")

    @staticmethod
    def retry_routing_key(queue: str, delay_ms: int) -> str:
        """Routing key of a retry queue on the retry exchange: ``{queue}.{delay_ms}``."""
        return f"{queue}.{int(delay_ms)}"

    def limit_permit_queue(self, key: str) -> str:
        """The permit tokens of a concurrency limit key: ``ojs.limit.{key}.permits`` (DESIGN §21)."""
        return self._name(f"ojs.limit.{key}.permits")

    def limit_holder_queue(self, key: str, index: int) -> str:
        """The exclusive queue that marks permit ``index`` of ``key`` as held: ``ojs.limit.{key}.held.{index}``."""
        return self._name(f"ojs.limit.{key}.held.{int(index)}")

    def limit_seed_lock(self, key: str) -> str:
        """The exclusive queue held while permits of ``key`` are counted and minted: ``ojs.limit.{key}.seeding``."""
        return self._name(f"ojs.limit.{key}.seeding")

    def limit_window_queue(self, key: str, kind: str) -> str:
        """The start tokens of a window rate (``kind`` ``"rate"`` or ``"throttle"``): ``ojs.limit.{key}.{kind}``."""
        return self._name(f"ojs.limit.{key}.{kind}")

    def control_queue(self, queue: str) -> str:
        """``ojs.queue.control.{queue}``."""
        return self._name(f"ojs.queue.control.{queue}")

    @staticmethod
    def control_routing_key(queue: str) -> str:
        """Routing key of a control queue on the direct exchange: ``control.{queue}``.

        The binding leaves it unspecified; ``control.`` is a reserved queue prefix,
        so this key can never collide with a job queue's key.
        """
        return f"control.{queue}"

    def lock_queue(self, key: str) -> str:
        """The queue that is the unique lock of ``key``: ``ojs.lock.{key}``.

        Outside the ``ojs.queue.`` namespace, so no job queue name can collide with it.
        """
        return self._name(f"ojs.lock.{key}")

    def lock_holder_queue(self, key: str) -> str:
        """The queue holding the id of the job that holds the lock of ``key``: ``ojs.lock.{key}.holder``."""
        return self._name(f"ojs.lock.{key}.holder")

    def fan_in_stream(self, workflow_id: str) -> str:
        """The stream counting a group's or batch's outcomes (DESIGN §21): ``ojs.workflow.{workflow_id}``.

        Outside the ``ojs.queue.`` namespace, so no job queue name can collide with it.
        """
        return self._name(f"ojs.workflow.{workflow_id}")

    def workflow_log_stream(self, workflow_id: str) -> str:
        """The stream recording a workflow's definition and its steps' outcomes: ``ojs.workflow.{workflow_id}.log``.

        One per root workflow (``Client.workflow`` reads it); next to, never the same as, its fan-in streams.
        """
        return self._name(f"ojs.workflow.{workflow_id}.log")

    def workflow_cancel_queue(self, workflow_id: str) -> str:
        """The queue whose existence says a workflow was cancelled: ``ojs.workflow.{workflow_id}.cancelled``.

        Declared by ``Client.cancel_workflow``; the workers look for it before enqueueing a workflow's next jobs.
        """
        return self._name(f"ojs.workflow.{workflow_id}.cancelled")

    @staticmethod
    def fan_in_lock_key(workflow_id: str) -> str:
        """The unique-lock key guarding a fan-in's callbacks: ``fanin.{workflow_id}`` (lock queue ``ojs.lock.fanin.{id}``)."""
        return f"fanin.{workflow_id}"

    @property
    def cron_leader_queue(self) -> str:
        """The cron schedulers' leader lease (``ojs.queue.cron.leader``, DESIGN §20); ``cron.leader`` is reserved."""
        return self._name("ojs.queue.cron.leader")

    @property
    def cron_stream(self) -> str:
        """The stream of cron job definitions and ticks (``ojs.stream.cron``, DESIGN §20)."""
        return self._name("ojs.stream.cron")

    @property
    def events_exchange(self) -> str:
        """The topic exchange of worker presence and job lifecycle events (``ojs.exchange.events``)."""
        return self._name("ojs.exchange.events")

    @property
    def events_stream(self) -> str:
        """The stream holding the events, bound to :attr:`events_exchange` with ``#`` (``ojs.stream.events``)."""
        return self._name("ojs.stream.events")

    def completed_stream(self, queue: str) -> str:
        """The stream of the ids of ``queue``'s completed jobs (execution de-duplication, DESIGN §19):
        ``ojs.stream.completed.{queue}``."""
        return self._name(f"ojs.stream.completed.{queue}")

    @staticmethod
    def worker_routing_key(worker_id: str) -> str:
        """Routing key of a worker's presence on the events exchange: ``worker.{worker_id}``."""
        return f"worker.{worker_id}"

    @staticmethod
    def cron_event_routing_key(event: str, name: str) -> str:
        """Routing key of a cron event on the events exchange: ``cron.{event}.{name}``."""
        return f"cron.{event}.{name}"

    @staticmethod
    def rate_limit_event_routing_key(event: str, queue: str) -> str:
        """Routing key of a rate limit event on the events exchange: ``rate_limit.{event}.{queue}``."""
        return f"rate_limit.{event}.{queue}"

    @staticmethod
    def job_event_routing_key(event: str, queue: str) -> str:
        """Routing key of a job lifecycle event on the events exchange: ``job.{event}.{queue}``."""
        return f"job.{event}.{queue}"

    def queue_from_job_queue(self, amqp_name: str) -> str | None:
        """The OJS queue name of an AMQP job queue name, or None if it is not one."""
        head = self.job_queue("")
        if not amqp_name.startswith(head):
            return None
        queue = amqp_name[len(head) :]
        if (
            not queue
            or queue.startswith(RESERVED_QUEUE_PREFIXES)
            or queue in RESERVED_QUEUE_NAMES
            or not QUEUE_NAME_RE.fullmatch(queue)
        ):
            return None
        return queue


__all__ = [
    "CONTROL_TYPE_CANCEL",
    "CONTROL_TYPE_HEARTBEAT",
    "CONTROL_TYPE_INFO",
    "CONTROL_TYPE_PAUSE",
    "CONTROL_TYPE_RESUME",
    "EVENT_TYPE_CRON_PREFIX",
    "EVENT_TYPE_JOB_PREFIX",
    "EVENT_TYPE_WORKER",
    "JOB_TYPE_PATTERN",
    "JOB_TYPE_RE",
    "MAX_JOB_TYPE_LENGTH",
    "MAX_QUEUE_NAME_LENGTH",
    "QUEUE_NAME_PATTERN",
    "Names",
    "QUEUE_NAME_RE",
    "RESERVED_JOB_TYPES",
    "RESERVED_QUEUE_NAMES",
    "RESERVED_QUEUE_PREFIXES",
    "SWEEP_JOB_TYPE",
    "job_type_for",
    "ojs_queue_for",
    "validate_job_type",
    "validate_queue_name",
]
