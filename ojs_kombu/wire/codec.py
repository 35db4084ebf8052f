"""Job <-> AMQP message: body, properties and ``x-ojs-*`` headers (DESIGN §2).

Producers are strict: :func:`encode` only accepts a valid :class:`~ojs_kombu.Job`
and emits every property and header the binding asks for.  Consumers are
tolerant: :func:`decode` accepts envelopes from other OJS producers (missing
``specversion``, uppercase ids, missing properties or headers) and falls back
to the body wherever the properties are silent.  Anything it cannot turn into a
job raises :class:`~ojs_kombu.errors.DecodeError` with an OJS error code, which
the worker writes to ``x-ojs-error-code`` when it dead-letters the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.body import MAX_ENVELOPE_BYTES, BodyError, read_envelope
from ojs_kombu.model.job import Job
from ojs_kombu.model.policies import DEFAULT_MAX_ATTEMPTS, RetryPolicy
from ojs_kombu.model.timefmt import format_timestamp, parse_timestamp
from ojs_kombu.wire.headers import Header

CONTENT_TYPE = "application/openjobspec+json"
CONTENT_ENCODING = "utf-8"
DEFAULT_APP_ID = "ojs"
#: Content types a consumer accepts as an OJS envelope.  Everything else
#: (pickle, yaml, msgpack, ...) is refused: JSON only.
ACCEPTED_CONTENT_TYPES = frozenset({CONTENT_TYPE, "application/json"})
AMQP_MAX_PRIORITY = 9


@dataclass
class OutgoingMessage:
    """An encoded job, ready for ``Basic.Publish``.

    ``properties`` are the AMQP basic properties (py-amqp names, without
    ``application_headers``); ``headers`` is the headers table.
    """

    body: bytes
    properties: dict[str, Any]
    headers: dict[str, Any] = field(default_factory=dict)


def amqp_priority(priority: int | None) -> int | None:
    """OJS priority (higher first, unbounded) -> AMQP priority 0..9 (DESIGN §8)."""
    if priority is None:
        return None
    return max(0, min(AMQP_MAX_PRIORITY, int(priority)))


def max_attempts_of(job: Job) -> int:
    """The total number of attempts the job may make (its policy, or the OJS default 3)."""
    return job.retry.max_attempts if job.retry is not None else DEFAULT_MAX_ATTEMPTS


def encode(job: Job, *, app_id: str | None = None, headers: Mapping[str, Any] | None = None) -> OutgoingMessage:
    """Encode ``job`` as an OJS AMQP message.

    ``headers`` are merged over the generated ``x-ojs-*`` headers (the retry path
    uses it to carry error headers and the caller's own headers).  The envelope
    is refused with ValidationError if it exceeds 1 MiB.
    """
    body = encode_body(job)
    properties: dict[str, Any] = {
        "message_id": job.id,
        "type": job.type,
        "content_type": CONTENT_TYPE,
        "content_encoding": CONTENT_ENCODING,
        "delivery_mode": 2,
        "app_id": app_id or DEFAULT_APP_ID,
    }
    if job.created_at is not None:
        properties["timestamp"] = _epoch_seconds(job.created_at)  # binding §6.1
    priority = amqp_priority(job.priority)
    if priority is not None:
        properties["priority"] = priority
    table: dict[str, Any] = {
        Header.QUEUE: job.queue,
        Header.ATTEMPT: job.attempt + 1,
        Header.MAX_ATTEMPTS: max_attempts_of(job),
    }
    _set_if(table, Header.CREATED_AT, job.created_at)
    _set_if(table, Header.ENQUEUED_AT, job.enqueued_at)
    _set_if(table, Header.SCHEDULED_AT, job.scheduled_at)
    meta = job.meta or {}
    tags = meta.get("tags")
    if isinstance(tags, list) and tags:
        table[Header.TAGS] = ",".join(str(t) for t in tags)
    _set_if(table, Header.TRACE_ID, meta.get("traceparent"))
    _set_if(table, Header.TRACE_STATE, meta.get("tracestate"))
    if headers:
        table.update(headers)
    return OutgoingMessage(body=body, properties=properties, headers=table)


def encode_body(job: Job) -> bytes:
    """The message body of ``job``: its envelope as compact UTF-8 JSON (what :func:`encode` sends).

    Raises:
        ValidationError: the envelope exceeds 1 MiB.
        TypeError, ValueError: a job built without validation holds a value JSON cannot carry.
    """
    body = job.to_json_bytes()
    if len(body) > MAX_ENVELOPE_BYTES:
        raise ValidationError(
            f"job envelope is {len(body)} bytes; OJS envelopes are limited to {MAX_ENVELOPE_BYTES} bytes",
            field="args",
        )
    return body


_KEY_TYPES = frozenset({str, int, type(None)})  # exact types: True == 1 == 1.0 but each encodes differently


def properties_key(job: Job, app_id: str | None = None) -> tuple[Any, ...] | None:
    """What :func:`encode` makes of ``job``'s properties and headers, its id apart, as a hashable key.

    Two jobs with equal keys get equal properties and headers from ``encode(job, app_id=app_id)``
    but for ``message_id``, so a publisher may encode them once per key (a batch's jobs differ in
    little but their ids).  The key holds the values ``encode`` reads: type, queue, the three
    timestamps, attempt, max attempts, priority, the tags as their header, the trace context,
    the app id.

    Parameters:
        job: the job.
        app_id: as for :func:`encode`.

    Returns:
        The key, or None when one of those values is not a plain ``str`` / ``int`` / None, or the
        id not a ``str`` (a job built without validation): encode such a job with :func:`encode`.
    """
    try:
        state = job.__dict__
        retry = state["retry"]
        meta = state["meta"]
        tags = traceparent = tracestate = None
        if meta:
            tags = meta.get("tags")
            tags = ",".join(str(t) for t in tags) if isinstance(tags, list) and tags else None
            traceparent = meta.get("traceparent")
            tracestate = meta.get("tracestate")
        key = (
            state["type"],
            state["queue"],
            state["created_at"],
            state["enqueued_at"],
            state["scheduled_at"],
            state["attempt"],
            DEFAULT_MAX_ATTEMPTS if retry is None else retry.max_attempts,
            state["priority"],
            tags,
            traceparent,
            tracestate,
            app_id or DEFAULT_APP_ID,
        )
    except (KeyError, AttributeError, TypeError):  # built without validation: encode says what is wrong
        return None
    return key if _KEY_TYPES.issuperset(map(type, key)) and type(state["id"]) is str else None


@lru_cache(maxsize=256)  # a batch's jobs share a few created_at stamps: parse each once
def _epoch_seconds(timestamp: str) -> int:
    """An OJS timestamp as whole seconds since the Unix epoch (the AMQP ``timestamp`` property)."""
    return int(parse_timestamp(timestamp).timestamp())


def _set_if(table: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        table[key] = value


def decode(
    body: bytes | str, properties: Mapping[str, Any] | None = None, headers: Mapping[str, Any] | None = None
) -> Job:
    """Decode a delivered message into a :class:`Job`, tolerantly (DESIGN §2).

    The body is the authority; properties and headers fill what it lacks
    (``message_id`` -> ``id``, ``type`` -> ``type``, ``x-ojs-queue`` -> ``queue``).
    ``x-ojs-attempt`` (1-based, this delivery) sets ``job.attempt`` to the number
    of executions before this one.  A job without a retry policy but with an
    ``x-ojs-max-attempts`` header gets ``retry.max_attempts`` from it.

    Raises :class:`DecodeError` (with ``.code``) when the message is not an OJS job.
    """
    properties = properties or {}
    headers = headers or {}
    content_type = properties.get("content_type")
    if (
        content_type
        and content_type != CONTENT_TYPE  # what this library sends: nothing to normalise
        and content_type.split(";")[0].strip().lower() not in ACCEPTED_CONTENT_TYPES
    ):
        raise DecodeError(
            f"content type {content_type!r} is not an OJS envelope (JSON only)",
            code="unsupported_content_type",
        )
    encoding = properties.get("content_encoding")
    if encoding and encoding != CONTENT_ENCODING and encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
        raise DecodeError(f"content encoding {encoding!r} is not UTF-8", code="unsupported_content_encoding")
    try:
        data, native = read_envelope(body, tolerant=True)
    except BodyError as exc:
        raise DecodeError(f"body {exc}", code=exc.code) from None
    _fill_from_properties(data, properties, headers)
    attempt = _int_header(headers, Header.ATTEMPT, minimum=1)
    if attempt is not None:
        data["attempt"] = attempt - 1
    try:
        job = Job.from_json(data, strict=False, native=native)
    except ValidationError as exc:
        raise DecodeError(str(exc), code="invalid_envelope", field=exc.field) from None
    max_attempts = _int_header(headers, Header.MAX_ATTEMPTS, minimum=0)
    if max_attempts is not None and job.retry is None and max_attempts != DEFAULT_MAX_ATTEMPTS:
        job = job.model_copy(update={"retry": RetryPolicy(max_attempts=max_attempts)})
    return job


def _fill_from_properties(data: dict[str, Any], properties: Mapping[str, Any], headers: Mapping[str, Any]) -> None:
    if "id" not in data and properties.get("message_id"):
        data["id"] = properties["message_id"]
    if "type" not in data and properties.get("type"):
        data["type"] = properties["type"]
    if "queue" not in data:
        queue = headers.get(Header.QUEUE)
        if isinstance(queue, bytes):
            queue = queue.decode("utf-8", "replace")
        if isinstance(queue, str):
            data["queue"] = queue
    if "created_at" not in data:
        created = headers.get(Header.CREATED_AT)
        if isinstance(created, str):
            data["created_at"] = created
        elif isinstance(properties.get("timestamp"), (int, datetime)) and not isinstance(properties["timestamp"], bool):
            ts = properties["timestamp"]  # epoch seconds (py-amqp), or a datetime (other clients)
            if isinstance(ts, int):
                ts = datetime.fromtimestamp(ts, tz=UTC)
            data["created_at"] = format_timestamp(ts if ts.tzinfo else ts.replace(tzinfo=UTC))


def _int_header(headers: Mapping[str, Any], name: str, *, minimum: int) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecodeError(
            f"header {name} must be an integer, got {type(value).__name__} {value!r}",
            code="invalid_header",
            field=name,
        )
    if value < minimum:
        raise DecodeError(f"header {name} must be >= {minimum}, got {value}", code="invalid_header", field=name)
    return value


__all__ = [
    "ACCEPTED_CONTENT_TYPES",
    "CONTENT_ENCODING",
    "CONTENT_TYPE",
    "DEFAULT_APP_ID",
    "DEFAULT_MAX_ATTEMPTS",
    "OutgoingMessage",
    "amqp_priority",
    "decode",
    "encode",
    "encode_body",
    "max_attempts_of",
    "properties_key",
]
