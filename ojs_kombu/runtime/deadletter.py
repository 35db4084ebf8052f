"""Dead letters: what sits in ``ojs.queue.dlx.{q}``, and how a job is replayed (binding §5.5).

A job reaches its dead letter queue by ``Basic.Nack(requeue=False)`` (RabbitMQ
records why in ``x-death``) or by a republish that carries the final failure
(``dead_letter_mode="republish"``, and messages no handler can run) in
``x-ojs-error-code`` / ``x-ojs-error-message`` and the envelope.

A nack cannot change the message: the letter's envelope still tells the
*previous* attempt's error.  So before it nacks, a worker records the final
failure (confirmed) in the queue's control stream
(:func:`~ojs_kombu.wire.control.final_failure_message`), and the readers join it
to the letter (:func:`read_final_failures`, :class:`FinalFailureJoin`), keyed by
job id, attempt and replay count, the latest record winning.

:class:`DeadLetterEntry` reads every kind; :func:`replayable` prepares a job for a
second life in its queue (dead-letter spec §6: attempt reset to 0, history
kept, same id).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from amqp import Message
from amqp.exceptions import NotFound, RecoverableConnectionError

from ojs_kombu.amqp.connection import close_quietly
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import DecodeError, OjsError, ValidationError
from ojs_kombu.model.job import Job, framework_ids
from ojs_kombu.model.naming import Names
from ojs_kombu.model.timefmt import format_timestamp, parse_timestamp, utcnow
from ojs_kombu.policy.retry import replay_count
from ojs_kombu.runtime.control import Cancellations, ControlReader
from ojs_kombu.wire.codec import decode
from ojs_kombu.wire.control import CONTROL_TYPE_FINAL_FAILURE, ControlMessage
from ojs_kombu.wire.headers import Header

#: What a final-failure record is filed under: (job id, attempt, replay count).
FailureKey = tuple[str, int, int]


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if value is None or isinstance(value, str) else str(value)


def _time(value: Any) -> datetime | None:
    """An ``x-death`` time (a naive UTC datetime from py-amqp) or an RFC 3339 text, as an aware datetime."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            return parse_timestamp(value)
        except ValidationError:
            return None
    return None


@dataclass(frozen=True)
class FinalFailure:
    """The failure that sent a job to its dead letter queue, as a worker recorded it before its nack.

    Attributes:
        attempt: the attempt that failed (1-based).
        code: the OJS error code (``handler_error``, ``worker_lost`` ...).
        type: the error type (the exception's class name).
        message: the error message.
        failed_at: when it failed.
    """

    attempt: int
    code: str | None
    type: str | None
    message: str | None
    failed_at: datetime | None


def final_failure_of(control: ControlMessage) -> tuple[FailureKey, FinalFailure] | None:
    """The key and failure of a final-failure record; None for another control message or a bad record."""
    if control.type != CONTROL_TYPE_FINAL_FAILURE or control.job_id is None:
        return None
    body = control.body
    attempt, replays, error = body.get("attempt"), body.get("replays", 0), body.get("error")
    if not isinstance(attempt, int) or not isinstance(replays, int) or not isinstance(error, dict):
        return None
    failure = FinalFailure(
        attempt=attempt,
        code=_text(error.get("code")),
        type=_text(error.get("type")),
        message=_text(error.get("message")),
        failed_at=_time(body.get("failed_at")),
    )
    return (control.job_id, attempt, replays), failure


def read_final_failures(
    connection: Any, names: Names, topology: Topology, queue: str, *, timeout: float = 10.0
) -> dict[FailureKey, FinalFailure]:
    """The final-failure records of ``queue``'s nacked jobs: its control stream read to the end.

    Nothing is declared when the control stream does not exist (nothing was recorded then).
    Reading costs what replaying the stream costs a starting worker (every retained cancel
    is read too).

    Parameters:
        connection: an open py-amqp connection (used by this thread only meanwhile).
        names, topology: the entity names, and the topology that knows the control stream.
        queue: the OJS queue.
        timeout: seconds to wait for the stream to be read.

    Returns:
        The latest record of each (job id, attempt, replay count); empty when the control
        queue is missing or is not a stream (degraded: records are not kept).

    Raises:
        OjsError: the stream was not read within ``timeout``.
    """
    amqp_queue = names.control_queue(queue)
    probe = connection.channel()
    try:
        probe.queue_declare(amqp_queue, passive=True)
    except NotFound:
        return {}
    finally:
        close_quietly(probe)
    topology.declare(connection, topology.control_specs(queue))
    if not topology.control_is_stream(queue):
        return {}
    found: dict[FailureKey, FinalFailure] = {}

    def on_other(_: str, control: ControlMessage) -> None:
        record = final_failure_of(control)
        if record is not None:
            found[record[0]] = record[1]  # stream order: the latest record wins

    reader = ControlReader(names, topology, [queue], Cancellations(), replay_timeout=timeout, on_other=on_other)
    try:
        close_quietly(reader.attach(connection))
    except RecoverableConnectionError as exc:
        raise OjsError(f"reading the final failures of {queue}'s dead letters: {exc}") from None
    return found


@dataclass
class DeadLetterEntry:
    """One message of a dead letter queue, and the failure that put it there.

    ``job`` is None when the message is not a valid OJS job (``decode_error``
    then says why).  ``reason`` is RabbitMQ's dead-lettering reason
    (``rejected``, ``expired``, ``maxlen``) or ``"republished"``.

    The final failure: ``attempt`` (the attempt that failed last, 1-based; 0 for a job
    refused before it ran), ``error_code``, ``error_type``, ``error_message`` and
    ``failed_at``.  For a nacked letter (``reason == "rejected"``) they come from the
    record its worker made before the nack (:meth:`join`); without one (a letter nacked by
    another consumer, or by an older version) the error is unknown (None) and only
    ``attempt`` and ``failed_at`` (the nack's time) are known; the earlier errors stay in
    ``job.errors``.
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
    attempt: int | None = None
    error_type: str | None = None
    failed_at: datetime | None = None

    @classmethod
    def from_message(cls, message: Message) -> DeadLetterEntry:
        """Read a py-amqp message fetched from a dead letter queue."""
        properties = dict(message.properties)
        headers = dict(properties.pop("application_headers", None) or {})
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
        deaths = headers.get("x-death") or []
        first = deaths[0] if deaths and isinstance(deaths[0], dict) else {}
        try:
            job, problem = decode(body, properties, headers), None
        except DecodeError as exc:
            job, problem = None, f"{exc.code}: {exc}"
        reason = _text(first.get("reason")) or ("republished" if Header.ERROR_CODE in headers else None)
        entry = cls(
            job=job,
            message_id=properties.get("message_id"),
            error_code=_text(headers.get(Header.ERROR_CODE)),
            error_message=_text(headers.get(Header.ERROR_MESSAGE)),
            reason=reason,
            death_count=sum(int(d.get("count", 1)) for d in deaths),
            headers=headers,
            body=body,
            decode_error=problem,
        )
        if job is None:
            return entry
        if reason == "rejected":
            # Nacked after the attempt its x-ojs-attempt names; the envelope and the error
            # headers still tell the attempt before: the final error comes from its record.
            entry.attempt = job.attempt + 1
            entry.error_code = entry.error_message = None
            entry.failed_at = _time(first.get("time"))
            return entry
        # Republished with its final failure, or dead-lettered while it waited (expired,
        # maxlen): the envelope's last error is the last failure.
        entry.attempt = job.attempt
        entry.error_type = job.error.type if job.error is not None else None
        entry.error_message = entry.error_message or (job.error.message if job.error is not None else None)
        last = job.errors[-1] if job.errors and isinstance(job.errors[-1], dict) else None
        if last is not None and last.get("attempt") == job.attempt:
            entry.error_code = entry.error_code or _text(last.get("code"))
            entry.failed_at = _time(last.get("occurred_at"))
        return entry

    @property
    def awaits_final_failure(self) -> bool:
        """Whether the letter was nacked by a worker and its final failure is not known yet."""
        return self.job is not None and self.reason == "rejected" and self.error_code is None

    @property
    def failure_key(self) -> FailureKey | None:
        """What its final-failure record is filed under, for a nacked OJS job; else None."""
        if self.job is None or self.attempt is None:
            return None
        return self.job.id, self.attempt, replay_count(self.job)

    def join(self, failures: dict[FailureKey, FinalFailure]) -> DeadLetterEntry:
        """Take the final failure of a nacked letter from its record in ``failures``, if there is one.

        Returns:
            This entry.
        """
        key = self.failure_key
        failure = failures.get(key) if key is not None and self.awaits_final_failure else None
        if failure is not None:
            self.error_code = failure.code
            self.error_type = failure.type
            self.error_message = failure.message
            self.failed_at = failure.failed_at or self.failed_at
        return self

    @property
    def letter_id(self) -> str:
        """The job's id, or the ``message_id`` of a letter that is not an OJS job (lowercase)."""
        return self.job.id if self.job is not None else str(self.message_id).lower()

    @property
    def error_codes(self) -> list[str]:
        """Every error code the letter carries: the final failure's code and type, ``x-ojs-error-code``,
        ``error.type``, the codes of ``errors[]``."""
        codes = [code for code in (self.error_code, self.error_type) if code]
        header = _text(self.headers.get(Header.ERROR_CODE))
        codes += [header] if header else []
        if self.job is not None:
            codes += [self.job.error.type] if self.job.error is not None else []
            codes += [str(e["code"]) for e in self.job.errors or () if isinstance(e, dict) and e.get("code")]
        return codes

    @property
    def error_messages(self) -> list[str]:
        """Every error message the letter carries: the final failure's, ``error.message``, those of ``errors[]``."""
        messages = [self.error_message] if self.error_message else []
        if self.job is not None:
            messages += [self.job.error.message] if self.job.error is not None and self.job.error.message else []
            messages += [str(e["message"]) for e in self.job.errors or () if isinstance(e, dict) and e.get("message")]
        return messages

    @property
    def dead_at(self) -> datetime | None:
        """When the letter was dead-lettered: its first ``x-death`` time, else its final failure's
        time, else its job's latest ``errors[].occurred_at``; None when none is known."""
        deaths = self.headers.get("x-death") or []
        when = _time(deaths[0].get("time")) if deaths and isinstance(deaths[0], dict) else None
        if when is not None:
            return when
        if self.failed_at is not None:
            return self.failed_at
        errors = [e for e in (self.job.errors or ()) if isinstance(e, dict)] if self.job is not None else []
        return _time(errors[-1].get("occurred_at")) if errors else None


class SameDeath:
    """The deaths met in one read of a dead letter queue, to tell a letter that repeats one.

    A crash between a republished letter's publish and its ack (``dead_letter_mode="republish"``)
    redelivers the job, which is dead-lettered again: two letters of one death, with the same
    job id, attempt and replay count (:attr:`DeadLetterEntry.failure_key`).  A listing shows the
    first only; a replay replays it and removes the repeat.  Only republished letters repeat (a
    ``Basic.Nack`` dead-letters a delivery once); letters that are not OJS jobs never do.
    """

    def __init__(self) -> None:
        self._keys: set[FailureKey] = set()

    @staticmethod
    def _key(entry: DeadLetterEntry) -> FailureKey | None:
        return entry.failure_key if entry.reason == "republished" else None

    def repeats(self, entry: DeadLetterEntry) -> bool:
        """Whether ``entry`` is a republished letter of a death already :meth:`add`-ed."""
        key = self._key(entry)
        return key is not None and key in self._keys

    def add(self, entry: DeadLetterEntry) -> None:
        """Remember ``entry``'s death (a republished letter's)."""
        key = self._key(entry)
        if key is not None:
            self._keys.add(key)


class FinalFailureJoin:
    """Joins the nacked letters of one read to their final-failure records, read at the first need.

    Parameters:
        load: reads the records (e.g. :func:`read_final_failures` of the queue); called at most once.
    """

    def __init__(self, load: Callable[[], dict[FailureKey, FinalFailure]]):
        self._load = load
        self._failures: dict[FailureKey, FinalFailure] | None = None

    def __call__(self, entry: DeadLetterEntry) -> DeadLetterEntry:
        """``entry``, with its final failure when it is a nacked letter that has a record."""
        if not entry.awaits_final_failure:
            return entry
        if self._failures is None:
            self._failures = self._load()
        return entry.join(self._failures)


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a listing, replay or purge acts on: all the given criteria must hold.

    Attributes:
        types: the job's type is one of these (a letter that is not an OJS job never matches).
        error: an error code the letter carries (:attr:`DeadLetterEntry.error_codes`, exact,
            any case), or text found in one of its error messages (:attr:`DeadLetterEntry.error_messages`, any case).
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
            if wanted not in codes and not any(wanted in message.lower() for message in entry.error_messages):
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
    meta["ojs.replay_count"] = replay_count(job) + 1
    meta["ojs.last_replayed_at"] = format_timestamp(utcnow())
    return job.model_copy(
        update={"attempt": 0, "meta": meta, "enqueued_at": meta["ojs.last_replayed_at"], "state": None}
    )


__all__ = [
    "DeadLetterEntry",
    "DeadLetterFilter",
    "FailureKey",
    "FinalFailure",
    "FinalFailureJoin",
    "ReplayProgress",
    "SameDeath",
    "final_failure_of",
    "read_final_failures",
    "replayable",
]
