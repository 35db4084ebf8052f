"""Job.to_json_bytes (orjson, the publish path) emits the same JSON as Job.to_json (json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ojs_kombu.model.job import Job
from ojs_kombu.wire.codec import encode
from tools.schema import fixtures_dir, validate_job

VALID = sorted((fixtures_dir() / "valid").glob("*.json"))


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_fixtures_give_the_same_json(path: Path) -> None:
    job = Job.from_json(path.read_bytes(), strict=True)
    body = job.to_json_bytes()
    assert json.loads(body) == json.loads(job.to_json()) == json.loads(path.read_bytes())
    validate_job(json.loads(body))


@pytest.mark.parametrize(
    "args",
    [
        ["user@example.com", 1, -2, 2**53 - 1, True, None, 0.5],
        ["日本語 ✓ émoji 🎉", 'quote " backslash \\ slash / ctrl \x00\x1f\x7f tab\t nl\n', {"": [], "k": {}}],
        [[[[{"deep": [1, 2.25, -0.0]}]]]],
    ],
)
def test_created_jobs_give_the_same_bytes(args: list[object]) -> None:
    job = Job.create("a.b", args, meta={"traceparent": "00-ab-cd-01"}, tags=["t"], kwargs={"x": "y"})
    assert job.to_json_bytes() == job.to_json().encode("utf-8")
    assert encode(job).body == job.to_json().encode("utf-8")


def test_integers_beyond_64_bits_fall_back_to_json() -> None:
    envelope = f'{{"id":"019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f","type":"a.b","queue":"q","args":[{2**70}]}}'
    job = Job.from_json(envelope, strict=False)  # tolerant: large integers are kept
    assert job.to_json_bytes() == job.to_json().encode("utf-8")
    assert json.loads(job.to_json_bytes())["args"] == [2**70]
