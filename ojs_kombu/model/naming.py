"""Every AMQP entity name of the binding (§4.1), from one place.

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

from ojs_kombu.errors import ValidationError

QUEUE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9\-.]*$")
JOB_TYPE_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$")
MAX_QUEUE_NAME = 128
MAX_JOB_TYPE = 255

#: Queue names that would collide with the binding's own per-queue entities.
RESERVED_QUEUE_PREFIXES = ("dlx.", "retry.", "control.")

CONTROL_TYPE_CANCEL = "ojs.control.cancel"
CONTROL_TYPE_HEARTBEAT = "ojs.control.heartbeat"
CONTROL_TYPE_INFO = "ojs.control.info"


def validate_queue_name(queue: str) -> str:
    """Return ``queue`` if it is a valid, unreserved OJS queue name; raise ValidationError otherwise."""
    if not isinstance(queue, str) or not QUEUE_NAME_RE.fullmatch(queue) or len(queue) > MAX_QUEUE_NAME:
        raise ValidationError(
            f"invalid queue name {queue!r}: must match [a-z0-9][a-z0-9-.]* and be at most {MAX_QUEUE_NAME} characters",
            field="queue",
        )
    for reserved in RESERVED_QUEUE_PREFIXES:
        if queue.startswith(reserved):
            raise ValidationError(
                f"invalid queue name {queue!r}: names starting with {reserved!r} are reserved "
                f"(they would collide with ojs.queue.{reserved}<queue>)",
                field="queue",
            )
    return queue


def validate_job_type(job_type: str) -> str:
    """Return ``job_type`` if it matches the OJS type pattern; raise ValidationError otherwise."""
    if not isinstance(job_type, str) or not JOB_TYPE_RE.fullmatch(job_type) or len(job_type) > MAX_JOB_TYPE:
        raise ValidationError(
            f"invalid job type {job_type!r}: dot-separated segments of [a-z][a-z0-9_]*, "
            f"at most {MAX_JOB_TYPE} characters (use ojs_kombu.model.naming.job_type_for() "
            "to map a framework task name)",
            field="type",
        )
    return job_type


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
    if JOB_TYPE_RE.fullmatch(name) and len(name) <= MAX_JOB_TYPE:
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
    return mapped[:MAX_JOB_TYPE].rstrip("._")


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

    def queue_from_job_queue(self, amqp_name: str) -> str | None:
        """The OJS queue name of an AMQP job queue name, or None if it is not one."""
        head = self.job_queue("")
        if not amqp_name.startswith(head):
            return None
        queue = amqp_name[len(head) :]
        if not queue or queue.startswith(RESERVED_QUEUE_PREFIXES) or not QUEUE_NAME_RE.fullmatch(queue):
            return None
        return queue


__all__ = [
    "CONTROL_TYPE_CANCEL",
    "CONTROL_TYPE_HEARTBEAT",
    "CONTROL_TYPE_INFO",
    "JOB_TYPE_RE",
    "Names",
    "QUEUE_NAME_RE",
    "RESERVED_QUEUE_PREFIXES",
    "job_type_for",
    "ojs_queue_for",
    "validate_job_type",
    "validate_queue_name",
]
