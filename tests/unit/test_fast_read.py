"""The fast tolerant read (``Job._read_common``) agrees with the model's tolerant validation.

``Job.from_json(strict=False)`` reads a plain envelope without pydantic; anything
else goes through ``model_validate``.  Whatever the fast path returns must be the
job the model returns (fields, fields set, extras), and wherever the model
refuses an envelope the fast path must step aside, so the model's error (and the
consumer's DLQ code) is unchanged.  Checked on every OJS fixture and on
variants of them and of created envelopes, field by field.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.base import mode_context
from ojs_kombu.model.job import Job
from ojs_kombu.wire.codec import decode, encode
from tools.schema import fixtures_dir

FIXTURES = sorted((fixtures_dir() / "valid").glob("*.json")) + sorted((fixtures_dir() / "invalid").glob("*.json"))
CREATED = Job.create("email.send", ["a@b.c", 1], meta={"tags": ["x"]}, priority=3, timeout=30).to_dict()

#: Values each plain field is tried with (besides those of the fixtures).
ODD_VALUES: list[Any] = [
    None,
    "",
    "1.0",
    "2.0",
    "x" * 300,
    "email.send",
    "Email.Send",
    "default",
    "-bad",
    "01A20E84-0BDC-76EC-B0CA-92A2CCE329FE",
    "01a20e84-0bdc-46ec-b0ca-92a2cce329fe",
    "01a20e84-0bdc-76ec-b0ca-92a2cce329f",
    "2026-02-12T10:30:00Z",
    "2026-02-12t10:30:00.5+01:00",
    "2026-02-12T10:30:00",
    "2026-02-30T10:30:00Z",
    0,
    1,
    -1,
    5.0,
    1.5,
    True,
    False,
    2**53 - 1,
    2**53,
    -(2**53) + 1,
    -(2**53),
    [],
    [1, "a", None, {"k": [True]}],
    [2**60],
    [float("nan")],
    {},
    {"kwargs": {"a": 1}},
    {"k": 2**60},
    {1: "non-string key"},
    ("tuple",),
]
PLAIN_KEYS = [
    "specversion",
    "id",
    "type",
    "queue",
    "args",
    "meta",
    "priority",
    "timeout",
    "attempt",
    "scheduled_at",
    "expires_at",
    "created_at",
    "enqueued_at",
    "started_at",
    "completed_at",
    "retry",
]
#: ``retry`` objects: the fast path reads those of scalars through the model (cached), the rest it leaves.
RETRY_VALUES: list[Any] = [
    {"max_attempts": 1, "initial_interval": "PT15S", "max_interval": "PT5M"},
    {"max_attempts": 5},
    {"max_attempts": True},
    {"max_attempts": 1.0},
    {"max_attempts": 1.5},
    {"max_attempts": "5"},
    {"max_attempts": -1},
    {"max_attempts": None, "backoff_coefficient": 2},
    {"max_attempts": 3, "x-extension": "kept"},
    {"initial_interval": "PT0S"},
    {"initial_interval": "PT10S", "max_interval": "PT1S"},
    {"initial_interval": "10 seconds"},
    {"backoff_strategy": "linear"},
    {"backoff_strategy": "sideways"},
    {"on_exhaustion": "discard"},
    {"non_retryable_errors": ["ValueError"]},
    {"max_attempts": 3, "nested": {"a": 1}},
]


def model_read(data: dict[str, Any]) -> Job | ValidationError:
    try:
        return Job.model_validate(copy.deepcopy(data), context=mode_context(strict=False))
    except ValidationError as exc:
        return exc


def same_job(fast: Job, model: Job) -> None:
    assert fast.__dict__ == model.__dict__
    assert list(fast.__dict__) == list(model.__dict__)
    assert fast.model_fields_set == model.model_fields_set
    assert (fast.__pydantic_extra__ or {}) == (model.__pydantic_extra__ or {})
    assert fast.to_json() == model.to_json()


def check_agreement(data: dict[str, Any]) -> bool:
    """Assert the fast path agrees with the model on ``data``; return whether it took it."""
    before = copy.deepcopy(data)
    fast = Job._read_common(data)
    assert data == before  # never modified
    model = model_read(data)
    if fast is None:
        return False
    assert isinstance(model, Job), f"the fast path accepted what the model refuses: {model}"
    same_job(fast, model)
    return True


def variants() -> list[dict[str, Any]]:
    fixtures = [json.loads(path.read_text(encoding="utf-8")) for path in FIXTURES]
    # The fixtures' "_description" is an unknown field (the model's business): also try them without it.
    bases = fixtures + [{k: v for k, v in f.items() if k != "_description"} for f in fixtures] + [CREATED]
    out: list[dict[str, Any]] = []
    for base in bases:
        out.append(base)
        for key in PLAIN_KEYS:
            out.append({k: v for k, v in base.items() if k != key})
            for value in ODD_VALUES:
                out.append({**base, key: value})
        out.extend({**base, "retry": value} for value in RETRY_VALUES)
    return out


VARIANTS = variants()


def test_the_fast_path_agrees_with_the_model_on_every_variant():
    taken = sum(check_agreement(data) for data in VARIANTS)
    # Not vacuous: of the variants the model accepts that hold only plain fields, the fast path
    # reads all but the ones it leaves to the model on purpose (a tuple, a float integer).
    plain = [d for d in VARIANTS if set(d) <= set(PLAIN_KEYS) and isinstance(model_read(d), Job)]
    assert taken > 0.9 * len(plain) > 400


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}-{p.stem}")
def test_every_fixture_reads_as_the_model_reads_it(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    check_agreement(data)
    text = path.read_bytes()
    try:
        expected: Job | None = Job.model_validate(data, context=mode_context(strict=False))
    except ValidationError as exc:
        with pytest.raises(ValidationError) as info:
            Job.from_json(text, strict=False)
        assert str(info.value) == str(exc)
        assert info.value.field == exc.field
        return
    assert expected is not None
    same_job(Job.from_json(text, strict=False), expected)


def test_a_created_envelope_takes_the_fast_path():
    assert Job._read_common(CREATED) is not None
    minimal = Job.create("a.b").to_dict()
    assert Job._read_common(minimal) is not None


def test_the_fast_path_copies_args_and_meta_like_the_model():
    data = {**CREATED, "args": [[1]], "meta": {"k": [2]}}
    job = Job._read_common(data)
    assert job is not None
    assert job.args == [[1]] and job.args is not data["args"]
    assert job.meta == {"k": [2]} and job.meta is not data["meta"]


def test_other_fields_go_to_the_model():
    for key, value in [
        ("retry", {"non_retryable_errors": ["ValueError"]}),  # not only scalars
        ("unique", {"keys": ["type"]}),
        ("state", "available"),
        ("schema", "urn:x"),
        ("result", 1),
        ("x-custom", 1),
    ]:
        assert Job._read_common({**CREATED, key: value}) is None
        check_agreement({**CREATED, key: value})


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"id": "not-a-uuid"}, "invalid_envelope"),
        ({"timeout": -1}, "invalid_envelope"),
        ({"args": {"a": 1}}, "invalid_envelope"),
        ({"type": "Bad-Type"}, "invalid_envelope"),
        ({"created_at": "2026-02-12T10:30:00"}, "invalid_envelope"),
    ],
)
def test_decode_gives_the_same_typed_error(change, code):
    message = encode(Job.create("email.send", ["a"]))
    body = json.dumps({**json.loads(message.body), **change}).encode()
    with pytest.raises(DecodeError) as info:
        decode(body, message.properties, message.headers)
    assert info.value.code == code
    expected = model_read({**json.loads(body), "attempt": 0})
    assert isinstance(expected, ValidationError)
    assert str(info.value) == str(expected)


def test_a_retry_policy_of_scalars_takes_the_fast_path():
    # Every adapter sends one: without it no Dramatiq or Celery envelope took the fast path.
    for value in RETRY_VALUES[:2] + [{"max_attempts": 3, "x-extension": "kept"}]:
        assert check_agreement({**CREATED, "retry": value})
    # What the model refuses, the fast path leaves to it (and the model words the error).
    for value in ({"max_attempts": "5"}, {"initial_interval": "PT0S"}, {"backoff_strategy": "sideways"}):
        assert not check_agreement({**CREATED, "retry": value})


def test_jobs_read_with_the_same_retry_policy_do_not_share_it():
    data = {**CREATED, "retry": {"max_attempts": 4, "initial_interval": "PT2S"}}
    first, second = Job._read_common(data), Job._read_common(data)
    assert first is not None and second is not None and first.retry is not None and second.retry is not None
    assert first.retry is not second.retry
    first.retry.max_attempts = 9
    assert second.retry.max_attempts == 4
    third = Job._read_common(data)
    assert third is not None and third.retry is not None and third.retry.max_attempts == 4


def test_a_subclass_is_built_by_the_model():
    class Custom(Job):
        note: str = "default"

    job = Custom.from_json(json.dumps(CREATED), strict=False)
    assert type(job) is Custom and job.note == "default"


def test_a_second_reading_with_names_and_timestamps_remembered_agrees_as_the_first():
    """Job types, queue names and timestamps are checked once and remembered (refused ones never):
    reading every variant again takes the fast path for exactly the same ones."""
    first = [check_agreement(data) for data in VARIANTS]
    second = [check_agreement(data) for data in VARIANTS]
    assert first == second
    for bad in ({"type": "Bad-Type"}, {"queue": "-bad"}, {"created_at": "2026-02-12T10:30:00"}):
        for _ in range(2):
            assert Job._read_common({**CREATED, **bad}) is None
            assert isinstance(model_read({**CREATED, **bad}), ValidationError)
