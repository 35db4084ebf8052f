"""The parsed-timestamp memo (``timefmt._parsed``) answers exactly as a fresh parse does.

Every consumer parses each job's ``created_at`` and ``enqueued_at`` (the same text for a job of
``Job.create``) and the job metrics parse ``enqueued_at`` again: valid texts are remembered,
refused ones never are, so a second reading of anything gives what the first gave.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from ojs_kombu.errors import ValidationError
from ojs_kombu.model import timefmt
from ojs_kombu.model._problems import Problem, public_error
from ojs_kombu.model.timefmt import parse_timestamp
from tools.schema import fixtures_dir

ODD_TEXTS = [
    "2026-02-15T10:30:00Z",
    "2026-02-15T10:30:00.000Z",
    "2026-02-15t10:30:00.5z",
    "2026-02-15T11:30:00+01:00",
    "2026-02-15T10:30:00.123456789Z",
    "2026-02-15T10:30:00",
    "2026-02-15 10:30:00",
    "2026-02-30T00:00:00Z",
    "2026-13-01T00:00:00Z",
    "2026-02-15T10:30:00Z\n",
    "２０２６-02-15T10:30:00Z",
    "",
]


def fixture_timestamps() -> list[str]:
    """Every string under a timestamp key of the OJS fixtures (valid and invalid)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key.endswith("_at") and isinstance(item, str):
                    found.append(item)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for path in sorted(fixtures_dir().glob("*/*.json")):
        walk(json.loads(path.read_text(encoding="utf-8")))
    return found


def reading(text: str) -> datetime | str:
    """``parse_timestamp(text)``, or the error's message."""
    try:
        return parse_timestamp(text)
    except ValidationError as exc:
        return f"ValidationError: {exc}"


def fresh(text: str) -> datetime | str:
    """The same reading without the memo."""
    try:
        return timefmt._parse(text)
    except Problem as problem:
        return f"ValidationError: {public_error(problem, None)}"


@pytest.mark.parametrize("text", sorted(set(ODD_TEXTS + fixture_timestamps())))
def test_a_remembered_reading_is_the_fresh_one(text: str) -> None:
    first, second, expected = reading(text), reading(text), fresh(text)
    assert first == second == expected
    if isinstance(first, datetime) and isinstance(expected, datetime):
        assert first.utcoffset() == second.utcoffset() == expected.utcoffset()  # == compares instants only


def test_a_refused_text_is_never_remembered() -> None:
    timefmt._parsed.cache_clear()
    for _ in range(3):
        with pytest.raises(ValidationError, match="no timezone"):
            parse_timestamp("2026-02-15T10:30:00")
    assert timefmt._parsed.cache_info().currsize == 0


def test_a_valid_text_is_parsed_once() -> None:
    timefmt._parsed.cache_clear()
    first = parse_timestamp("2026-02-15T10:30:00.000Z")
    assert parse_timestamp("2026-02-15T10:30:00.000Z") is first  # immutable: shared
    info = timefmt._parsed.cache_info()
    assert (info.hits, info.misses) == (1, 1)


def test_a_str_subclass_is_read_without_the_memo() -> None:
    class Odd(str):
        def __eq__(self, other: object) -> bool:  # equal to anything: must never be a memo key
            return True

        __hash__ = str.__hash__

    timefmt._parsed.cache_clear()
    parse_timestamp("2026-02-15T10:30:00.000Z")
    assert parse_timestamp(Odd("2027-03-16T11:31:01.000Z")) == datetime.fromisoformat("2027-03-16T11:31:01.000+00:00")
    assert timefmt._parsed.cache_info().hits == 0
