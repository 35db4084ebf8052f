"""Control messages and the control stream's arguments (binding §5.6; DESIGN §14).

A control message goes to ``ojs.exchange.direct`` with routing key
``control.{q}`` and lands in the stream ``ojs.queue.control.{q}``.  Properties:
``type`` (``ojs.control.cancel`` ...), ``content_type=application/json``, a
unique ``message_id`` and ``timestamp``; body ``{"job_id": …}`` for a cancel,
``{"queue": …}`` for a pause or a resume (``ojs.control.pause`` /
``ojs.control.resume``, an extension of the binding).

INFO (binding §5.8, AMQP-021) is an RPC over the same stream: the request
(:func:`info_message`) has ``type=ojs.control.info``, body ``{"job_id": …}``
and the properties ``reply_to`` (the asking client's exclusive, auto-delete,
server-named queue) and ``correlation_id``.  Each worker that knows the job
replies (:func:`info_reply`) through the default exchange with routing key =
``reply_to``: ``type=ojs.control.info.reply``, the request's ``correlation_id``
echoed, body the :class:`~ojs_kombu.model.info.JobInfo` JSON; read back with
:func:`decode_info_reply`.

Pure functions: :mod:`ojs_kombu.client` publishes what :func:`cancel_message`,
:func:`pause_message` and :func:`info_message` build, :mod:`ojs_kombu.runtime.control`
reads what :func:`decode_control` returns.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.naming import (
    CONTROL_TYPE_CANCEL,
    CONTROL_TYPE_INFO,
    CONTROL_TYPE_PAUSE,
    CONTROL_TYPE_RESUME,
    validate_queue_name,
)
from ojs_kombu.model.timefmt import utcnow
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.entities import stream_arguments

CONTROL_CONTENT_TYPE = "application/json"
#: A worker's own catch-up marker (DESIGN §14): published to the control stream at start,
#: it tells the worker that everything before it has been replayed.  Other readers ignore it.
CONTROL_TYPE_MARKER = "ojs.control.marker"
#: The ``type`` property of a worker's answer to an INFO request (its body: a JobInfo).
CONTROL_TYPE_INFO_REPLY = "ojs.control.info.reply"
#: The final failure of a job nacked into its dead letter queue (``dead_letter_mode="nack"``): a
#: ``Basic.Nack`` cannot change the message, so the failure is recorded here first and the readers of
#: the dead letter queue join it to the letter (:func:`final_failure_message`).  Workers ignore it.
CONTROL_TYPE_FINAL_FAILURE = "ojs.control.final-failure"
#: A control body larger than this is not a control message (a cancel body is ~60 bytes).
MAX_CONTROL_BYTES = 64 * 1024
#: How much of an error message a final-failure record keeps (characters).
MAX_FAILURE_MESSAGE = 4096

_MAX_AGE = re.compile(r"^[1-9][0-9]*(Y|M|D|h|m|s)$")


@dataclass(frozen=True)
class ControlOptions:
    """Retention of the control streams ``ojs.queue.control.{q}`` (DESIGN §14).

    RabbitMQ trims a stream by whole segments, so a small segment size makes the
    age and size limits bite; a cancel record is ~370 bytes on disk (measured: 100,000 cancels, 37.2 MB).

    Parameters:
        max_age: ``x-max-age`` (RabbitMQ units ``Y M D h m s``); the default outlives
            the longest delay the scheduling cascade carries (397.7 days), so a
            cancel still reaches a job scheduled that far ahead.
        max_length_bytes: ``x-max-length-bytes``: the stream's size cap.
        max_segment_size_bytes: ``x-stream-max-segment-size-bytes``.

    Raises:
        ValidationError: an option is malformed.
    """

    max_age: str = "400D"
    max_length_bytes: int = 50_000_000
    max_segment_size_bytes: int = 1_000_000

    def __post_init__(self) -> None:
        if not isinstance(self.max_age, str) or _MAX_AGE.fullmatch(self.max_age) is None:
            raise ValidationError(
                f"max_age must look like '400D' (units Y, M, D, h, m, s), got {self.max_age!r}", field="max_age"
            )
        for name in ("max_length_bytes", "max_segment_size_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError(f"{name} must be a positive integer, got {value!r}", field=name)

    def arguments(self) -> dict[str, Any]:
        """The arguments of the control stream."""
        return stream_arguments(self.max_age, self.max_length_bytes, self.max_segment_size_bytes)


@dataclass(frozen=True)
class ControlMessage:
    """A decoded control message: its ``type`` property, JSON body and the RPC properties.

    ``reply_to`` and ``correlation_id`` are those of an INFO request; ``timestamp``
    is when it was published (aware UTC, whole seconds), if it says.
    """

    type: str
    message_id: str | None
    body: dict[str, Any]
    reply_to: str | None = None
    correlation_id: str | None = None
    timestamp: datetime | None = None

    @property
    def job_id(self) -> str | None:
        """The body's ``job_id`` (lowercased, as consumers accept uppercase ids), if a string."""
        value = self.body.get("job_id")
        return value.lower() if isinstance(value, str) and value else None


def json_message(
    type: str, body: dict[str, Any], *, sent_at: datetime | None = None, **properties: Any
) -> OutgoingMessage:
    """A JSON message of the control plane (DESIGN §14): control and events streams alike.

    Properties: ``type``, ``content_type=application/json``, ``content_encoding=utf-8``, a
    unique ``message_id``, ``timestamp`` (whole seconds) and ``app_id=ojs``.

    Parameters:
        type: the ``type`` property.
        body: the JSON body.
        sent_at: the time for ``timestamp`` (default: now).
        properties: further AMQP properties (``reply_to``, ``correlation_id``, ``delivery_mode`` …).

    Returns:
        The message, ready to publish.
    """
    return OutgoingMessage(
        json.dumps(body, separators=(",", ":")).encode("utf-8"),
        {
            "type": type,
            "content_type": CONTROL_CONTENT_TYPE,
            "content_encoding": "utf-8",
            "message_id": str(uuid.uuid4()),
            "timestamp": int((sent_at or utcnow()).timestamp()),
            "app_id": "ojs",
            **properties,
        },
    )


def control_message(type: str, body: dict[str, Any], **properties: Any) -> OutgoingMessage:
    """A persistent control message (:func:`json_message` with ``delivery_mode=2``).

    Parameters:
        type: the ``type`` property.
        body: the JSON body.
        properties: further AMQP properties (``reply_to``, ``correlation_id``, ``delivery_mode`` …).

    Returns:
        The message, ready to publish.
    """
    return json_message(type, body, **{"delivery_mode": 2, **properties})


def control_job_id(job_id: str) -> str:
    """The ``job_id`` of a cancel or INFO body: stripped, lowercase.

    Raises:
        ValidationError: ``job_id`` is not a non-empty string.
    """
    if not isinstance(job_id, str) or not job_id.strip():
        raise ValidationError(f"job_id must be a non-empty string, got {job_id!r}", field="job_id")
    return job_id.strip().lower()


def cancel_message(job_id: str) -> OutgoingMessage:
    """CANCEL (binding §5.6, AMQP-019): ``type=ojs.control.cancel``, body ``{"job_id": …}``.

    Raises:
        ValidationError: ``job_id`` is not a non-empty string.
    """
    return control_message(CONTROL_TYPE_CANCEL, {"job_id": control_job_id(job_id)})


def info_message(job_id: str, *, reply_to: str, correlation_id: str) -> OutgoingMessage:
    """INFO request (binding §5.8, AMQP-021): ``type=ojs.control.info``, body ``{"job_id": …}``,
    with ``reply_to`` and ``correlation_id``.

    It is published persistent like every control message (the stream keeps it;
    workers ignore requests older than a few seconds, so a replayed one goes unanswered).

    Parameters:
        job_id: the job asked about.
        reply_to: the queue the answers go to (through the default exchange).
        correlation_id: echoed in every answer.

    Raises:
        ValidationError: an argument is not a non-empty string.
    """
    for name, value in (("reply_to", reply_to), ("correlation_id", correlation_id)):
        if not isinstance(value, str) or not value:
            raise ValidationError(f"{name} must be a non-empty string, got {value!r}", field=name)
    return control_message(
        CONTROL_TYPE_INFO, {"job_id": control_job_id(job_id)}, reply_to=reply_to, correlation_id=correlation_id
    )


def info_reply(info: JobInfo, *, correlation_id: str | None) -> OutgoingMessage:
    """A worker's answer to an INFO request: ``type=ojs.control.info.reply``, the request's
    ``correlation_id``, body ``info`` as JSON; transient (it goes to an exclusive queue).

    Parameters:
        info: what the worker knows about the job.
        correlation_id: the request's (None: the request had none, the reply has none).
    """
    properties: dict[str, Any] = {"delivery_mode": 1}
    if correlation_id is not None:
        properties["correlation_id"] = correlation_id
    return control_message(CONTROL_TYPE_INFO_REPLY, info.to_dict(), **properties)


def decode_info_reply(body: bytes, properties: dict[str, Any]) -> tuple[str | None, JobInfo]:
    """Read an INFO reply.

    Returns:
        Its ``correlation_id`` (None if it has none) and the :class:`JobInfo`.

    Raises:
        DecodeError: not an INFO reply, or its body is not a valid job info.
    """
    message = decode_control(body, properties)
    if message.type != CONTROL_TYPE_INFO_REPLY:
        raise DecodeError(
            f"expected an {CONTROL_TYPE_INFO_REPLY} message, got {message.type!r}", code="invalid_payload"
        )
    try:
        info = JobInfo.from_dict(message.body)
    except ValidationError as exc:
        raise DecodeError(f"an INFO reply is not a job info: {exc}", code="invalid_payload") from None
    return message.correlation_id, info


def pause_message(queue: str, *, paused: bool = True) -> OutgoingMessage:
    """PAUSE or RESUME a queue: ``type=ojs.control.pause`` (``ojs.control.resume`` when
    ``paused`` is False), body ``{"queue": …}``.

    Parameters:
        queue: the OJS queue.
        paused: True to pause, False to resume.

    Raises:
        ValidationError: a bad queue name.
    """
    validate_queue_name(queue)
    return control_message(CONTROL_TYPE_PAUSE if paused else CONTROL_TYPE_RESUME, {"queue": queue})


def final_failure_message(
    job_id: str,
    *,
    attempt: int,
    replays: int,
    code: str,
    type: str,
    message: str,
    failed_at: str,
) -> OutgoingMessage:
    """The record of the final failure of a job about to be nacked into its dead letter queue.

    Published (confirmed) to ``control.{q}`` before the ``Basic.Nack``; readers of the dead
    letter queue join it to the letter whose job id, attempt (its ``x-ojs-attempt``) and
    replay count (``meta["ojs.replay_count"]``) match, the latest record winning.

    Parameters:
        job_id: the job's id.
        attempt: the attempt that failed (1-based: the delivery's ``x-ojs-attempt``).
        replays: how many times the job was replayed from its dead letter queue.
        code, type, message: the failure (the message is cut to :data:`MAX_FAILURE_MESSAGE` characters).
        failed_at: when it failed (RFC 3339).

    Returns:
        The control message, ready to publish.
    """
    body = {
        "job_id": control_job_id(job_id),
        "attempt": attempt,
        "replays": replays,
        "error": {"code": code, "type": type, "message": message[:MAX_FAILURE_MESSAGE]},
        "failed_at": failed_at,
    }
    return control_message(CONTROL_TYPE_FINAL_FAILURE, body)


def decode_control(body: bytes, properties: dict[str, Any]) -> ControlMessage:
    """Read a control message; tolerant of other producers (no content type, extra fields).

    Raises:
        DecodeError: the body is not a JSON object, or the ``type`` property is missing.
    """
    kind = properties.get("type")
    if not isinstance(kind, str) or not kind:
        raise DecodeError("a control message needs a type property", code="invalid_payload")
    if len(body) > MAX_CONTROL_BYTES:
        raise DecodeError(f"a control message body is {len(body)} bytes", code="invalid_payload")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DecodeError(f"a control message body is not JSON: {exc}", code="invalid_payload") from None
    if not isinstance(data, dict):
        raise DecodeError("a control message body must be a JSON object", code="invalid_payload")
    return ControlMessage(
        kind,
        _text(properties.get("message_id")),
        data,
        reply_to=_text(properties.get("reply_to")),
        correlation_id=_text(properties.get("correlation_id")),
        timestamp=_published_at(properties.get("timestamp")),
    )


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) and value else None


def _published_at(value: Any) -> datetime | None:
    """The ``timestamp`` property: py-amqp reads it as a naive UTC datetime, others may pass seconds."""
    if isinstance(value, datetime):
        return value if value.utcoffset() is not None else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            return None
    return None


__all__ = [
    "CONTROL_CONTENT_TYPE",
    "CONTROL_TYPE_FINAL_FAILURE",
    "CONTROL_TYPE_INFO_REPLY",
    "CONTROL_TYPE_MARKER",
    "ControlMessage",
    "ControlOptions",
    "cancel_message",
    "final_failure_message",
    "control_job_id",
    "control_message",
    "decode_control",
    "decode_info_reply",
    "info_message",
    "info_reply",
    "pause_message",
]
