"""The OJS job envelope (job.schema.json of Open Job Spec 1.0) as pydantic v2 models.

Two ways in, one way out:

* :meth:`Job.create` builds a new job for a producer.  It checks every argument
  itself (no pydantic validation on this path: it runs per enqueued job) and
  always emits ``specversion``, a lowercase UUIDv7 ``id``, ``created_at``,
  ``enqueued_at`` and ``attempt`` (DESIGN §2).
* :meth:`Job.from_json` reads a received envelope, either *strictly* (the rules of
  the JSON schema) or *tolerantly* (the consumer path of DESIGN §2: missing
  ``specversion``, uppercase or non-v7 ids, ``null`` optional fields are accepted).
* :meth:`Job.to_dict` / :meth:`Job.to_json` emit only the fields that were set,
  plus every unknown field received, so a valid envelope round-trips unchanged.

Timestamps stay the RFC 3339 strings they were given (so envelopes round-trip
byte for byte); ``job.scheduled_datetime`` and friends turn them into aware
datetimes.  Every problem surfaces as :class:`ojs_kombu.errors.ValidationError`
whose ``field`` is a path such as ``"args[2].when"`` or ``"retry.max_interval"``.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
import uuid as _uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic import ValidationError as _PydanticValidationError

from ojs_kombu.errors import ValidationError
from ojs_kombu.model._problems import Problem as _Problem
from ojs_kombu.model._problems import convert_pydantic_error as _convert
from ojs_kombu.model._problems import public_error as _public
from ojs_kombu.model._problems import short_repr as _short
from ojs_kombu.model.jsonvalue import MAX_JSON_DEPTH, MAX_SAFE_INTEGER, _walk, ensure_json_native
from ojs_kombu.model.naming import RESERVED_QUEUE_PREFIXES  # refused by Job.create (DESIGN §3)
from ojs_kombu.model.timefmt import (
    _aware,
    _check_timestamp,
    _duration,
    _duration_groups,
    _duration_input,
    _format_ts,
    _timestamp,
    format_duration,
    format_timestamp,
    parse_duration,
    parse_timestamp,
    utcnow,
)

SPEC_VERSION = "1.0"
"""The only ``specversion`` this library reads and writes."""

MAX_ENVELOPE_BYTES = 1024 * 1024
"""Largest envelope accepted or produced, in UTF-8 bytes (ojs-json-format: support up to 1 MiB)."""

JOB_TYPE_PATTERN = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$"
"""Job type: dot-separated lowercase segments (job.schema.json); at most :data:`MAX_JOB_TYPE_LENGTH`."""

QUEUE_NAME_PATTERN = r"^[a-z0-9][a-z0-9\-\.]*$"
"""OJS queue name (job.schema.json, DESIGN §3); at most :data:`MAX_QUEUE_NAME_LENGTH`."""

JOB_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
"""Job id: a lowercase UUIDv7 (job.schema.json)."""

MAX_JOB_TYPE_LENGTH = 255
"""Longest job type the schema allows."""

MAX_QUEUE_NAME_LENGTH = 128
"""Longest queue name the schema allows."""

JobState = Literal["scheduled", "available", "pending", "active", "completed", "retryable", "cancelled", "discarded"]
"""The eight OJS lifecycle states."""

_TYPE_RE = re.compile(JOB_TYPE_PATTERN[1:-1])
_QUEUE_RE = re.compile(QUEUE_NAME_PATTERN[1:-1])
_ID_RE = re.compile(JOB_ID_PATTERN[1:-1])
_ANY_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[^\s]*")

# Context key of the validation mode.  No context (plain Python construction) behaves
# like "strict" except that None means "absent".
_MODE = "ojs_mode"
_STRICT = "strict"
_TOLERANT = "tolerant"


def _json_native(value: Any, info: ValidationInfo) -> Any:
    _walk(value, _tolerant(info), 0)
    return value


def _tolerant(info: ValidationInfo) -> bool:
    return bool(info.context) and info.context.get(_MODE) == _TOLERANT


# --------------------------------------------------------------------------- field types


def _json_int(value: Any) -> Any:
    # JSON Schema counts 5.0 as an integer.
    if type(value) is float and value.is_integer():
        return int(value)
    return value


def _unique_items(value: Any) -> Any:
    if value is not None and len(set(value)) != len(value):
        seen: set[Any] = set()
        duplicate = next(item for item in value if item in seen or seen.add(item))
        raise _Problem(f"{duplicate!r} appears more than once; items must be unique")
    return value


def _tuple_to_list(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _int_field(default: Any, *, ge: int = -MAX_SAFE_INTEGER) -> Any:
    return Field(default, strict=True, ge=ge, le=MAX_SAFE_INTEGER)


_Int = Annotated[int, BeforeValidator(_json_int)]
_NonEmptyStr = Annotated[str, Field(strict=True, min_length=1)]
_Duration = Annotated[str, BeforeValidator(_duration_input), Field(strict=True)]
_Timestamp = Annotated[str, Field(strict=True)]
_StrList = Annotated[list[_NonEmptyStr], BeforeValidator(_tuple_to_list)]


# --------------------------------------------------------------------------- base model


_KNOWN_KEYS: dict[type, dict[str, str]] = {}  # per model: JSON key -> attribute name
_RENAMED: dict[type, dict[str, str]] = {}  # per model: attribute name -> JSON key, where they differ


class _OjsModel(BaseModel):
    """Shared behaviour: our ValidationError only, modes, ``to_dict`` of set fields."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    _label: ClassVar[str] = "object"
    _allows_unknown: ClassVar[bool] = False  # unknown keys outside tolerant mode
    _nullable: ClassVar[frozenset[str]] = frozenset()  # known keys that may be JSON null in strict mode

    def __init__(self, /, **data: Any) -> None:
        """Validate ``data`` (Python values; ``None`` means absent); raise ``ValidationError``."""
        try:
            super().__init__(**data)
        except _PydanticValidationError as exc:
            raise _convert(exc) from None

    # Without this mark pydantic-core would call this __init__ for nested models too,
    # dropping the validation context (strict/tolerant mode).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def __setattr__(self, name: str, value: Any) -> None:
        """Assign with validation; a bad value raises ``ValidationError``."""
        try:
            super().__setattr__(name, value)
        except _PydanticValidationError as exc:
            raise _convert(exc) from None

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Any:
        """pydantic's ``model_validate``, raising :class:`ValidationError` instead of pydantic's."""
        try:
            return super().model_validate(obj, *args, **kwargs)
        except _PydanticValidationError as exc:
            raise _convert(exc) from None

    @classmethod
    def _known(cls) -> dict[str, str]:
        """JSON key -> attribute name, in declaration order."""
        known = _KNOWN_KEYS.get(cls)
        if known is None:
            known = _KNOWN_KEYS[cls] = {(f.alias or name): name for name, f in cls.model_fields.items()}
            _RENAMED[cls] = {name: key for key, name in known.items() if key != name}
        return known

    @model_validator(mode="before")
    @classmethod
    def _apply_mode(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        mode = info.context.get(_MODE) if info.context else None
        known = cls._known()
        if mode == _TOLERANT:
            # ojs-json-format: null counts as absent.  Unknown keys are kept verbatim.
            return {k: v for k, v in data.items() if v is not None or k not in known}
        if not cls._allows_unknown:
            for key in data:
                if key not in known:
                    raise _Problem(f"unknown field of the {cls._label} (allowed: {', '.join(known)})", str(key))
        if mode == _STRICT:
            for key, value in data.items():
                if value is None and key in known and key not in cls._nullable:
                    hint = "" if cls.model_fields[known[key]].is_required() else " (omit the field instead)"
                    raise _Problem(f"must not be null{hint}", key)
        return data

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready dict: set fields that are not None, then unknown fields.

        Nested policies become dicts; other nested values (``args``, ``meta``...) are
        shared with the model, not copied.
        """
        out: dict[str, Any] = {}
        fields_set = self.__pydantic_fields_set__
        renamed = _RENAMED.get(type(self))
        if renamed is None:
            type(self)._known()
            renamed = _RENAMED[type(self)]
        for name, value in self.__dict__.items():  # declaration order
            if value is not None and name in fields_set:
                out[renamed.get(name, name)] = value.to_dict() if isinstance(value, _OjsModel) else value
        if self.__pydantic_extra__:
            out.update(self.__pydantic_extra__)
        return out


# --------------------------------------------------------------------------- retry policy


class RetryPolicy(_OjsModel):
    """The OJS retry policy (retry-policy.schema.json) plus the ``backoff_strategy`` extension.

    Durations accept an ISO 8601 string or a ``timedelta`` (stored as the string).
    Only the fields that were set are serialised, so ``RetryPolicy(max_attempts=5)``
    emits ``{"max_attempts": 5}``; unset fields read as the spec defaults.
    ``on_exhaustion`` stays ``None`` when not given: DESIGN §5 routes that case to
    the dead letter queue, unlike an explicit ``"discard"``.
    """

    _label: ClassVar[str] = "retry policy"

    max_attempts: _Int = _int_field(3, ge=0)
    initial_interval: _Duration = "PT1S"
    backoff_coefficient: float = Field(2.0, strict=True, ge=1.0, allow_inf_nan=False)
    max_interval: _Duration = "PT5M"
    jitter: bool = Field(True, strict=True)
    non_retryable_errors: _StrList = Field(default_factory=list)
    on_exhaustion: Literal["discard", "dead_letter"] | None = None
    backoff_strategy: Literal["exponential", "linear", "polynomial", "none"] | None = None

    @field_validator("initial_interval", "max_interval")
    @classmethod
    def _fixed_duration(cls, value: str) -> str:
        _duration(value)
        return value

    @field_validator("non_retryable_errors")
    @classmethod
    def _unique_errors(cls, value: list[str]) -> list[str]:
        return _unique_items(value)

    @model_validator(mode="after")
    def _intervals(self) -> RetryPolicy:
        initial = _duration(self.initial_interval)
        if initial <= timedelta(0):
            raise _Problem(f"must be greater than zero, got {self.initial_interval!r}", "initial_interval")
        if _duration(self.max_interval) < initial:
            raise _Problem(
                f"{self.max_interval!r} is shorter than initial_interval {self.initial_interval!r}", "max_interval"
            )
        return self

    @property
    def initial_interval_seconds(self) -> float:
        """``initial_interval`` in seconds."""
        return _duration(self.initial_interval).total_seconds()

    @property
    def max_interval_seconds(self) -> float:
        """``max_interval`` in seconds."""
        return _duration(self.max_interval).total_seconds()

    @property
    def dead_letters_on_exhaustion(self) -> bool:
        """True unless ``on_exhaustion`` is explicitly ``"discard"`` (DESIGN §5)."""
        return self.on_exhaustion != "discard"

    def is_non_retryable(self, error_type: str) -> bool:
        """Whether ``error_type`` is listed in ``non_retryable_errors``.

        Exact names match exactly (``"ValueError"``); an entry ending in ``.*``
        matches every type under that prefix (``"auth.*"`` matches
        ``"auth.TokenExpired"`` and ``"auth.token.expired"``, not ``"auth"`` itself).
        """
        for entry in self.non_retryable_errors:
            if entry == error_type:
                return True
            if entry.endswith(".*") and error_type.startswith(entry[:-1]):
                return True
        return False


# --------------------------------------------------------------------------- unique policy


class UniquePolicy(_OjsModel):
    """The OJS unique policy (unique-policy.schema.json).

    ``period`` accepts any duration the schema allows (years and months included:
    nothing here needs its length) or a ``timedelta``.
    """

    _label: ClassVar[str] = "unique policy"

    keys: Annotated[list[Literal["type", "queue", "args", "meta"]], BeforeValidator(_tuple_to_list)] | None = None
    args_keys: _StrList | None = None
    meta_keys: Annotated[_StrList, Field(min_length=1)] | None = None
    period: _Duration | None = None
    states: Annotated[list[JobState], BeforeValidator(_tuple_to_list)] | None = None
    on_conflict: Literal["reject", "replace", "replace_except_schedule", "ignore"] | None = None

    @field_validator("keys", "args_keys", "meta_keys", "states")
    @classmethod
    def _unique(cls, value: list[str] | None) -> list[str] | None:
        return _unique_items(value)

    @field_validator("period")
    @classmethod
    def _period(cls, value: str | None) -> str | None:
        if value is not None:
            _duration_groups(value)
        return value

    @model_validator(mode="after")
    def _meta_keys_needed(self) -> UniquePolicy:
        # The schema's `if` is vacuously true when `keys` is absent, so it demands meta_keys
        # for every policy without keys (DESIGN §2).  We follow the spec's intent instead:
        # meta_keys is required only when "meta" is one of the keys.
        if self.keys and "meta" in self.keys and not self.meta_keys:
            raise _Problem('is required when keys contains "meta"', "meta_keys")
        return self


# --------------------------------------------------------------------------- error


class JobError(_OjsModel):
    """The ``error`` object of a job (error.schema.json): the most recent failure."""

    _label: ClassVar[str] = "error object"

    type: _NonEmptyStr
    message: _NonEmptyStr
    backtrace: Annotated[list[Annotated[str, Field(strict=True)]], BeforeValidator(_tuple_to_list)] | None = Field(
        None, max_length=50
    )


# --------------------------------------------------------------------------- job


def _check_type(value: Any) -> str:
    if not isinstance(value, str):
        raise _Problem(f"job type must be a string, got {type(value).__name__}")
    if len(value) > MAX_JOB_TYPE_LENGTH or _TYPE_RE.fullmatch(value) is None:
        raise _Problem(
            f"job type {_short(value)} is invalid: use dot-separated lowercase segments, each "
            f"[a-z][a-z0-9_]* (e.g. 'email.send'), at most {MAX_JOB_TYPE_LENGTH} characters"
        )
    return value


def _check_queue(value: Any) -> str:
    if not isinstance(value, str):
        raise _Problem(f"queue name must be a string, got {type(value).__name__}")
    if len(value) > MAX_QUEUE_NAME_LENGTH or _QUEUE_RE.fullmatch(value) is None:
        raise _Problem(
            f"queue name {_short(value)} is invalid: use lowercase letters, digits, '-' and '.', starting "
            f"with a letter or digit (e.g. 'default'), at most {MAX_QUEUE_NAME_LENGTH} characters"
        )
    return value


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
            attempt = _json_int(entry["attempt"])
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


_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class Job(_OjsModel):
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
    args: Annotated[list[Any], BeforeValidator(_tuple_to_list), Field(strict=True)]
    meta: dict[str, Any] | None = Field(None, strict=True)
    priority: _Int | None = _int_field(None)
    timeout: _Int | None = _int_field(None, ge=0)
    scheduled_at: _Timestamp | None = None
    expires_at: _Timestamp | None = None
    retry: RetryPolicy | None = None
    unique: UniquePolicy | None = None
    schema_uri: str | None = Field(None, alias="schema", strict=True)
    state: JobState | None = None
    attempt: _Int = _int_field(0, ge=0)
    created_at: _Timestamp | None = None
    enqueued_at: _Timestamp | None = None
    started_at: _Timestamp | None = None
    completed_at: _Timestamp | None = None
    error: JobError | None = None
    errors: list[Any] | None = Field(None, strict=True)
    result: Any = None

    # -- validators (from_json / Job(...); Job.create checks its arguments itself)

    @model_validator(mode="before")
    @classmethod
    def _tolerant_fixups(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and _tolerant(info):
            data = dict(data)
            if data.get("specversion") is None:
                data["specversion"] = SPEC_VERSION
            if isinstance(data.get("id"), str):
                data["id"] = data["id"].lower()
        return data

    @field_validator("id")
    @classmethod
    def _id(cls, value: str, info: ValidationInfo) -> str:
        if _tolerant(info):
            if _ANY_UUID_RE.fullmatch(value) is None:
                raise _Problem(f"{_short(value)} is not a UUID (8-4-4-4-12 hexadecimal)")
        elif _ID_RE.fullmatch(value) is None:
            raise _Problem(f"{_short(value)} is not a lowercase UUIDv7 (e.g. '019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f')")
        return value

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        return _check_type(value)

    @field_validator("queue")
    @classmethod
    def _queue(cls, value: str) -> str:
        return _check_queue(value)

    @field_validator("args", "meta", "result")
    @classmethod
    def _native(cls, value: Any, info: ValidationInfo) -> Any:
        return _json_native(value, info)

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
            _check_error_entries(value, _tolerant(info))
        return value

    @model_validator(mode="after")
    def _native_extras(self, info: ValidationInfo) -> Job:
        for key, value in (self.__pydantic_extra__ or {}).items():
            try:
                _walk(value, _tolerant(info), 0)
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
    ) -> Job:
        """Build a new job envelope, ready to publish.

        ``args`` are the positional arguments (a tuple becomes a list); ``kwargs`` go
        to ``meta["kwargs"]`` and ``tags`` to ``meta["tags"]`` (both omitted when
        empty).  ``retry`` is a :class:`RetryPolicy` or a dict of its fields.
        ``scheduled_at``/``expires_at`` take an aware datetime, an RFC 3339 string or
        a ``timedelta`` from now; they are emitted in UTC with milliseconds
        (``scheduled_at`` rounded up, so a job never becomes due early).  The id is
        a new UUIDv7 unless ``id`` (a lowercase UUIDv7) is given.  ``created_at`` =
        ``enqueued_at`` = now, ``attempt`` = 0.

        Raises :class:`ValidationError` with ``field`` naming the bad argument.
        """
        # One try for the whole body (this runs per job): `field` names the argument
        # being checked, and a _Problem raised while checking it is reported under it.
        field = "type"
        try:
            _check_type(type)
            field = "queue"
            _created_queue(queue)
            field = "id"
            job_id = _new_id(id)
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
            now = datetime.now(UTC)
            stamp = _format_ts(now)
            values: dict[str, Any] = {
                "specversion": SPEC_VERSION,
                "id": job_id,
                "type": type,
                "queue": queue,
                "args": args,
                "attempt": 0,
                "created_at": stamp,
                "enqueued_at": stamp,
            }
            field = "meta"
            if meta is None:
                meta = {}
            elif isinstance(meta, dict):
                size += _walk(meta, False, 0)
                meta = dict(meta)
            else:
                raise _Problem(f"must be a dict, got {_type_name(meta)}")
            if kwargs is not None:
                field = "kwargs"
                if not isinstance(kwargs, dict):
                    raise _Problem(f"must be a dict of keyword arguments, got {_type_name(kwargs)}")
                if kwargs:
                    if "kwargs" in meta:
                        raise _Problem("given both kwargs= and meta['kwargs']; pass one of them")
                    size += _walk(kwargs, False, 1)
                    meta["kwargs"] = dict(kwargs)
            if tags is not None:
                field = "tags"
                tags = _tags(tags)
                if tags:
                    if "tags" in meta:
                        raise _Problem("given both tags= and meta['tags']; pass one of them")
                    size += _walk(tags, False, 1)
                    meta["tags"] = tags
            if meta:
                values["meta"] = meta
            if priority is not None:
                field = "priority"
                values["priority"] = _checked_int(priority, -MAX_SAFE_INTEGER)
            if timeout is not None:
                field = "timeout"
                values["timeout"] = _checked_int(timeout, 0)
            if scheduled_at is not None:
                field = "scheduled_at"
                values["scheduled_at"] = _moment(scheduled_at, now, round_up=True)
            if expires_at is not None:
                field = "expires_at"
                values["expires_at"] = _moment(expires_at, now, round_up=False)
            if retry is not None:
                field = "retry"
                values["retry"] = _retry_argument(retry)
            job = cls._trusted(values)
            if size > _SIZE_BUDGET:
                _check_size(job)
        except _Problem as problem:
            raise _public(problem, field) from None
        return job

    @classmethod
    def _trusted(cls, values: dict[str, Any]) -> Job:
        # What model_construct does, minus its per-field Python loop (Job.create is hot).
        job = cls.__new__(cls)
        fields = _JOB_TEMPLATE.copy()  # declaration order, which to_dict keeps
        fields.update(values)
        object.__setattr__(job, "__dict__", fields)
        object.__setattr__(job, "__pydantic_fields_set__", set(values))
        object.__setattr__(job, "__pydantic_extra__", {})
        object.__setattr__(job, "__pydantic_private__", None)
        return job

    # -- reading

    @classmethod
    def from_json(cls, data: str | bytes | bytearray | memoryview | dict[str, Any], *, strict: bool = True) -> Job:
        """Read an envelope from JSON text, UTF-8 bytes or an already decoded dict.

        ``strict=True`` applies the schema's rules.  ``strict=False`` is the consumer
        path (DESIGN §2): a missing ``specversion`` reads as ``"1.0"``, the id is
        lowercased and may be any canonical UUID, ``null`` optional fields are
        absent, unknown fields inside ``retry``/``unique``/``error`` are kept, and
        integers beyond ±(2**53-1) are accepted.  Both refuse bodies over
        :data:`MAX_ENVELOPE_BYTES`, invalid UTF-8 and invalid JSON.
        """
        if isinstance(data, dict):
            obj: Any = data
        else:
            obj = _decode(data, strict)
        mode = _STRICT if strict else _TOLERANT
        return cls.model_validate(obj, context={_MODE: mode})

    # -- writing

    def to_json(self) -> str:
        """Serialise :meth:`to_dict` compactly (``ensure_ascii=False``: encode as UTF-8)."""
        return _JSON_ENCODER.encode(self.to_dict())

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


# --------------------------------------------------------------------------- helpers of Job


def _as_datetime(value: str | None) -> datetime | None:
    return None if value is None else parse_timestamp(value)


def _type_name(value: Any) -> str:
    return type(value).__name__


class _UUIDv7:
    """Monotonic UUIDv7 ids (RFC 9562 §6.2, method 1: a 12-bit counter in ``rand_a``).

    ``uuid6.uuid7()`` keeps ids ordered by adding a millisecond to the timestamp
    for every id made within the same millisecond: at 10k jobs/s the ids' clock
    runs ahead of real time by seconds per second (measured: 200,000 ids took
    0.8 s and ended 199 s in the future).  Here ids made within one millisecond
    share its timestamp and count up; only after 2048+ ids in one millisecond
    does the timestamp borrow the next one.  Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0

    def __call__(self) -> str:
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            if now_ms > self._last_ms:
                self._last_ms = now_ms
                self._counter = secrets.randbits(11)  # random start, room left to count up
            else:
                self._counter += 1
                if self._counter > 0xFFF:
                    self._last_ms += 1
                    self._counter = secrets.randbits(11)
            ms, counter = self._last_ms, self._counter
        value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | secrets.randbits(62)
        return str(_uuid.UUID(int=value))


new_job_id = _UUIDv7()
"""``new_job_id() -> str``: a new lowercase UUIDv7, monotonic within this process."""


def _new_id(job_id: Any) -> str:
    if job_id is None:
        return new_job_id()
    if isinstance(job_id, _uuid.UUID):
        job_id = str(job_id)
    if not isinstance(job_id, str) or _ID_RE.fullmatch(job_id) is None:
        raise _Problem(
            f"{_short(job_id)} is not a lowercase UUIDv7 (e.g. '019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f'); "
            "omit id= to get a new one"
        )
    return job_id


def _created_queue(value: Any) -> str:
    _check_queue(value)
    if value.startswith(RESERVED_QUEUE_PREFIXES):
        raise _Problem(
            f"queue name {value!r} starts with a reserved prefix ({', '.join(RESERVED_QUEUE_PREFIXES)}): "
            "it would collide with the dead letter, retry or control queue of another queue"
        )
    return value


def _checked_int(value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Problem(f"must be an integer, got {type(value).__name__} {_short(value)}")
    if not minimum <= value <= MAX_SAFE_INTEGER:
        raise _Problem(f"must be between {minimum} and {MAX_SAFE_INTEGER}, got {value}")
    return int(value)


def _moment(value: Any, now: datetime, *, round_up: bool) -> str:
    """A scheduled_at/expires_at argument as an OJS timestamp."""
    if isinstance(value, timedelta):
        try:
            moment = now + value
        except OverflowError:
            raise _Problem(f"now + {value!r} is outside the supported dates") from None
    elif isinstance(value, datetime):
        moment = _aware(value)
    elif isinstance(value, str):
        moment = _timestamp(value)
    else:
        raise _Problem(
            f"expected an aware datetime, an RFC 3339 string or a timedelta from now, got {type(value).__name__}"
        )
    try:
        if round_up and moment.microsecond % 1000:
            moment += timedelta(microseconds=1000 - moment.microsecond % 1000)
        return _format_ts(moment)
    except OverflowError:
        raise _Problem(f"{moment!r} is outside the supported dates") from None


def _tags(tags: Any) -> list[str]:
    if not isinstance(tags, (list, tuple)):
        raise _Problem(f"must be a list of strings, got {type(tags).__name__}")
    for index, tag in enumerate(tags):
        if not isinstance(tag, str):
            raise _Problem(f"each tag must be a string, got {type(tag).__name__}", f"[{index}]")
    return list(tags)


def _retry_argument(retry: Any) -> RetryPolicy:
    if isinstance(retry, RetryPolicy):
        return retry
    if not isinstance(retry, Mapping):
        raise _Problem(f"must be a RetryPolicy or a dict, got {type(retry).__name__}")
    try:
        return RetryPolicy.__pydantic_validator__.validate_python(dict(retry))
    except _PydanticValidationError as exc:
        raise _convert(exc, "retry") from None


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
    biggest = max(parts, key=lambda name: len(_JSON_ENCODER.encode(parts[name]).encode("utf-8")))
    raise ValidationError(
        f"{biggest}: the envelope would be {size} bytes, over the {MAX_ENVELOPE_BYTES}-byte limit; "
        "store large payloads elsewhere and pass a reference",
        field=biggest,
    )


def _decode(data: Any, strict: bool) -> Any:
    if isinstance(data, str):
        # A str of n characters is n..4n UTF-8 bytes: only measure when it matters.
        if len(data) > MAX_ENVELOPE_BYTES or (
            4 * len(data) > MAX_ENVELOPE_BYTES and len(data.encode("utf-8", "surrogatepass")) > MAX_ENVELOPE_BYTES
        ):
            raise ValidationError(f"envelope is larger than {MAX_ENVELOPE_BYTES} bytes", field=None)
        text = data
    elif isinstance(data, (bytes, bytearray, memoryview)):
        if len(data) > MAX_ENVELOPE_BYTES:
            raise ValidationError(f"envelope is {len(data)} bytes, over the {MAX_ENVELOPE_BYTES}-byte limit")
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValidationError(f"envelope is not valid UTF-8: {exc}") from None
    else:
        raise ValidationError(f"expected JSON text, UTF-8 bytes or a dict, got {type(data).__name__}")
    if text.startswith("\ufeff"):
        if strict:
            raise ValidationError("envelope starts with a byte order mark; OJS requires UTF-8 without BOM")
        text = text[1:]
    try:
        obj = json.loads(text, parse_constant=_refuse_constant)
    except _Problem as problem:
        raise ValidationError(f"envelope is not valid JSON: {problem.text}") from None
    except ValueError as exc:  # JSONDecodeError, or an integer literal beyond sys.get_int_max_str_digits()
        raise ValidationError(f"envelope is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValidationError("envelope is not usable JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValidationError(f"envelope must be a JSON object, got a JSON {type(obj).__name__}")
    return obj


def _refuse_constant(name: str) -> Any:
    raise _Problem(f"{name} is not a JSON value")


__all__ = [
    "JOB_ID_PATTERN",
    "JOB_TYPE_PATTERN",
    "MAX_ENVELOPE_BYTES",
    "MAX_JOB_TYPE_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_QUEUE_NAME_LENGTH",
    "MAX_SAFE_INTEGER",
    "QUEUE_NAME_PATTERN",
    "SPEC_VERSION",
    "Job",
    "JobError",
    "JobState",
    "RetryPolicy",
    "UniquePolicy",
    "ensure_json_native",
    "format_duration",
    "format_timestamp",
    "parse_duration",
    "parse_timestamp",
    "utcnow",
]
