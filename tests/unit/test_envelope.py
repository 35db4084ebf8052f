"""Unit tests of the envelope (ojs_kombu.model): time and duration helpers, JSON-native checks,
the retry/unique/error models and the Job envelope (create, read, write)."""

from __future__ import annotations

import enum
import json
import re
import timeit
import uuid
from collections import OrderedDict
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pydantic
import pytest

from ojs_kombu.errors import ValidationError
from ojs_kombu.model import (
    JOB_ID_PATTERN,
    JOB_TYPE_PATTERN,
    MAX_ENVELOPE_BYTES,
    MAX_SAFE_INTEGER,
    QUEUE_NAME_PATTERN,
    SPEC_VERSION,
    Job,
    JobError,
    RetryPolicy,
    UniquePolicy,
    ensure_json_native,
    format_duration,
    format_timestamp,
    parse_duration,
    parse_timestamp,
    utcnow,
)

JOB_ID = "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f"
MINIMAL = {"specversion": "1.0", "id": JOB_ID, "type": "email.send", "queue": "default", "args": ["a@b.c"]}
CET = timezone(timedelta(hours=1))


def envelope(**changes):
    """MINIMAL with some fields changed (a value of ... removes the field)."""
    data = dict(MINIMAL, **changes)
    return {k: v for k, v in data.items() if v is not ...}


# --------------------------------------------------------------------------- constants


def test_constants():
    assert SPEC_VERSION == "1.0"
    assert MAX_ENVELOPE_BYTES == 1024 * 1024
    assert re.fullmatch(JOB_TYPE_PATTERN, "billing.invoice.generate_pdf")
    assert not re.fullmatch(JOB_TYPE_PATTERN, "Email.send")
    assert re.fullmatch(QUEUE_NAME_PATTERN, "high-priority.v2")
    assert not re.fullmatch(QUEUE_NAME_PATTERN, "-x")
    assert re.fullmatch(JOB_ID_PATTERN, JOB_ID)


# --------------------------------------------------------------------------- timestamps


def test_utcnow_is_aware_utc():
    now = utcnow()
    assert now.tzinfo is UTC
    assert abs((datetime.now(UTC) - now).total_seconds()) < 1


@pytest.mark.parametrize(
    "dt, text",
    [
        (datetime(2026, 2, 15, 10, 30, tzinfo=UTC), "2026-02-15T10:30:00.000Z"),
        (datetime(2026, 2, 15, 10, 30, 0, 123999, tzinfo=UTC), "2026-02-15T10:30:00.123Z"),
        (datetime(2026, 2, 15, 11, 30, tzinfo=CET), "2026-02-15T10:30:00.000Z"),
        (datetime(2026, 1, 1, 0, 30, tzinfo=CET), "2025-12-31T23:30:00.000Z"),
    ],
)
def test_format_timestamp(dt, text):
    assert format_timestamp(dt) == text


def test_format_timestamp_refuses_naive_and_non_datetimes():
    with pytest.raises(ValidationError, match="naive datetime"):
        format_timestamp(datetime(2026, 2, 15, 10, 30))
    with pytest.raises(ValidationError, match="expected a datetime"):
        format_timestamp("2026-02-15T10:30:00Z")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2026-02-15T10:30:00Z", datetime(2026, 2, 15, 10, 30, tzinfo=UTC)),
        ("2026-02-15T10:30:00.000Z", datetime(2026, 2, 15, 10, 30, tzinfo=UTC)),
        ("2026-02-15t10:30:00.5z", datetime(2026, 2, 15, 10, 30, 0, 500000, tzinfo=UTC)),
        ("2026-02-15T11:30:00+01:00", datetime(2026, 2, 15, 10, 30, tzinfo=UTC)),
        ("2026-02-15T10:30:00.123456789Z", datetime(2026, 2, 15, 10, 30, 0, 123456, tzinfo=UTC)),
    ],
)
def test_parse_timestamp(text, expected):
    parsed = parse_timestamp(text)
    assert parsed == expected
    assert parsed.utcoffset() is not None


@pytest.mark.parametrize("text", ["2026-02-15T10:30:00", "2026-02-15 10:30:00", "2026-02-15T10:30"])
def test_parse_timestamp_refuses_missing_timezone(text):
    with pytest.raises(ValidationError, match="no timezone"):
        parse_timestamp(text)


@pytest.mark.parametrize(
    "text",
    [
        "2026-02-15",
        "yesterday",
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2026-02-15T10:30:00+0100",
        "2026-02-15T10:30:00Z\n",
        "２０２６-02-15T10:30:00Z",
        "",
    ],
)
def test_parse_timestamp_refuses_garbage(text):
    with pytest.raises(ValidationError):
        parse_timestamp(text)


def test_parse_timestamp_refuses_non_strings():
    with pytest.raises(ValidationError, match="expected an RFC 3339 timestamp string"):
        parse_timestamp(datetime.now(UTC))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    "text, expected",
    [
        ("PT1S", timedelta(seconds=1)),
        ("PT0.5S", timedelta(milliseconds=500)),
        ("PT1.5S", timedelta(seconds=1.5)),
        ("PT5M", timedelta(minutes=5)),
        ("PT1H", timedelta(hours=1)),
        ("PT24H", timedelta(days=1)),
        ("P1D", timedelta(days=1)),
        ("P1DT2H", timedelta(days=1, hours=2)),
        ("P2W", timedelta(weeks=2)),
        ("P1DT1H1M1.25S", timedelta(days=1, hours=1, minutes=1, seconds=1.25)),
        ("PT0S", timedelta(0)),
        ("P0Y0M3D", timedelta(days=3)),
    ],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["P1Y", "P2M", "P1Y2M3D"])
def test_parse_duration_refuses_years_and_months(text):
    with pytest.raises(ValidationError, match="no fixed length"):
        parse_duration(text)


@pytest.mark.parametrize(
    "text", ["P", "PT", "P1DT", "1S", "PT1", "PT-1S", "-PT1S", "PT1.S", "pt1s", "PT1S ", "PT5M1H", "PT1S\n", ""]
)
def test_parse_duration_refuses_malformed(text):
    with pytest.raises(ValidationError, match="not an ISO 8601 duration"):
        parse_duration(text)


def test_parse_duration_refuses_non_strings_and_overflow():
    with pytest.raises(ValidationError, match="expected an ISO 8601 duration string"):
        parse_duration(5)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="too long"):
        parse_duration("P99999999999999D")


@pytest.mark.parametrize(
    "td, text",
    [
        (timedelta(seconds=1), "PT1S"),
        (timedelta(seconds=1.5), "PT1.5S"),
        (timedelta(minutes=5), "PT5M"),
        (timedelta(days=1, hours=2), "P1DT2H"),
        (timedelta(days=14), "P14D"),
        (timedelta(0), "PT0S"),
        (timedelta(microseconds=1), "PT0.000001S"),
        (timedelta(hours=1, minutes=2, seconds=3, milliseconds=40), "PT1H2M3.04S"),
    ],
)
def test_format_duration(td, text):
    assert format_duration(td) == text
    assert parse_duration(text) == td


def test_format_duration_refuses_negative_and_non_timedeltas():
    with pytest.raises(ValidationError, match="negative"):
        format_duration(timedelta(seconds=-1))
    with pytest.raises(ValidationError, match="expected a timedelta"):
        format_duration(5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- ensure_json_native


class Color(enum.IntEnum):
    RED = 1


class Mood(enum.StrEnum):
    HAPPY = "happy"


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -1,
        MAX_SAFE_INTEGER,
        -MAX_SAFE_INTEGER,
        1.5,
        -0.0,
        1e308,
        "",
        "日本語 🎉",
        [],
        {},
        [1, "a", None, {"b": [True, 2.5]}],
        (1, (2, 3)),
        OrderedDict(a=1),
        Color.RED,
        Mood.HAPPY,
        {"deep": [[[[{"x": None}]]]]},
    ],
)
def test_ensure_json_native_accepts(value):
    ensure_json_native(value, "args")


class Opaque:
    pass


@pytest.mark.parametrize(
    "value, path, fragment",
    [
        ([1, 2, {"when": datetime.now(UTC)}], "args[2].when", "datetime.datetime"),
        ([b"raw"], "args[0]", "bytes"),
        ([{1, 2}], "args[0]", "set"),
        ([Decimal("1.5")], "args[0]", "decimal.Decimal"),
        ([Opaque()], "args[0]", "Opaque"),
        ([date(2026, 1, 1)], "args[0]", "datetime.date"),
        ([uuid.uuid4()], "args[0]", "uuid.UUID"),
        ([float("nan")], "args[0]", "NaN"),
        ([float("inf")], "args[0]", "infinities"),
        ([{"a": [0, -float("inf")]}], "args[0].a[1]", "infinities"),
        ([2**53], "args[0]", "pass it as a string"),
        ([-(2**53)], "args[0]", "pass it as a string"),
        ([{1: "x"}], "args[0]", "keys must be strings"),
        (["\ud800"], "args[0]", "lone surrogate"),
        ([{"k": (1, object())}], "args[0].k[1]", "object"),
    ],
)
def test_ensure_json_native_refuses_with_exact_path(value, path, fragment):
    with pytest.raises(ValidationError) as info:
        ensure_json_native(value, "args")
    assert info.value.field == path
    assert fragment in str(info.value)
    assert str(info.value).startswith(path + ": ")


def test_ensure_json_native_large_ints_when_allowed():
    ensure_json_native([2**64], "args", allow_large_ints=True)


def test_ensure_json_native_refuses_cycles_and_deep_nesting():
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(ValidationError, match="nested deeper"):
        ensure_json_native(cycle, "args")
    deep: list = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(ValidationError, match="nested deeper"):
        ensure_json_native(deep, "args")


def test_ensure_json_native_top_level_field_name():
    with pytest.raises(ValidationError) as info:
        ensure_json_native(object(), "result")
    assert info.value.field == "result"


# --------------------------------------------------------------------------- RetryPolicy


def test_retry_policy_defaults_follow_the_spec():
    policy = RetryPolicy()
    assert policy.max_attempts == 3
    assert policy.initial_interval == "PT1S"
    assert policy.backoff_coefficient == 2.0
    assert policy.max_interval == "PT5M"
    assert policy.jitter is True
    assert policy.non_retryable_errors == []
    assert policy.on_exhaustion is None
    assert policy.backoff_strategy is None
    assert policy.initial_interval_seconds == 1.0
    assert policy.max_interval_seconds == 300.0
    assert policy.dead_letters_on_exhaustion is True
    assert policy.to_dict() == {}


def test_retry_policy_serialises_only_what_was_set():
    assert RetryPolicy(max_attempts=5).to_dict() == {"max_attempts": 5}
    assert RetryPolicy(on_exhaustion="discard", jitter=False).to_dict() == {"jitter": False, "on_exhaustion": "discard"}


def test_retry_policy_accepts_timedeltas():
    policy = RetryPolicy(initial_interval=timedelta(milliseconds=500), max_interval=timedelta(minutes=2))
    assert policy.to_dict() == {"initial_interval": "PT0.5S", "max_interval": "PT2M"}
    assert policy.initial_interval_seconds == 0.5
    assert policy.max_interval_seconds == 120.0


def test_retry_policy_exhaustion():
    assert RetryPolicy(on_exhaustion="dead_letter").dead_letters_on_exhaustion
    assert not RetryPolicy(on_exhaustion="discard").dead_letters_on_exhaustion


@pytest.mark.parametrize(
    "fields, field, fragment",
    [
        ({"max_attempts": -1}, "max_attempts", "greater than or equal to 0"),
        ({"max_attempts": True}, "max_attempts", "valid integer"),
        ({"max_attempts": "3"}, "max_attempts", "valid integer"),
        ({"backoff_coefficient": 0.5}, "backoff_coefficient", "greater than or equal to 1"),
        ({"backoff_coefficient": float("nan")}, "backoff_coefficient", ""),
        ({"initial_interval": "PT0S"}, "initial_interval", "greater than zero"),
        ({"initial_interval": "1s"}, "initial_interval", "not an ISO 8601 duration"),
        ({"initial_interval": 1}, "initial_interval", "duration string"),
        ({"initial_interval": "P1M"}, "initial_interval", "no fixed length"),
        ({"initial_interval": timedelta(seconds=-1)}, "initial_interval", "negative"),
        ({"initial_interval": "PT10S", "max_interval": "PT5S"}, "max_interval", "shorter than initial_interval"),
        ({"jitter": "yes"}, "jitter", "valid boolean"),
        ({"non_retryable_errors": ["a", "a"]}, "non_retryable_errors", "more than once"),
        ({"non_retryable_errors": [""]}, "non_retryable_errors[0]", "at least 1 character"),
        ({"on_exhaustion": "retry_forever"}, "on_exhaustion", "'discard' or 'dead_letter'"),
        ({"backoff_strategy": "fibonacci"}, "backoff_strategy", "exponential"),
        ({"max_atempts": 3}, "max_atempts", "unknown field"),
    ],
)
def test_retry_policy_refuses(fields, field, fragment):
    with pytest.raises(ValidationError) as info:
        RetryPolicy(**fields)
    assert info.value.field == field
    assert fragment in str(info.value)


def test_retry_policy_equal_intervals_are_fine():
    assert RetryPolicy(initial_interval="PT5S", max_interval="PT5S").max_interval_seconds == 5


@pytest.mark.parametrize(
    "error_type, expected",
    [
        ("ValueError", True),
        ("ValueErrorX", False),
        ("valueerror", False),
        ("auth.TokenExpired", True),
        ("auth.token.expired", True),
        ("auth", False),
        ("authz.denied", False),
        ("billing.card_declined", True),
        ("billing.other", False),
    ],
)
def test_is_non_retryable(error_type, expected):
    policy = RetryPolicy(non_retryable_errors=["ValueError", "auth.*", "billing.card_declined"])
    assert policy.is_non_retryable(error_type) is expected


def test_models_never_raise_pydantic_errors():
    for build in (
        lambda: RetryPolicy(max_attempts="x"),
        lambda: UniquePolicy(keys=["nope"]),
        lambda: JobError(type="X"),
        lambda: Job(specversion="1.0"),
        lambda: Job.model_validate({"args": 1}),
    ):
        with pytest.raises(ValidationError) as info:
            build()
        assert not isinstance(info.value, pydantic.ValidationError)


def test_assignment_is_validated():
    policy = RetryPolicy()
    with pytest.raises(ValidationError) as info:
        policy.max_attempts = -2
    assert info.value.field == "max_attempts"
    job = Job.create("a.b")
    with pytest.raises(ValidationError):
        job.queue = "Bad Queue"
    job.attempt = 2
    assert job.to_dict()["attempt"] == 2


# --------------------------------------------------------------------------- UniquePolicy / JobError


def test_unique_policy_without_keys_is_accepted():
    # The schema demands meta_keys for any unique policy without keys (its `if` is
    # vacuously true); we follow the intent: meta_keys only when keys contains "meta".
    assert UniquePolicy(on_conflict="reject").to_dict() == {"on_conflict": "reject"}


def test_unique_policy_rules():
    with pytest.raises(ValidationError) as info:
        UniquePolicy(keys=["type", "meta"])
    assert info.value.field == "meta_keys"
    UniquePolicy(keys=["type", "meta"], meta_keys=["tenant_id"])
    with pytest.raises(ValidationError) as info:
        UniquePolicy(keys=["type", "meta"], meta_keys=[])
    assert info.value.field == "meta_keys"
    with pytest.raises(ValidationError) as info:
        UniquePolicy(keys=["type", "type"])
    assert info.value.field == "keys"
    with pytest.raises(ValidationError) as info:
        UniquePolicy(states=["available", "running"])
    assert info.value.field == "states[1]"
    with pytest.raises(ValidationError) as info:
        UniquePolicy(period="1h")
    assert info.value.field == "period"
    # Calendar periods are legal here: nothing needs their length.
    assert UniquePolicy(period="P1M").period == "P1M"
    assert UniquePolicy(period=timedelta(hours=1)).period == "PT1H"


def test_job_error():
    error = JobError(type="ConnectionError", message="timed out", backtrace=["at a", "at b"])
    assert error.to_dict() == {"type": "ConnectionError", "message": "timed out", "backtrace": ["at a", "at b"]}
    with pytest.raises(ValidationError) as info:
        JobError(type="", message="m")
    assert info.value.field == "type"
    with pytest.raises(ValidationError) as info:
        JobError(type="X", message="m", backtrace=["f"] * 51)
    assert info.value.field == "backtrace"
    with pytest.raises(ValidationError) as info:
        JobError(type="X", message="m", code="E1")
    assert info.value.field == "code"


# --------------------------------------------------------------------------- Job.create


def test_create_minimal():
    before = utcnow()
    job = Job.create("email.send", ["a@b.c", "welcome"])
    data = job.to_dict()
    assert set(data) == {"specversion", "id", "type", "queue", "args", "attempt", "created_at", "enqueued_at"}
    assert data["specversion"] == "1.0"
    assert re.fullmatch(JOB_ID_PATTERN, data["id"])
    assert data["queue"] == "default"
    assert data["args"] == ["a@b.c", "welcome"]
    assert data["attempt"] == 0
    assert data["created_at"] == data["enqueued_at"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", data["created_at"])
    assert before - timedelta(milliseconds=1) <= job.created_datetime <= utcnow()
    assert job.kwargs == {}
    assert job.scheduled_datetime is None


def test_create_ids_are_unique_and_ordered():
    ids = [Job.create("a.b").id for _ in range(200)]
    assert len(set(ids)) == 200
    assert ids == sorted(ids)


def test_create_all_options():
    retry = RetryPolicy(max_attempts=5, on_exhaustion="dead_letter")
    job = Job.create(
        "report.generate",
        (42, "q4"),
        queue="reports",
        kwargs={"charts": True},
        meta={"tenant_id": "acme"},
        priority=10,
        retry=retry,
        scheduled_at=timedelta(minutes=5),
        expires_at=timedelta(hours=1),
        timeout=300,
        tags=("finance", "q4"),
        id=JOB_ID,
    )
    data = job.to_dict()
    assert data["id"] == JOB_ID
    assert data["args"] == [42, "q4"]
    assert data["meta"] == {"tenant_id": "acme", "kwargs": {"charts": True}, "tags": ["finance", "q4"]}
    assert data["priority"] == 10 and data["timeout"] == 300
    assert data["retry"] == {"max_attempts": 5, "on_exhaustion": "dead_letter"}
    assert job.kwargs == {"charts": True}
    created = job.created_datetime
    assert timedelta(minutes=5) <= job.scheduled_datetime - created < timedelta(minutes=5, milliseconds=2)
    assert timedelta(hours=1) - timedelta(milliseconds=1) <= job.expires_datetime - created <= timedelta(hours=1)


def test_create_does_not_alias_caller_containers():
    args, meta, kwargs = [1], {"a": 1}, {"k": 1}
    job = Job.create("a.b", args, meta=meta, kwargs=kwargs)
    args.append(2)
    meta["b"] = 2
    assert job.args == [1]
    assert meta == {"a": 1, "b": 2}  # untouched by create (kwargs went into a copy)
    assert job.meta == {"a": 1, "kwargs": {"k": 1}}


def test_create_empty_kwargs_and_tags_are_omitted():
    data = Job.create("a.b", kwargs={}, tags=[], meta={}).to_dict()
    assert "meta" not in data


def test_create_scheduled_at_forms():
    when = datetime(2030, 1, 2, 4, 4, 5, 123456, tzinfo=CET)
    assert Job.create("a.b", scheduled_at=when).scheduled_at == "2030-01-02T03:04:05.124Z"  # rounded up
    assert Job.create("a.b", expires_at=when).expires_at == "2030-01-02T03:04:05.123Z"
    assert Job.create("a.b", scheduled_at="2030-01-02T04:04:05+01:00").scheduled_at == "2030-01-02T03:04:05.000Z"
    assert Job.create("a.b", scheduled_at=datetime(2030, 1, 1, tzinfo=UTC)).scheduled_datetime == datetime(
        2030, 1, 1, tzinfo=UTC
    )


def test_create_accepts_uuid_objects_and_retry_dicts():
    job = Job.create("a.b", id=uuid.UUID(JOB_ID), retry={"max_attempts": 1, "initial_interval": timedelta(seconds=2)})
    assert job.id == JOB_ID
    assert job.retry.to_dict() == {"max_attempts": 1, "initial_interval": "PT2S"}


class Unpicklable:
    def __reduce__(self):
        return (Unpicklable, ())


@pytest.mark.parametrize(
    "kwargs, field, fragment",
    [
        ({"type": "Email.Send"}, "type", "dot-separated lowercase"),
        ({"type": "email-send"}, "type", "dot-separated lowercase"),
        ({"type": ""}, "type", "invalid"),
        ({"type": "a" * 256}, "type", "255"),
        ({"type": 5}, "type", "must be a string"),
        ({"queue": "My Queue"}, "queue", "lowercase"),
        ({"queue": "a" * 129}, "queue", "128"),
        ({"queue": "dlx.email"}, "queue", "reserved prefix"),
        ({"queue": "retry.email"}, "queue", "reserved prefix"),
        ({"queue": "control.email"}, "queue", "reserved prefix"),
        ({"args": "abc"}, "args", "list of positional arguments"),
        ({"args": {"a": 1}}, "args", "kwargs="),
        ({"args": [1, {"when": datetime(2026, 1, 1)}]}, "args[1].when", "datetime"),
        ({"args": [float("nan")]}, "args[0]", "NaN"),
        ({"args": [Unpicklable()]}, "args[0]", "Unpicklable"),
        ({"args": [b"x"]}, "args[0]", "bytes"),
        ({"args": [2**60]}, "args[0]", "string"),
        ({"kwargs": {"when": {1, 2}}}, "kwargs.when", "set"),
        ({"kwargs": [1]}, "kwargs", "dict of keyword arguments"),
        ({"kwargs": {"a": 1}, "meta": {"kwargs": {}}}, "kwargs", "both"),
        ({"meta": {"trace": Decimal(1)}}, "meta.trace", "Decimal"),
        ({"meta": [1]}, "meta", "must be a dict"),
        ({"tags": "urgent"}, "tags", "list of strings"),
        ({"tags": ["ok", 3]}, "tags[1]", "must be a string"),
        ({"tags": ["x"], "meta": {"tags": ["y"]}}, "tags", "both"),
        ({"priority": "high"}, "priority", "integer"),
        ({"priority": True}, "priority", "integer"),
        ({"priority": 1.5}, "priority", "integer"),
        ({"priority": 2**60}, "priority", "between"),
        ({"timeout": -1}, "timeout", "between 0"),
        ({"timeout": 2.5}, "timeout", "integer"),
        ({"scheduled_at": datetime(2030, 1, 1)}, "scheduled_at", "naive datetime"),
        ({"scheduled_at": "2030-01-01T00:00:00"}, "scheduled_at", "no timezone"),
        ({"scheduled_at": "tomorrow"}, "scheduled_at", "RFC 3339"),
        ({"scheduled_at": 60}, "scheduled_at", "timedelta"),
        ({"scheduled_at": timedelta(days=999_999_999)}, "scheduled_at", "outside the supported dates"),
        ({"scheduled_at": datetime.max.replace(tzinfo=CET)}, "scheduled_at", "outside the supported dates"),
        ({"expires_at": datetime(2030, 1, 1)}, "expires_at", "naive datetime"),
        ({"retry": {"max_attempts": -1}}, "retry.max_attempts", "greater than or equal to 0"),
        ({"retry": {"initial_interval": "PT0S"}}, "retry.initial_interval", "greater than zero"),
        ({"retry": {"initial_interval": "PT9S", "max_interval": "PT1S"}}, "retry.max_interval", "shorter"),
        ({"retry": {"backoff_coefficient": 0.9}}, "retry.backoff_coefficient", "1"),
        ({"retry": {"on_exhaustion": "keep"}}, "retry.on_exhaustion", "dead_letter"),
        ({"retry": {"maxAttempts": 3}}, "retry.maxAttempts", "unknown field"),
        ({"retry": 3}, "retry", "RetryPolicy or a dict"),
        ({"id": JOB_ID.upper()}, "id", "lowercase UUIDv7"),
        ({"id": str(uuid.uuid4())}, "id", "UUIDv7"),
        ({"id": "job-1"}, "id", "UUIDv7"),
    ],
)
def test_create_refuses_bad_arguments(kwargs, field, fragment):
    call = {"type": "email.send", **kwargs}
    with pytest.raises(ValidationError) as info:
        Job.create(**call)
    assert info.value.field == field, str(info.value)
    assert fragment in str(info.value)
    assert info.value.errors and info.value.errors[0]["field"] == field


def test_create_checks_names_each_time_until_they_pass():
    # Valid names are remembered; a refused one is refused again, after a valid one too.
    for _ in range(2):
        assert Job.create("name.check", queue="named").queue == "named"
        for bad in ({"type": "Name.Check"}, {"queue": "dlx.named"}, {"queue": "Named"}):
            with pytest.raises(ValidationError) as info:
                Job.create(**{"type": "name.check", **bad})
            assert info.value.field == next(iter(bad))

    class Text(str):
        pass

    job = Job.create(Text("name.check"), queue=Text("named"))
    assert type(job.type) is Text and type(job.queue) is Text


def test_create_walks_flat_and_nested_args_alike():
    text = "x" * (MAX_ENVELOPE_BYTES // 12)  # ~half the limit as a JSON worst case: a size check runs
    assert Job.create("a.b", [text, 1, -(2**53 - 1)]).args == [text, 1, -(2**53 - 1)]
    for args, path in (
        ([1, "\ud800"], "args[1]"),
        (["ok", 2**53], "args[1]"),
        ([True, 1.5, [float("inf")]], "args[2][0]"),
    ):
        with pytest.raises(ValidationError) as info:
            Job.create("a.b", args)
        assert info.value.field == path


def test_create_refuses_envelopes_over_one_mebibyte():
    with pytest.raises(ValidationError) as info:
        Job.create("a.b", ["x" * MAX_ENVELOPE_BYTES])
    assert info.value.field == "args"
    assert "limit" in str(info.value)
    with pytest.raises(ValidationError) as info:
        Job.create("a.b", ["small"], kwargs={"blob": "é" * (MAX_ENVELOPE_BYTES // 2)})
    assert info.value.field == "kwargs"


def test_create_accepts_large_envelopes_under_the_limit():
    job = Job.create("a.b", ["x" * (MAX_ENVELOPE_BYTES - 1000)])
    assert len(job.to_json().encode()) <= MAX_ENVELOPE_BYTES


def test_create_and_to_json_are_fast():
    # Measured at ~20 µs on the 2-core dev machine; the bound only catches regressions.
    number = 2000
    seconds = min(
        timeit.repeat(lambda: Job.create("email.send", ["a@b.c", "welcome"]).to_json(), number=number, repeat=3)
    )
    assert seconds / number < 200e-6


# --------------------------------------------------------------------------- writing


def test_to_json_is_compact_utf8_and_round_trips():
    job = Job.create("notification.send", ["用户@example.com", "Bienvenue 🎉"], kwargs={"ñ": "ü"})
    text = job.to_json()
    assert ", " not in text and ": " not in text
    assert "用户" in text and "\\u" not in text
    assert Job.from_json(text).to_json() == text
    assert Job.from_json(text.encode("utf-8")).to_dict() == job.to_dict()


def test_to_dict_omits_unset_and_none_and_keeps_unknown_fields():
    job = Job.from_json(envelope(x_custom={"a": 1}, priority=0))
    assert job.to_dict() == envelope(x_custom={"a": 1}, priority=0)
    assert job.x_custom == {"a": 1}
    assert job.attempt == 0 and "attempt" not in job.to_dict()
    job.priority = None
    assert "priority" not in job.to_dict()


def test_model_copy_update_is_serialised():
    job = Job.create("a.b")
    retried = job.model_copy(update={"attempt": 1, "error": JobError(type="E", message="m")})
    data = retried.to_dict()
    assert data["attempt"] == 1
    assert data["error"] == {"type": "E", "message": "m"}
    assert job.to_dict()["attempt"] == 0


def test_to_dict_turns_a_model_into_a_dict_in_any_field():
    policy = RetryPolicy(max_attempts=2)
    job = Job.create("a.b").model_copy(update={"result": policy, "retry": policy})
    assert job.to_dict()["result"] == {"max_attempts": 2} == job.to_dict()["retry"]


def test_schema_field_uses_its_json_name():
    job = Job.from_json(envelope(schema="urn:ojs:schema:email.send:v1"))
    assert job.schema_uri == "urn:ojs:schema:email.send:v1"
    assert job.to_dict()["schema"] == "urn:ojs:schema:email.send:v1"
    with pytest.raises(ValidationError) as info:
        Job.from_json(envelope(schema="not a uri"))
    assert info.value.field == "schema"


def test_datetime_accessors():
    job = Job.from_json(
        envelope(
            created_at="2026-02-12T10:30:00.000Z",
            enqueued_at="2026-02-12T10:30:00.000Z",
            started_at="2026-02-12T10:30:01.456Z",
            completed_at="2026-02-12T10:30:02.789+01:00",
            scheduled_at="2026-02-17T08:00:00+01:00",
            expires_at="2026-03-01T18:00:00Z",
        )
    )
    assert job.scheduled_datetime == datetime(2026, 2, 17, 7, tzinfo=UTC)
    assert job.expires_datetime == datetime(2026, 3, 1, 18, tzinfo=UTC)
    assert job.created_datetime == job.enqueued_datetime == datetime(2026, 2, 12, 10, 30, tzinfo=UTC)
    assert job.started_datetime.microsecond == 456000
    assert job.completed_datetime == datetime(2026, 2, 12, 9, 30, 2, 789000, tzinfo=UTC)
    assert job.to_dict()["scheduled_at"] == "2026-02-17T08:00:00+01:00"  # kept as given


def test_retry_policy_accessor_defaults():
    assert Job.create("a.b").retry_policy.max_attempts == 3
    assert Job.create("a.b", retry={"max_attempts": 7}).retry_policy.max_attempts == 7


# --------------------------------------------------------------------------- reading


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"specversion": ...}, "specversion"),
        ({"specversion": "1.0.0"}, "specversion"),
        ({"id": JOB_ID.upper()}, "id"),
        ({"id": "550e8400-e29b-41d4-a716-446655440000"}, "id"),
        ({"type": "Email.Send"}, "type"),
        ({"queue": ...}, "queue"),
        ({"args": None}, "args"),
        ({"args": "x"}, "args"),
        ({"args": [2**53]}, "args[0]"),
        ({"meta": []}, "meta"),
        ({"meta": None}, "meta"),
        ({"priority": None}, "priority"),
        ({"priority": "1"}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"timeout": -1}, "timeout"),
        ({"attempt": True}, "attempt"),
        ({"created_at": "2026-02-12T10:30:00"}, "created_at"),
        ({"scheduled_at": 1700000000}, "scheduled_at"),
        ({"state": "processing"}, "state"),
        ({"retry": {"max_attempts": 3, "x_extra": 1}}, "retry.x_extra"),
        ({"retry": {"jitter": None}}, "retry.jitter"),
        ({"retry": {"initial_interval": "P1Y"}}, "retry.initial_interval"),
        ({"unique": {"keys": ["meta"]}}, "unique.meta_keys"),
        ({"unique": {"period": "soon"}}, "unique.period"),
        ({"error": {"type": "E", "message": "m", "code": "X"}}, "error.code"),
        ({"error": {"type": "E", "message": ""}}, "error.message"),
        (
            {"errors": [{"code": "E", "message": "m", "attempt": 0, "occurred_at": "2026-02-12T10:30:00Z"}]},
            "errors[0].attempt",
        ),
        (
            {"errors": [{"code": "E", "message": "m", "attempt": 1, "occurred_at": "2026-02-12"}]},
            "errors[0].occurred_at",
        ),
        ({"errors": [{"code": "E", "message": "m", "attempt": 1}]}, "errors[0].occurred_at"),
        ({"errors": [{"message": "m", "attempt": 1, "occurred_at": "2026-02-12T10:30:00Z"}]}, "errors[0].code"),
        ({"errors": ["boom"]}, "errors[0]"),
        ({"x_big": 2**60}, "x_big"),
    ],
)
def test_from_json_strict_refuses(changes, field):
    with pytest.raises(ValidationError) as info:
        Job.from_json(json.dumps(envelope(**changes)))
    assert info.value.field == field, str(info.value)


def test_from_json_accepts_integral_floats_as_json_schema_does():
    job = Job.from_json(f'{{"specversion":"1.0","id":"{JOB_ID}","type":"a","queue":"q","args":[],"priority":5.0}}')
    assert job.priority == 5 and type(job.priority) is int


def test_from_json_result_null_is_absent():
    job = Job.from_json(envelope(state="completed", result=None))
    assert "result" not in job.to_dict()
    assert Job.from_json(envelope(result={"ok": [1, None]})).result == {"ok": [1, None]}


def test_from_json_tolerant():
    body = {
        "id": "019461A8-1A2B-4C3D-8E4F-5A6B7C8D9E0F",  # uppercase, and a v4
        "type": "email.send",
        "queue": "default",
        "args": [2**60],
        "meta": None,
        "priority": None,
        "retry": {"max_attempts": 2, "jitter": None, "x_vendor": {"a": 1}},
        "error": {"type": "E", "message": "m", "code": "HANDLER_ERROR"},
        "unique": {"keys": ["type"], "x_scope": "global"},
        "x_unknown": None,
    }
    job = Job.from_json(json.dumps(body), strict=False)
    assert job.to_dict() == {
        "specversion": "1.0",
        "id": "019461a8-1a2b-4c3d-8e4f-5a6b7c8d9e0f",
        "type": "email.send",
        "queue": "default",
        "args": [2**60],
        "retry": {"max_attempts": 2, "x_vendor": {"a": 1}},
        "unique": {"keys": ["type"], "x_scope": "global"},
        "error": {"type": "E", "message": "m", "code": "HANDLER_ERROR"},
        "x_unknown": None,
    }
    assert job.retry.jitter is True


@pytest.mark.parametrize(
    "changes",
    [
        {"id": "not-a-uuid"},
        {"type": "Email"},
        {"args": None},
        {"args": ...},
        {"queue": ...},
        {"specversion": "2.0"},
        {"retry": {"max_attempts": -1}},
        {"args": [float("nan")]},
    ],
)
def test_from_json_tolerant_still_refuses_broken_envelopes(changes):
    with pytest.raises(ValidationError):
        Job.from_json(envelope(**changes), strict=False)


@pytest.mark.parametrize("strict", [True, False])
def test_from_json_refuses_bad_bodies(strict):
    with pytest.raises(ValidationError, match="not valid UTF-8"):
        Job.from_json(b'{"type": "\xff"}', strict=strict)
    with pytest.raises(ValidationError, match="is not JSON"):
        Job.from_json('{"type": ', strict=strict)
    with pytest.raises(ValidationError, match="is not JSON: NaN"):
        Job.from_json(json.dumps(envelope()).replace('["a@b.c"]', "[NaN]"), strict=strict)
    with pytest.raises(ValidationError, match="JSON object"):
        Job.from_json("[1, 2]", strict=strict)
    with pytest.raises(ValidationError, match="expected JSON text"):
        Job.from_json(42, strict=strict)  # type: ignore[arg-type]
    big = json.dumps(envelope(args=["x" * MAX_ENVELOPE_BYTES]))
    with pytest.raises(ValidationError, match="larger than|over the"):
        Job.from_json(big, strict=strict)
    with pytest.raises(ValidationError, match="over the"):
        Job.from_json(big.encode(), strict=strict)
    multibyte = json.dumps(envelope(args=["é" * (MAX_ENVELOPE_BYTES // 2 + 10)]), ensure_ascii=False)
    assert len(multibyte) < MAX_ENVELOPE_BYTES
    with pytest.raises(ValidationError, match="larger than"):
        Job.from_json(multibyte, strict=strict)


def test_from_json_byte_order_mark():
    body = "\ufeff" + json.dumps(envelope())
    with pytest.raises(ValidationError, match="byte order mark"):
        Job.from_json(body)
    assert Job.from_json(body.encode("utf-8"), strict=False).id == JOB_ID


def test_from_json_accepts_bodies_just_under_the_limit():
    text = json.dumps(envelope(args=[]))
    padding = MAX_ENVELOPE_BYTES - len(text) - 2
    body = json.dumps(envelope(args=["x" * padding]), separators=(",", ":"))
    assert len(body.encode()) <= MAX_ENVELOPE_BYTES
    assert len(Job.from_json(body.encode()).args[0]) == padding


def test_direct_construction():
    job = Job(specversion="1.0", id=JOB_ID, type="a.b", queue="q", args=(1, 2), retry={"max_attempts": 1})
    assert job.args == [1, 2]
    assert job.to_dict()["retry"] == {"max_attempts": 1}
    with pytest.raises(ValidationError) as info:
        Job(specversion="1.0", id=JOB_ID, type="a.b", queue="q", args=[{"when": date.today()}])
    assert info.value.field == "args[0].when"
