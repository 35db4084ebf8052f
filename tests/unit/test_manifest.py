"""The conformance manifest against the official ``manifest.schema.json``, with the two departures we decided.

docs/wire-format.md ("The conformance manifest") says why: ``protocols`` holds ``"amqp"`` and no ``"http"``
(this binding serves no HTTP), and ``capabilities.unique_jobs`` is ojs-unique-jobs.md §8.3's object, where
the schema types it as a boolean.  Every other rule of the schema holds.
"""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator, FormatChecker  # type: ignore[import-untyped]

from ojs_kombu import ValidationError, conformance_manifest
from ojs_kombu.runtime.manifest import RABBITMQ_LOCKS, REDIS_LOCKS
from tools.schema import registry

MANIFEST_SCHEMA_ID = "https://openjobspec.org/schemas/v1/manifest.json"

#: (path, validator keyword) of the schema violations we decided on; any other one fails the test.
DECIDED = {(("protocols",), "contains"), (("capabilities", "unique_jobs"), "type")}


@pytest.mark.parametrize(("backend", "mechanism"), [(None, RABBITMQ_LOCKS), ("rediss://:pw@r:6380/1", REDIS_LOCKS)])
def test_the_manifest_meets_the_schema_but_for_the_two_decided_departures(backend, mechanism):
    manifest = conformance_manifest(backend)
    validator = Draft202012Validator(
        registry().contents(MANIFEST_SCHEMA_ID), registry=registry(), format_checker=FormatChecker()
    )
    errors = {(tuple(e.absolute_path), e.validator) for e in validator.iter_errors(manifest)}
    assert errors == DECIDED
    assert manifest["protocols"] == ["amqp"] and manifest["backend"] == "rabbitmq"
    assert manifest["capabilities"]["unique_jobs"] == {"strength": "strong", "mechanism": mechanism}
    assert "pw" not in str(manifest)  # the backend URL is never in it
    assert set(manifest["capabilities"]) == set(validator.schema["properties"]["capabilities"]["properties"])


def test_a_backend_that_is_not_redis_is_refused():
    with pytest.raises(ValidationError, match="unique_backend") as caught:
        conformance_manifest("amqp://u:secret@h/")
    assert caught.value.field == "unique_backend" and "secret" not in str(caught.value)
