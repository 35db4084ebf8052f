"""Validate envelopes against the official OJS JSON Schemas (the test suite's helper).

The schemas live in ``../shared/ojs-json-schema/schemas/v1`` next to the
repository (override with ``$OJS_SCHEMA_DIR``).  Every schema is registered by
its ``$id``, so the ``$ref``s of ``job.schema.json`` to the retry, unique and
error schemas resolve, and ``date-time`` formats are checked (which needs
``rfc3339-validator``).  A missing schema directory is an error, not a skip.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker  # type: ignore[import-untyped]
from jsonschema.exceptions import ValidationError as SchemaValidationError  # type: ignore[import-untyped]
from jsonschema.exceptions import best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

JOB_SCHEMA_ID = "https://openjobspec.org/schemas/v1/job.json"
"""``$id`` of the job envelope schema."""

_REPO_ROOT = Path(__file__).resolve().parents[1]


def schema_dir() -> Path:
    """The directory of the v1 schemas: ``$OJS_SCHEMA_DIR`` or ``<repo>/../shared/ojs-json-schema/schemas/v1``.

    Raises FileNotFoundError when it does not exist: the suite must always have it.
    """
    configured = os.environ.get("OJS_SCHEMA_DIR")
    path = Path(configured) if configured else _REPO_ROOT.parent / "shared" / "ojs-json-schema" / "schemas" / "v1"
    if not path.is_dir():
        raise FileNotFoundError(
            f"OJS JSON schemas not found at {path}; check out ../shared next to the repository "
            "or point $OJS_SCHEMA_DIR at ojs-json-schema/schemas/v1"
        )
    return path


def fixtures_dir() -> Path:
    """The ``tests`` directory of the ojs-json-schema checkout (``valid/`` and ``invalid/`` fixtures)."""
    return schema_dir().parent.parent / "tests"


@cache
def registry() -> Registry:
    """A ``referencing.Registry`` holding every schema under :func:`schema_dir` by its ``$id``."""
    reg: Registry = Registry()
    for path in sorted(schema_dir().rglob("*.schema.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        resource = Resource.from_contents(contents, default_specification=DRAFT202012)
        reg = reg.with_resource(contents["$id"], resource)
    return reg.crawl()


@cache
def job_validator() -> Draft202012Validator:
    """A cached draft 2020-12 validator of ``job.schema.json``, with format checking."""
    checker = FormatChecker()
    if "date-time" not in checker.checkers:
        raise RuntimeError("date-time formats would go unchecked: install rfc3339-validator")
    schema = registry().contents(JOB_SCHEMA_ID)
    return Draft202012Validator(schema, registry=registry(), format_checker=checker)


def schema_errors(envelope: dict[str, Any]) -> list[SchemaValidationError]:
    """Every schema violation of ``envelope`` (empty when it is valid)."""
    return list(job_validator().iter_errors(envelope))


def validate_job(envelope: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` (the most relevant one, all listed) unless ``envelope`` is valid."""
    errors = schema_errors(envelope)
    if errors:
        error = best_match(errors)
        if len(errors) > 1:
            others = "; ".join(f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors)
            error.message = f"{error.message} (all {len(errors)} problems: {others})"
        raise error


__all__ = ["JOB_SCHEMA_ID", "fixtures_dir", "job_validator", "registry", "schema_dir", "schema_errors", "validate_job"]
