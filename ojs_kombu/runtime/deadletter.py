"""Dead letters: what sits in ``ojs.queue.dlx.{q}``, and how a job is replayed (binding §5.5).

A job reaches its dead letter queue by ``Basic.Nack(requeue=False)`` (RabbitMQ
records why in ``x-death``) or, for messages no handler can run, by a
republish that carries ``x-ojs-error-code`` / ``x-ojs-error-message``.
:class:`DeadLetterEntry` reads both; :func:`replayable` prepares a job for a
second life in its queue (dead-letter spec §6: attempt reset to 0, history
kept, same id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from amqp import Message

from ojs_kombu.errors import DecodeError
from ojs_kombu.model.job import Job
from ojs_kombu.model.timefmt import format_timestamp, utcnow
from ojs_kombu.wire.codec import decode
from ojs_kombu.wire.headers import Header


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if value is None or isinstance(value, str) else str(value)


@dataclass
class DeadLetterEntry:
    """One message of a dead letter queue.

    ``job`` is None when the message is not a valid OJS job (``decode_error``
    then says why).  ``reason`` is RabbitMQ's dead-lettering reason
    (``rejected``, ``expired``, ``maxlen``) or ``"republished"``.
    """

    job: Job | None
    message_id: str | None
    error_code: str | None
    error_message: str | None
    reason: str | None
    death_count: int
    headers: dict[str, Any] = field(repr=False)
    body: bytes = field(repr=False)
    decode_error: str | None = None

    @classmethod
    def from_message(cls, message: Message) -> DeadLetterEntry:
        """Read a py-amqp message fetched from a dead letter queue."""
        properties = dict(message.properties)
        headers = dict(properties.pop("application_headers", None) or {})
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
        deaths = headers.get("x-death") or []
        first = deaths[0] if deaths else {}
        try:
            job, problem = decode(body, properties, headers), None
        except DecodeError as exc:
            job, problem = None, f"{exc.code}: {exc}"
        error = job.error if job is not None else None
        return cls(
            job=job,
            message_id=properties.get("message_id"),
            error_code=_text(headers.get(Header.ERROR_CODE)),
            error_message=_text(headers.get(Header.ERROR_MESSAGE)) or (error.message if error else None),
            reason=_text(first.get("reason")) or ("republished" if Header.ERROR_CODE in headers else None),
            death_count=sum(int(d.get("count", 1)) for d in deaths),
            headers=headers,
            body=body,
            decode_error=problem,
        )


@dataclass(frozen=True)
class ReplayProgress:
    """Where a dead letter replay stands, reported once per window (``replay_dead_letters(progress=)``).

    Attributes:
        total: messages in the dead letter queue when the scan began (``None`` until known).
        scanned: messages fetched so far.
        replayed: jobs republished to their queue and acked so far.
        passed_over: letters moved to the back of the queue so far.
        held: letters fetched and not yet acked now (never more than the window).
    """

    total: int | None
    scanned: int
    replayed: int
    passed_over: int
    held: int


def replayable(job: Job) -> Job:
    """``job`` ready to run again: attempt 0, ``enqueued_at`` now, replay counted in ``meta``."""
    meta = dict(job.meta or {})
    meta["ojs.replay_count"] = int(meta.get("ojs.replay_count", 0) or 0) + 1
    meta["ojs.last_replayed_at"] = format_timestamp(utcnow())
    return job.model_copy(
        update={"attempt": 0, "meta": meta, "enqueued_at": meta["ojs.last_replayed_at"], "state": None}
    )


__all__ = ["DeadLetterEntry", "ReplayProgress", "replayable"]
