"""The OJS job envelope (job.schema.json of Open Job Spec 1.0): :class:`Job` and :class:`JobError`.

Two ways in, one way out:

* :meth:`Job.create` builds a new job for a producer.  It checks every argument
  itself (no pydantic validation on this path: it runs per enqueued job; the checks
  are in :mod:`~ojs_kombu.model.job_create`) and always emits ``specversion``, a
  lowercase UUIDv7 ``id``, ``created_at``, ``enqueued_at`` and ``attempt`` (DESIGN §2).
* :meth:`Job.from_json` reads a received envelope, either *strictly* (the rules of
  the JSON schema) or *tolerantly* (the consumer path of DESIGN §2: missing
  ``specversion``, uppercase or non-v7 ids, ``null`` optional fields are accepted;
  a common envelope is read without pydantic by :mod:`~ojs_kombu.model.job_read`).
* :meth:`Job.to_dict` / :meth:`Job.to_json` emit only the fields that were set,
  plus every unknown field received, so a valid envelope round-trips unchanged.

Timestamps stay the RFC 3339 strings they were given (so envelopes round-trip
byte for byte); ``job.scheduled_datetime`` and friends turn them into aware
datetimes.  Every problem surfaces as :class:`ojs_kombu.errors.ValidationError`
whose ``field`` is a path such as ``"args[2].when"`` or ``"retry.max_interval"``.
"""

from __future__ import annotations

import re
import uuid as _uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, ClassVar, Literal

import orjson
from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from ojs_kombu.errors import ValidationError
from ojs_kombu.model._problems import Problem as _Problem
from ojs_kombu.model._problems import public_error as _public
from ojs_kombu.model._problems import short_repr as _short
from ojs_kombu.model.base import OjsModel, SharedFieldsSet, construct_trusted, is_tolerant, mode_context
from ojs_kombu.model.body import MAX_ENVELOPE_BYTES, BodyError, read_envelope
from ojs_kombu.model.fields import (
    SPEC_VERSION,
    Int,
    JobState,
    NonEmptyStr,
    Timestamp,
    int_field,
    json_int,
    tuple_to_list,
)
from ojs_kombu.model.ids import EXAMPLE_JOB_ID, JOB_ID_RE, UUID_RE, job_id_argument, new_job_id
from ojs_kombu.model.job_create import (
    _GOOD_QUEUES,
    _GOOD_TYPES,
    _STAMPS,
    _meta_argument,
    _option_fields,
    _remember_name,
    _type_name,
)
from ojs_kombu.model.job_read import read_common
from ojs_kombu.model.jsonvalue import _walk, dumps
from ojs_kombu.model.naming import check_job_type, check_new_job_type, check_new_queue_name, check_queue_name
from ojs_kombu.model.policies import RetryPolicy, UniquePolicy
from ojs_kombu.model.ratelimit import RateLimitPolicy
from ojs_kombu.model.timefmt import _check_timestamp, _format_ts, _timestamp, parse_timestamp

MAX_BACKTRACE_LINES = 50
"""Most lines ``error.backtrace`` may hold (error.schema.json)."""

_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[^\s]*")


class JobError(OjsModel):
    """The ``error`` object of a job (error.schema.json): the most recent failure."""

    _label: ClassVar[str] = "error object"

    type: NonEmptyStr
    message: NonEmptyStr
    backtrace: Annotated[list[Annotated[str, Field(strict=True)]], BeforeValidator(tuple_to_list)] | None = Field(
        None, max_length=MAX_BACKTRACE_LINES
    )


def _check_error_entries(entries: list[Any], large_ints: bool) -> None:
    """Check ``errors[]`` items: ``code``, ``message``, ``attempt`` >= 1, ``occurred_at`` (job.schema.json)."""
    for index, entry in enumerate(entries):
        try:
            if not isinstance(entry, dict):
                raise _Problem(f"each error entry must be an object, got {type(entry).__name__}")
            for key in ("code", "message", "attempt", "occurred_at"):
                if key not in entry:
                    raise _Problem("is required", key)
            for key in ("code", "message"):
                if not isinstance(entry[key], str) or not entry[key]:
                    raise _Problem(f"must be a non-empty string, got {_short(entry[key])}", key)
            attempt = json_int(entry["attempt"])
            if type(attempt) is not int or attempt < 1:
                raise _Problem(f"must be an integer >= 1, got {_short(entry['attempt'])}", "attempt")
            try:
                _timestamp(entry["occurred_at"])
            except _Problem as problem:
                raise problem.under("occurred_at") from None
            if "type" in entry and not isinstance(entry["type"], str):
                raise _Problem(f"must be a string, got {_short(entry['type'])}", "type")
            _walk(entry, large_ints, 1)
        except _Problem as problem:
            raise problem.under(f"[{index}]") from None


# Bytes left for args/meta once the other fields of a created envelope are counted
# (generous: names at their maximum lengths, a full retry policy).  Above it, measure.
_SIZE_BUDGET = MAX_ENVELOPE_BYTES - 4096


class Job(OjsModel):
    """An OJS job envelope (job.schema.json).

    Unknown top-level fields are kept (``extra="allow"``) and emitted again by
    :meth:`to_dict`.  Timestamps are the RFC 3339 strings of the wire; read them as
    datetimes through ``created_datetime``, ``scheduled_datetime``...  ``schema`` is
    the attribute ``schema_uri`` (``schema`` is a pydantic method name).
    """

    _label: ClassVar[str] = "job"
    _allows_unknown: ClassVar[bool] = True
    _nullable: ClassVar[frozenset[str]] = frozenset({"result"})

    specversion: Literal["1.0"]
    id: str = Field(strict=True)
    type: str = Field(strict=True)
    queue: str = Field(strict=True)
    args: Annotated[list[Any], BeforeValidator(tuple_to_list), Field(strict=True)]
    meta: dict[str, Any] | None = Field(None, strict=True)
    priority: Int | None = int_field(None)
    timeout: Int | None = int_field(None, ge=0)
    scheduled_at: Timestamp | None = None
    expires_at: Timestamp | None = None
    retry: RetryPolicy | None = None
    unique: UniquePolicy | None = None
    rate_limit: RateLimitPolicy | None = None
    schema_uri: str | None = Field(None, alias="schema", strict=True)
    state: JobState | None = None
    attempt: Int = int_field(0, ge=0)
    created_at: Timestamp | None = None
    enqueued_at: Timestamp | None = None
    started_at: Timestamp | None = None
    completed_at: Timestamp | None = None
    error: JobError | None = None
    errors: list[Any] | None = Field(None, strict=True)
    result: Any = None

    # -- validators (from_json / Job(...); Job.create checks its arguments itself)

    @model_validator(mode="before")
    @classmethod
    def _tolerant_fixups(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and is_tolerant(info):
            data = dict(data)
            if data.get("specversion") is None:
                data["specversion"] = SPEC_VERSION
            if isinstance(data.get("id"), str):
                data["id"] = data["id"].lower()
        return data

    @field_validator("id")
    @classmethod
    def _id(cls, value: str, info: ValidationInfo) -> str:
        if is_tolerant(info):
            if UUID_RE.fullmatch(value) is None:
                raise _Problem(f"{_short(value)} is not a UUID (8-4-4-4-12 hexadecimal)")
        elif JOB_ID_RE.fullmatch(value) is None:
            raise _Problem(f"{_short(value)} is not a lowercase UUIDv7 (e.g. {EXAMPLE_JOB_ID!r})")
        return value

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        return check_job_type(value)

    @field_validator("queue")
    @classmethod
    def _queue(cls, value: str) -> str:
        return check_queue_name(value)

    @field_validator("args", "meta", "result")
    @classmethod
    def _native(cls, value: Any, info: ValidationInfo) -> Any:
        _walk(value, is_tolerant(info), 0)
        return value

    @field_validator("scheduled_at", "expires_at", "created_at", "enqueued_at", "started_at", "completed_at")
    @classmethod
    def _timestamps(cls, value: str | None) -> str | None:
        return value if value is None else _check_timestamp(value)

    @field_validator("schema_uri")
    @classmethod
    def _schema_uri(cls, value: str | None) -> str | None:
        if value is not None and _URI_RE.fullmatch(value) is None:
            raise _Problem(f"{_short(value)} is not a URI (e.g. 'urn:ojs:schema:email.send:v1')")
        return value

    @field_validator("errors")
    @classmethod
    def _errors(cls, value: list[Any] | None, info: ValidationInfo) -> list[Any] | None:
        if value is not None:
            _check_error_entries(value, is_tolerant(info))
        return value

    @model_validator(mode="after")
    def _native_extras(self, info: ValidationInfo) -> Job:
        for key, value in (self.__pydantic_extra__ or {}).items():
            try:
                _walk(value, is_tolerant(info), 0)
            except _Problem as problem:
                raise problem.under(key) from None
        return self

    # -- producing

    @classmethod
    def create(
        cls,
        type: str,
        args: list[Any] | tuple[Any, ...] | None = None,
        *,
        queue: str = "default",
        kwargs: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
        priority: int | None = None,
        retry: RetryPolicy | Mapping[str, Any] | None = None,
        scheduled_at: datetime | str | timedelta | None = None,
        expires_at: datetime | str | timedelta | None = None,
        timeout: int | None = None,
        tags: list[str] | tuple[str, ...] | None = None,
        id: str | _uuid.UUID | None = None,
        unique: UniquePolicy | Mapping[str, Any] | None = None,
        rate_limit: RateLimitPolicy | Mapping[str, Any] | None = None,
    ) -> Job:
        """Build a new job envelope, ready to publish.

        ``args`` are the positional arguments (a tuple becomes a list); ``kwargs`` go
        to ``meta["kwargs"]`` and ``tags`` to ``meta["tags"]`` (both omitted when
        empty).  ``retry`` is a :class:`RetryPolicy` or a dict of its fields; so are ``unique``
        (:class:`UniquePolicy`) and ``rate_limit`` (:class:`~ojs_kombu.model.ratelimit.RateLimitPolicy`,
        the spec's ``rate_limit`` object: limits shared by every job of its key, ``docs/limits.md``).
        ``scheduled_at``/``expires_at`` take an aware datetime, an RFC 3339 string or
        a ``timedelta`` from now; they are emitted in UTC with milliseconds
        (``scheduled_at`` rounded up, so a job never becomes due early).  The id is
        a new UUIDv7 unless ``id`` (a lowercase UUIDv7) is given.  ``created_at`` =
        ``enqueued_at`` = now, ``attempt`` = 0.

        Raises :class:`ValidationError` with ``field`` naming the bad argument.
        """
        # One try for the whole body (this runs per job): `field` names the argument
        # being checked, and a _Problem raised while checking it is reported under it.
        field: str | None = "type"
        try:
            if type.__class__ is not str or type not in _GOOD_TYPES:
                _remember_name(_GOOD_TYPES, check_new_job_type(type))
            field = "queue"
            if queue.__class__ is not str or queue not in _GOOD_QUEUES:
                _remember_name(_GOOD_QUEUES, check_new_queue_name(queue))
            field = "id"
            job_id = new_job_id() if id is None else job_id_argument(id)
            field = "args"
            if args is None:
                args = []
            elif isinstance(args, (list, tuple)):
                args = list(args)
            else:
                raise _Problem(
                    f"must be a list of positional arguments, got {_type_name(args)}; pass keywords as kwargs="
                )
            size = _walk(args, False, 0)
            now: datetime | None = None
            if scheduled_at is not None or expires_at is not None:
                now = datetime.now(UTC)  # created_at and a "timedelta from now" share one moment
                stamp = _format_ts(now)
            else:
                stamp = _STAMPS.now()
            # The job's state: every field in declaration order (to_dict keeps it), None where
            # not given; `given` its fields set.  Built from copies (this runs per job).
            state = _JOB_TEMPLATE.copy()
            state["specversion"] = SPEC_VERSION
            state["id"] = job_id
            state["type"] = type
            state["queue"] = queue
            state["args"] = args
            state["attempt"] = 0
            state["created_at"] = state["enqueued_at"] = stamp
            given: set[str] = _CREATED_FIELDS  # shared while no other field is set
            if meta is not None or kwargs is not None or tags is not None:
                field = None  # the helper reports under meta, kwargs or tags
                meta, meta_size = _meta_argument(meta, kwargs, tags)
                size += meta_size
                if meta:
                    state["meta"] = meta
                    given = {*_CREATED_FIELDS, "meta"}
            if (
                priority is not None
                or timeout is not None
                or now is not None
                or retry is not None
                or unique is not None
                or rate_limit is not None
            ):
                field = None  # the helper reports under the option at fault
                if given is _CREATED_FIELDS:
                    given = set(_CREATED_FIELDS)
                _option_fields(
                    state, given, now, priority, timeout, scheduled_at, expires_at, retry, unique, rate_limit
                )
            job = construct_trusted(cls, state, given, {})
            if size > _SIZE_BUDGET:
                _check_size(job)
        except _Problem as problem:
            raise _public(problem, field) from None
        return job

    @classmethod
    def _trusted(cls, values: dict[str, Any]) -> Job:
        # What model_construct does, minus its per-field Python loop (Job.create is hot).
        # The fields in declaration order, which to_dict keeps.
        return construct_trusted(cls, {**_JOB_TEMPLATE, **values}, set(values), {})

    # -- reading

    @classmethod
    def from_json(
        cls, data: str | bytes | bytearray | memoryview | dict[str, Any], *, strict: bool = True, native: bool = False
    ) -> Job:
        """Read an envelope from JSON text, UTF-8 bytes or an already decoded dict.

        ``strict=True`` applies the schema's rules.  ``strict=False`` is the consumer
        path (DESIGN §2): a missing ``specversion`` reads as ``"1.0"``, the id is
        lowercased and may be any canonical UUID, ``null`` optional fields are
        absent, unknown fields inside ``retry``/``unique``/``error`` are kept, and
        integers beyond ±(2**53-1) are accepted, and so is a leading byte order mark.
        Both refuse bodies over :data:`MAX_ENVELOPE_BYTES`, invalid UTF-8 and invalid JSON.

        Parameters:
            data: the envelope.
            strict: the mode.
            native: ``data`` is a dict that :func:`~ojs_kombu.model.body.read_envelope` read and
                called native (so ``args`` and ``meta`` need no second JSON-native check); ignored
                for text, whose reading says it itself.

        Returns:
            The job.

        Raises:
            ValidationError: the text is not an envelope, or the envelope breaks a rule of the mode.
        """
        if isinstance(data, dict):
            obj: Any = data
        elif isinstance(data, (str, bytes, bytearray, memoryview)):
            try:
                obj, native = read_envelope(data, tolerant=not strict)
            except BodyError as exc:
                raise ValidationError(f"envelope {exc}") from None
        else:
            raise ValidationError(f"expected JSON text, UTF-8 bytes or a dict, got {type(data).__name__}")
        if not strict and cls is Job:  # a subclass may add fields or private state: the model builds it
            job = cls._read_common(obj, native=native)
            if job is not None:
                return job
        return cls.model_validate(obj, context=mode_context(strict=strict))

    @classmethod
    def _read_common(cls, data: dict[str, Any], *, native: bool = False) -> Job | None:
        """The tolerant reading of a common envelope without pydantic (:func:`~ojs_kombu.model.job_read.read_common`), or None.

        None leaves the envelope to the full validation.  The job is built like :meth:`create`
        builds one, and equals what ``model_validate`` gives (fields, fields set, no extras);
        ``tests/unit/test_fast_read.py`` holds them together.

        Parameters:
            data: the decoded envelope (not modified).
            native: ``args``/``meta`` are JSON-native by construction: their walk is skipped.

        Returns:
            The job, or None.
        """
        values = read_common(data, native=native)
        return None if values is None else cls._trusted(values)

    # -- writing

    def to_json(self) -> str:
        """Serialise :meth:`to_dict` compactly (``ensure_ascii=False``: encode as UTF-8)."""
        return dumps(self.to_dict())

    def to_json_bytes(self) -> bytes:
        """:meth:`to_json` as UTF-8 bytes, the message body; the same JSON value.

        Written by ``orjson`` (a fifth of the cost of ``json`` on the publish path); what it
        refuses (integers beyond 64 bits, which a tolerantly read job may hold) goes through
        :meth:`to_json`.  Floats may be spelled differently (``1e16`` for ``1e+16``).

        Returns:
            Compact JSON text, UTF-8.

        Raises:
            UnicodeEncodeError: a string holds a lone surrogate (as ``to_json().encode()``).
        """
        data = self.to_dict()
        try:
            return orjson.dumps(data)
        except orjson.JSONEncodeError:
            return dumps(data).encode("utf-8")

    # -- convenience

    @property
    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments (``meta["kwargs"]``), ``{}`` when there are none."""
        return (self.meta or {}).get("kwargs") or {}

    @property
    def retry_policy(self) -> RetryPolicy:
        """The job's retry policy, or a new one with the spec defaults when it has none."""
        return self.retry if self.retry is not None else RetryPolicy()

    @property
    def scheduled_datetime(self) -> datetime | None:
        """``scheduled_at`` as an aware datetime, or None."""
        return _as_datetime(self.scheduled_at)

    @property
    def expires_datetime(self) -> datetime | None:
        """``expires_at`` as an aware datetime, or None."""
        return _as_datetime(self.expires_at)

    @property
    def created_datetime(self) -> datetime | None:
        """``created_at`` as an aware datetime, or None."""
        return _as_datetime(self.created_at)

    @property
    def enqueued_datetime(self) -> datetime | None:
        """``enqueued_at`` as an aware datetime, or None."""
        return _as_datetime(self.enqueued_at)

    @property
    def started_datetime(self) -> datetime | None:
        """``started_at`` as an aware datetime, or None."""
        return _as_datetime(self.started_at)

    @property
    def completed_datetime(self) -> datetime | None:
        """``completed_at`` as an aware datetime, or None."""
        return _as_datetime(self.completed_at)


_JOB_TEMPLATE = {name: None if field.is_required() else field.default for name, field in Job.model_fields.items()}
# The fields Job.create always sets: the fields set of every job created without meta or options.
_CREATED_FIELDS = SharedFieldsSet(
    {"specversion", "id", "type", "queue", "args", "attempt", "created_at", "enqueued_at"}
)


# --------------------------------------------------------------------------- helpers of Job


def _as_datetime(value: str | None) -> datetime | None:
    return None if value is None else parse_timestamp(value)


def _check_size(job: Job) -> None:
    """Raise ValidationError, naming the biggest part, if the envelope is over the limit."""
    size = len(job.to_json().encode("utf-8"))
    if size <= MAX_ENVELOPE_BYTES:
        return
    meta = job.meta or {}
    parts = {
        "args": job.args,
        "kwargs": job.kwargs,
        "tags": meta.get("tags", []),
        "meta": {k: v for k, v in meta.items() if k not in ("kwargs", "tags")},
    }
    biggest = max(parts, key=lambda name: len(dumps(parts[name]).encode("utf-8")))
    raise ValidationError(
        f"{biggest}: the envelope would be {size} bytes, over the {MAX_ENVELOPE_BYTES}-byte limit; "
        "store large payloads elsewhere and pass a reference",
        field=biggest,
    )


#: Where a framework's own id of a job travels, when it is not the job ``id`` (wire format):
#: ``meta.dramatiq.message_id`` (a Dramatiq ``message_id``, what ``send()`` returned; the job id
#: is a UUIDv7 derived from it and the message timestamp, so it cannot be computed from the
#: message id alone) and ``meta.celery.id`` (a Celery task id that is not a UUIDv7).
FRAMEWORK_ID_FIELDS: tuple[tuple[str, str], ...] = (("dramatiq", "message_id"), ("celery", "id"))


def framework_ids(job: Job) -> tuple[str, ...]:
    """The other ids ``job`` may be named by: its framework's own id (:data:`FRAMEWORK_ID_FIELDS`), lowercase.

    A job id is taken wherever one of these is (the dead letter filters, INFO), so
    ``ojs-amqp dlq show default <what send() returned>`` finds a Dramatiq message.

    Parameters:
        job: a decoded job.

    Returns:
        The ids other than ``job.id`` (usually none or one), lowercase, in
        :data:`FRAMEWORK_ID_FIELDS` order.
    """
    meta = job.meta
    if not meta:
        return ()
    found: list[str] = []
    for section_key, field_name in FRAMEWORK_ID_FIELDS:
        section = meta.get(section_key)
        other = section.get(field_name) if isinstance(section, dict) else None
        if isinstance(other, str) and other and (other := other.lower()) != job.id and other not in found:
            found.append(other)
    return tuple(found)


__all__ = ["FRAMEWORK_ID_FIELDS", "MAX_BACKTRACE_LINES", "SPEC_VERSION", "Job", "JobError", "framework_ids"]
