"""The envelope against the official OJS JSON Schemas and their fixtures (../shared/ojs-json-schema).

* every valid fixture parses strictly and ``to_dict()`` gives the fixture back;
* every invalid fixture is refused by ``Job.from_json(strict=True)``;
* every envelope ``Job.create`` produces validates against job.schema.json;
* tolerant reading produces schema-valid envelopes where the input allows it.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import jsonschema
import pytest

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.policies import RetryPolicy
from tools.schema import fixtures_dir, job_validator, schema_dir, schema_errors, validate_job

VALID = sorted((fixtures_dir() / "valid").glob("*.json"))
INVALID = sorted((fixtures_dir() / "invalid").glob("*.json"))


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_fixture_sets_are_complete():
    assert schema_dir().is_dir()
    assert len(VALID) == 17
    assert len(INVALID) == 24


def test_the_validator_is_cached_and_checks_formats():
    assert job_validator() is job_validator()
    with pytest.raises(jsonschema.ValidationError, match="date-time"):
        validate_job({**load(VALID[0]), "created_at": "2026-02-12T10:30:00"})


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_fixture_round_trips(path):
    fixture = load(path)
    validate_job(fixture)  # the schema agrees it is valid
    job = Job.from_json(path.read_bytes(), strict=True)
    assert job.to_dict() == fixture
    assert Job.from_json(job.to_json()).to_dict() == fixture
    assert Job.from_json(path.read_text(encoding="utf-8"), strict=False).to_dict() == fixture


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_fixture_is_refused(path):
    fixture = load(path)
    assert schema_errors(fixture), "the schema itself should refuse this fixture"
    with pytest.raises(ValidationError) as info:
        Job.from_json(path.read_bytes(), strict=True)
    assert info.value.field  # always names what is wrong


CREATED = {
    "minimal": lambda: Job.create("email.send", ["a@b.c", "welcome"]),
    "no_args": lambda: Job.create("cache.warmup"),
    "retry_policy": lambda: Job.create(
        "data.sync",
        ["db"],
        retry=RetryPolicy(
            max_attempts=5,
            initial_interval=timedelta(milliseconds=500),
            max_interval=timedelta(minutes=10),
            jitter=False,
            non_retryable_errors=["ValueError", "auth.*"],
            on_exhaustion="dead_letter",
        ),
    ),
    "retry_dict": lambda: Job.create("data.sync", retry={"max_attempts": 0, "on_exhaustion": "discard"}),
    "retry_defaults": lambda: Job.create("data.sync", retry=RetryPolicy()),
    "scheduled_timedelta": lambda: Job.create("report.build", scheduled_at=timedelta(seconds=30)),
    "scheduled_datetime": lambda: Job.create(
        "report.build",
        scheduled_at=datetime(2030, 5, 1, 9, 0, 0, 1, tzinfo=timezone(timedelta(hours=-5))),
        expires_at="2030-05-02T00:00:00+02:00",
    ),
    "kwargs": lambda: Job.create("email.send", ["a@b.c"], kwargs={"template": "welcome", "vars": {"n": 1}}),
    "tags_meta": lambda: Job.create("email.send", tags=["x", "y"], meta={"tenant_id": "acme", "traceparent": "00-a"}),
    "priority_timeout": lambda: Job.create("email.send", priority=-10, timeout=0, queue="high-priority.v2"),
    "unicode": lambda: Job.create(
        "notification.send", ["用户@example.com", "Bienvenue 🎉", "\u0000\u001f"], kwargs={"日本語": "テスト"}
    ),
    "nested": lambda: Job.create("data.etl.transform", [{"a": [1, 2.5, None, True, {"b": []}]}, [], 2**53 - 1]),
    "explicit_id": lambda: Job.create("a.b", id="019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f"),
}


@pytest.mark.parametrize("name", sorted(CREATED))
def test_created_envelopes_validate_against_the_schema(name):
    job = CREATED[name]()
    data = job.to_dict()
    validate_job(data)
    validate_job(json.loads(job.to_json()))
    assert Job.from_json(job.to_json(), strict=True).to_dict() == data


@pytest.mark.parametrize("name", sorted(CREATED))
def test_created_envelopes_carry_the_always_emitted_fields(name):
    data = CREATED[name]().to_dict()
    for key in ("specversion", "id", "type", "queue", "args", "created_at", "enqueued_at", "attempt"):
        assert key in data


def test_tolerant_reading_normalises_to_schema_valid_envelopes():
    body = {
        "id": "019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F",
        "type": "email.send",
        "queue": "default",
        "args": [],
        "priority": None,
        "retry": {"max_attempts": 2, "jitter": None},
    }
    job = Job.from_json(json.dumps(body), strict=False)
    validate_job(job.to_dict())
    assert job.to_dict()["specversion"] == "1.0"


def test_tolerant_reading_keeps_non_v7_ids_which_the_schema_refuses():
    job = Job.from_json(
        {"specversion": "1.0", "id": "550E8400-E29B-41D4-A716-446655440000", "type": "a", "queue": "q", "args": []},
        strict=False,
    )
    assert job.id == "550e8400-e29b-41d4-a716-446655440000"
    assert schema_errors(job.to_dict())


def test_known_schema_bug_unique_without_keys():
    # unique-policy.schema.json: the `if` (keys contains "meta") is vacuously true when
    # `keys` is absent, so the schema demands meta_keys.  We follow the spec's intent.
    data = {**load(VALID[0]), "unique": {"on_conflict": "reject"}}
    assert [e.message for e in schema_errors(data)] == ["'meta_keys' is a required property"]
    assert Job.from_json(data).to_dict() == data


def test_backoff_strategy_extension_is_outside_the_schema():
    # retry-policy.schema.json has additionalProperties:false and no backoff_strategy,
    # so only envelopes that use the extension fail the schema.
    job = Job.create("a.b", retry={"backoff_strategy": "linear"})
    assert schema_errors(job.to_dict())
    assert Job.from_json(job.to_json()).retry.backoff_strategy == "linear"
