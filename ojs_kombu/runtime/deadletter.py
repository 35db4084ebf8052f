"""Dead letters: what sits in ``ojs.queue.dlx.{q}``, and how a job is replayed (binding §5.5).

A job reaches its dead letter queue by ``Basic.Nack(requeue=False)`` (RabbitMQ
records why in ``x-death``) or, for messages no handler can run, by a
republish that carries ``x-ojs-error-code`` / ``x-ojs-error-message``.
:class:`DeadLetterEntry` reads both; :func:`replayable` prepares a job for a
second life in its queue (dead-letter spec §6: attempt reset to 0, history
kept, same id).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from amqp import Message

from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.job import Job, framework_ids
from ojs_kombu.model.timefmt import format_timestamp, parse_timestamp, utcnow
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

    @property
    def letter_id(self) -> str:
        """The job's id, or the ``message_id`` of a letter that is not an OJS job (lowercase)."""
        return self.job.id if self.job is not None else str(self.message_id).lower()

    @property
    def error_codes(self) -> list[str]:
        """Every error code the letter carries: ``x-ojs-error-code``, ``error.type``, the codes of ``errors[]``."""
        codes = [self.error_code] if self.error_code else []
        if self.job is not None:
            codes += [self.job.error.type] if self.job.error is not None else []
            codes += [str(e["code"]) for e in self.job.errors or () if isinstance(e, dict) and e.get("code")]
        return codes

    @property
    def dead_at(self) -> datetime | None:
        """When the letter was dead-lettered: its first ``x-death`` time, else its job's latest
        ``errors[].occurred_at``; None when neither is known."""
        deaths = self.headers.get("x-death") or []
        when = deaths[0].get("time") if deaths and isinstance(deaths[0], dict) else None
        if isinstance(when, datetime):
            return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
        errors = [e for e in (self.job.errors or ()) if isinstance(e, dict)] if self.job is not None else []
        if errors and isinstance(errors[-1].get("occurred_at"), str):
            try:
                return parse_timestamp(errors[-1]["occurred_at"])
            except ValidationError:
                return None
        return None


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a listing, replay or purge acts on: all the given criteria must hold.

    Attributes:
        types: the job's type is one of these (a letter that is not an OJS job never matches).
        error: an error code the letter carries (:attr:`DeadLetterEntry.error_codes`, exact,
            any case), or text found in its error message (any case).
        since: dead-lettered at or after this aware datetime (:attr:`DeadLetterEntry.dead_at`;
            a letter whose time is unknown never matches).
        ids: its :attr:`DeadLetterEntry.letter_id`, or the framework's own id its job carries
            (:func:`~ojs_kombu.model.job.framework_ids`: a Dramatiq ``message_id``), is one of
            these (any case).

    Raises:
        ValidationError: ``since`` is a naive datetime.
    """

    types: frozenset[str] | None = None
    error: str | None = None
    since: datetime | None = None
    ids: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.since.utcoffset() is None:
            raise ValidationError(f"since must be an aware datetime, got {self.since!r}", field="since")

    @classmethod
    def of(
        cls,
        *,
        types: Iterable[str] | None = None,
        error: str | None = None,
        since: datetime | None = None,
        ids: Iterable[str] | None = None,
    ) -> DeadLetterFilter:
        """A filter from plain arguments (``None`` or empty: no criterion)."""
        return cls(
            types=frozenset(types) if types else None,
            error=error or None,
            since=since,
            ids=frozenset(i.strip().lower() for i in ids) if ids else None,
        )

    def __call__(self, entry: DeadLetterEntry) -> bool:
        """Whether ``entry`` matches every criterion."""
        if self.types is not None and (entry.job is None or entry.job.type not in self.types):
            return False
        if self.ids is not None and entry.letter_id not in self.ids:
            if entry.job is None or self.ids.isdisjoint(framework_ids(entry.job)):
                return False
        if self.error is not None:
            wanted = self.error.lower()
            codes = {code.lower() for code in entry.error_codes}
            if wanted not in codes and wanted not in (entry.error_message or "").lower():
                return False
        if self.since is not None:
            dead_at = entry.dead_at
            if dead_at is None or dead_at < self.since:
                return False
        return True


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


__all__ = ["DeadLetterEntry", "DeadLetterFilter", "ReplayProgress", "replayable"]
