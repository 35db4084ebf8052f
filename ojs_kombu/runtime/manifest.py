"""The OJS conformance manifest of this implementation (ojs-unique-jobs.md §8.3; ``ojs-amqp manifest``).

A pure function: it reads the package metadata and nothing on the network.  It lives in the runtime
layer because the unique-jobs mechanism it declares depends on ``unique_backend``, checked by
:func:`~ojs_kombu.runtime.unique.check_backend` as ``Client`` and ``Worker`` check it.

Two fields depart from the official ``manifest.schema.json`` on purpose (docs/wire-format.md,
"The conformance manifest"): ``protocols`` is ``["amqp"]`` although the schema requires ``"http"``
(this binding serves no HTTP), and ``capabilities.unique_jobs`` is the unique-jobs spec's
``{"strength", "mechanism"}`` object where the schema types it as a boolean.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final

from ojs_kombu.model.fields import SPEC_VERSION
from ojs_kombu.runtime.unique import check_backend

DISTRIBUTION: Final = "ojs-amqp"
"""The distribution (``pip install`` name) whose metadata gives the implementation's version."""

IMPLEMENTATION_NAME: Final = "ojs-kombu"

CONFORMANCE_LEVEL: Final = 4
"""Level 4 (Advanced): the level ojs-unique-jobs.md belongs to; workflows (3), scheduling (2) and
retries with dead letters (1) are all implemented too."""

RABBITMQ_LOCKS: Final = (
    "RabbitMQ classic queue per uniqueness key (x-max-length=1, x-overflow=reject-publish, x-expires): "
    "a confirmed publish of one token is an atomic set-if-absent (ack: acquired, nack: duplicate)"
)
REDIS_LOCKS: Final = (
    "Redis SET NX PX in a Lua script: atomic acquire returning the holder; release deletes the key only for its holder"
)

# What the library does, by the schema's capability names.  False where the schema's meaning is not met:
# enqueue_many reports each job's outcome and is not all-or-none (the schema's "atomic batch enqueue"),
# and the envelope's `schema` URI is preserved but args are not validated against it.
_CAPABILITIES: Final[dict[str, bool]] = {
    "batch_enqueue": False,
    "cron_jobs": True,
    "dead_letter": True,
    "delayed_jobs": True,
    "job_ttl": True,
    "priority_queues": True,
    "rate_limiting": True,
    "schema_validation": False,
    "workflows": True,
    "pause_resume": True,
}


def _implementation_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # pragma: no cover - a source tree run without installing
        return "0+unknown"


def conformance_manifest(unique_backend: str | None = None) -> dict[str, Any]:
    """The OJS conformance manifest of ojs-kombu, a JSON-ready dict.

    Parameters:
        unique_backend: where unique jobs' locks are, as ``Client(unique_backend=...)``: None
            (RabbitMQ queues) or a Redis URL; it decides ``capabilities.unique_jobs.mechanism``.
            The strength is ``"strong"`` with either.

    Returns:
        ``ojs_version``, ``implementation`` (``name``, ``version``, ``language``),
        ``conformance_level``, ``protocols`` (``["amqp"]``), ``backend`` (``"rabbitmq"``) and
        ``capabilities`` (the schema's boolean flags, ``unique_jobs`` as ``{"strength", "mechanism"}``).

    Raises:
        ValidationError: ``unique_backend`` is neither None nor a Redis URL.
    """
    backend = check_backend(unique_backend)
    mechanism = RABBITMQ_LOCKS if backend is None else REDIS_LOCKS
    return {
        "ojs_version": SPEC_VERSION,
        "implementation": {"name": IMPLEMENTATION_NAME, "version": _implementation_version(), "language": "python"},
        "conformance_level": CONFORMANCE_LEVEL,
        "protocols": ["amqp"],
        "backend": "rabbitmq",
        "capabilities": {**_CAPABILITIES, "unique_jobs": {"strength": "strong", "mechanism": mechanism}},
    }


__all__ = ["CONFORMANCE_LEVEL", "DISTRIBUTION", "IMPLEMENTATION_NAME", "conformance_manifest"]
