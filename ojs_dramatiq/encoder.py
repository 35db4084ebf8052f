"""Dramatiq messages <-> OJS jobs: the wire format of :class:`~ojs_dramatiq.OjsBroker`.

================================  ==============================================================
Dramatiq ``Message``              OJS job envelope
================================  ==============================================================
``actor_name``                    ``type`` (:func:`ojs_kombu.model.naming.job_type_for`: ``LegacyActor``
                                  -> ``legacy_actor``) and ``meta.dramatiq.actor_name``
``queue_name``                    ``queue`` (:func:`ojs_queue_for`: ``high_priority`` ->
                                  ``high-priority``); the consumer sets it back
``args``                          ``args``
``kwargs``                        ``meta.kwargs`` (omitted when empty)
``options``                       ``meta.dramatiq.options`` (without ``eta`` and ``retries``)
``options["retries"]``            ``attempt`` / ``x-ojs-attempt`` (the header is the authority)
``options["broker_priority"]``    ``priority`` (AMQP priority clamped to 0..9)
``message_id``                    ``meta.dramatiq.message_id``; the job ``id`` is a UUIDv7 derived
                                  from it and ``message_timestamp`` (:func:`job_id_for`)
``message_timestamp``             ``created_at`` (milliseconds)
================================  ==============================================================

A job enqueued by another OJS producer (no ``meta.dramatiq``) becomes a message
for the actor whose name maps to its ``type``, with ``message_id`` = the job id.
JSON only: a value JSON cannot carry is refused at send time.
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

import dramatiq
from dramatiq.message import Message

from ojs_kombu.errors import DecodeError
from ojs_kombu.model.ids import JOB_ID_RE, uuid7
from ojs_kombu.model.job import Job
from ojs_kombu.model.jsonvalue import ensure_json_native
from ojs_kombu.model.naming import job_type_for
from ojs_kombu.model.naming import ojs_queue_for as map_queue_name
from ojs_kombu.model.policies import UNLIMITED_ATTEMPTS, RetryPolicy, UniquePolicy
from ojs_kombu.model.timefmt import format_duration, format_timestamp

#: The ``meta`` key holding what only Dramatiq needs (DESIGN §2).
META_KEY = "dramatiq"
#: Options that never travel: ``eta`` (nothing waits in worker memory; delays go through the
#: broker) and ``retries`` (the ``x-ojs-attempt`` header counts executions).
LOCAL_OPTIONS = frozenset({"eta", "retries", "ojs_unique"})  # ojs_unique: the job's own ``unique``


def job_id_for(message_id: str, timestamp_ms: int) -> str:
    """The OJS job id (a lowercase UUIDv7) of a Dramatiq message, deterministically.

    A UUIDv7 message id is used as it is.  Otherwise the id's 122 random-ish bits
    (a UUID's, or a SHA-256 of any other string) fill the random fields of a
    UUIDv7 whose timestamp is ``message_timestamp``: the same message (a retry,
    a re-enqueue) always gets the same job id, and ids sort by creation time.
    """
    if JOB_ID_RE.match(message_id):
        return message_id
    try:
        bits = uuid.UUID(message_id).int
    except ValueError:
        bits = int.from_bytes(hashlib.sha256(message_id.encode("utf-8")).digest()[:16], "big")
    return uuid7(timestamp_ms, bits >> 64, bits)


@lru_cache(maxsize=1024)
def ojs_queue_for(queue_name: str) -> str:
    """The OJS queue name of a Dramatiq queue name (the same mapping as Celery's queues get).

    Valid OJS names (``default``, ``emails``) are kept; others are lowercased and
    every run of characters outside ``[a-z0-9-.]`` becomes ``-``
    (``high_priority`` -> ``high-priority``).  Raises :class:`ojs_kombu.ValidationError`
    when no valid name results, or for the reserved prefixes ``dlx.``, ``retry.``, ``control.``.
    """
    return map_queue_name(queue_name)


@lru_cache(maxsize=256)
def retry_policy_for(max_retries: int | None, min_backoff: int, max_backoff: int) -> RetryPolicy:
    """The OJS retry policy that describes Dramatiq's ``Retries`` settings (milliseconds).

    ``max_attempts`` = ``max_retries`` + 1.  Dramatiq waits ``min_backoff * 2**(n-1)``
    (×U[1,2)) before retry ``n``; so the OJS policy has ``initial_interval`` =
    ``min_backoff``, ``backoff_coefficient`` 2 and ``max_interval`` = ``max_backoff``.
    Dramatiq's own ``Retries`` middleware keeps deciding for Dramatiq workers;
    the policy tells other OJS workers, and counts lost workers (DESIGN §5).
    """
    attempts = UNLIMITED_ATTEMPTS if max_retries is None else max(0, max_retries) + 1
    initial = max(1, min_backoff)
    fields: dict[str, Any] = {  # only these are set: the others read as the spec defaults
        "max_attempts": attempts,
        "initial_interval": format_duration(timedelta(milliseconds=initial)),
        "max_interval": format_duration(timedelta(milliseconds=max(initial, max_backoff))),
    }
    return RetryPolicy(**fields)


def _wire_options(options: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k not in LOCAL_OPTIONS}


def _meta(message: Message[Any], base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    section: dict[str, Any] = {"actor_name": message.actor_name, "message_id": message.message_id}
    options = _wire_options(message.options)
    if options:
        ensure_json_native(options, "options")
        section["options"] = options
    meta = dict(base or {})
    meta[META_KEY] = section
    return meta


def message_to_job(
    message: Message[Any],
    *,
    retry: RetryPolicy | None = None,
    delay_ms: int | None = None,
    timeout_ms: int | None = None,
    unique: UniquePolicy | Mapping[str, Any] | None = None,
) -> Job:
    """The OJS job for ``message``.

    ``retry`` is the job's retry policy (see :func:`retry_policy_for`),
    ``delay_ms`` schedules it that far ahead (``scheduled_at``, rounded up), and
    ``timeout_ms`` (Dramatiq's ``time_limit``) sets ``timeout`` in whole seconds, and
    ``unique`` (the ``ojs_unique`` option) is the job's unique policy.
    Raises :class:`ojs_kombu.ValidationError` for values JSON cannot carry.
    """
    job = Job.create(
        job_type_for(message.actor_name),
        list(message.args),
        queue=ojs_queue_for(message.queue_name),
        kwargs=message.kwargs or None,
        meta=_meta(message),
        priority=message.options.get("broker_priority"),
        retry=retry,
        scheduled_at=timedelta(milliseconds=delay_ms) if delay_ms else None,
        timeout=math.ceil(timeout_ms / 1000) if timeout_ms else None,
        id=job_id_for(message.message_id, message.message_timestamp),
        unique=unique,
    )
    created = format_timestamp(datetime.fromtimestamp(message.message_timestamp / 1000, UTC))
    return job.model_copy(update={"created_at": created})


def updated_job(job: Job, message: Message[Any]) -> Job:
    """``job`` (as delivered) with the message's current options (middleware change them on retry)."""
    return job.model_copy(update={"meta": _meta(message, job.meta)})


def job_to_message(job: Job, queue_name: str, actor_names: Mapping[str, str] | None = None) -> Message[Any]:
    """The Dramatiq message of a delivered job, for the consumer of Dramatiq queue ``queue_name``.

    ``actor_names`` maps job types to actor names, for jobs enqueued without
    ``meta.dramatiq`` (by another OJS producer).  Raises :class:`ojs_kombu.DecodeError`
    when ``meta.dramatiq`` is malformed.
    """
    meta = job.meta or {}
    section = meta.get(META_KEY) or {}
    if not isinstance(section, dict):
        raise DecodeError(f"meta.{META_KEY} must be an object", code="invalid_envelope", field=f"meta.{META_KEY}")
    actor_name = section.get("actor_name") or (actor_names or {}).get(job.type, job.type)
    message_id = section.get("message_id") or job.id
    options = section.get("options") or {}
    kwargs = job.kwargs
    if (
        not isinstance(actor_name, str)
        or not isinstance(message_id, str)
        or not isinstance(options, dict)
        or not isinstance(kwargs, dict)
    ):
        raise DecodeError(f"meta.{META_KEY} is malformed", code="invalid_envelope", field=f"meta.{META_KEY}")
    options = dict(options)
    if job.attempt:
        options["retries"] = job.attempt
    created = job.created_datetime
    timestamp = round(created.timestamp() * 1000) if created is not None else int(time.time() * 1000)
    return Message(
        queue_name=queue_name,
        actor_name=actor_name,
        args=tuple(job.args),
        kwargs=dict(kwargs),
        options=options,
        message_id=message_id,
        message_timestamp=timestamp,
    )


class OjsEncoder(dramatiq.Encoder):
    """A Dramatiq encoder whose bytes are OJS job envelopes (JSON only).

    :class:`~ojs_dramatiq.OjsBroker` always writes envelopes, whatever
    ``dramatiq.set_encoder`` says; this encoder is for code that calls
    ``Message.encode()`` / ``Message.decode()`` itself.
    """

    def encode(self, data: dict[str, Any]) -> bytes:
        """The envelope of a message given as ``Message.asdict()``."""
        return message_to_job(Message(**data)).to_json().encode("utf-8")

    def decode(self, data: bytes) -> dict[str, Any]:
        """The ``Message`` fields of an envelope (its queue name is the OJS queue)."""
        job = Job.from_json(data, strict=False)
        return job_to_message(job, job.queue).asdict()


__all__ = [
    "LOCAL_OPTIONS",
    "META_KEY",
    "OjsEncoder",
    "UNLIMITED_ATTEMPTS",
    "job_id_for",
    "job_to_message",
    "message_to_job",
    "ojs_queue_for",
    "retry_policy_for",
    "updated_job",
]
