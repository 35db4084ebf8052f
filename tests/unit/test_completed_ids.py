"""CompletedIds (execution de-duplication's memory, DESIGN §19) and the completion records' wire format."""

from __future__ import annotations

import json

import pytest

from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.ids import new_job_id
from ojs_kombu.runtime.completed import CompletedIds, id_key
from ojs_kombu.wire.completed import (
    COMPLETED_TYPE,
    CompletedOptions,
    completed_marker,
    completed_record,
    decode_completed,
    max_age_seconds,
)


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_an_added_id_is_known_in_any_case_and_others_are_not():
    ids = CompletedIds(3600, 10)
    job_id = new_job_id()
    assert ids.add(job_id)
    assert job_id in ids
    assert job_id.upper() in ids
    assert new_job_id() not in ids
    assert not ids.add(job_id)  # known already
    assert len(ids) == 1


def test_uuid_ids_are_kept_as_integers_and_other_ids_as_lowercase_strings():
    assert id_key("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f") == 0x019461A81A2B7C3D8E4F5A6B7C8D9E0F
    assert id_key("Celery-Task-1") == "celery-task-1"
    ids = CompletedIds(3600, 10)
    ids.add("Celery-Task-1")
    assert "celery-task-1" in ids
    assert 42 not in ids


def test_ids_older_than_max_age_are_forgotten():
    clock = Clock()
    ids = CompletedIds(640, 100, clock=clock)
    old, new = new_job_id(), new_job_id()
    ids.add(old)
    clock.now += 320
    ids.add(new)
    clock.now += 330  # old is 650 s old (> 640 + one 10 s bucket), new 330 s
    assert ids.expire() == 1
    assert old not in ids and new in ids
    assert ids.add_many([new_job_id()], clock.now - 700) == 0  # completed too long ago: not kept


def test_past_max_ids_the_oldest_go_first():
    clock = Clock()
    ids = CompletedIds(6400, 3, clock=clock)
    first = [new_job_id(), new_job_id()]
    ids.add_many(first, clock.now - 500)
    later = [new_job_id(), new_job_id()]
    ids.add_many(later, clock.now)
    assert len(ids) <= 3
    assert all(i in ids for i in later)
    assert not any(i in ids for i in first)


def test_bounds_must_be_positive():
    with pytest.raises(ValidationError):
        CompletedIds(0, 10)
    with pytest.raises(ValidationError):
        CompletedIds(10, 0)


def test_options_arguments_and_max_age():
    options = CompletedOptions(max_age="2h", max_length_bytes=1000, max_segment_size_bytes=100)
    assert options.arguments() == {
        "x-queue-type": "stream",
        "x-max-age": "2h",
        "x-max-length-bytes": 1000,
        "x-stream-max-segment-size-bytes": 100,
    }
    assert options.max_age_seconds == 7200
    assert max_age_seconds("7D") == 7 * 86400
    for bad in ("7d", "0D", "7", 7):
        with pytest.raises(ValidationError):
            max_age_seconds(bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        CompletedOptions(max_ids=0)


def test_records_round_trip_and_markers_are_told_apart():
    ids = [new_job_id(), new_job_id()]
    message = completed_record(ids, at=1234.5)
    assert message.properties["type"] == COMPLETED_TYPE
    assert message.properties["delivery_mode"] == 2
    assert json.loads(message.body) == {"at": 1234.5, "ids": ids}
    record = decode_completed(message.body, message.properties)
    assert record is not None and list(record.ids) == ids and record.at == 1234.5 and record.marker is None
    marker = completed_marker()
    decoded = decode_completed(marker.body, marker.properties)
    assert decoded is not None and decoded.marker == marker.properties["message_id"]
    assert decode_completed(b"{}", {"type": "something.else"}) is None


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"ids": "x", "at": 1}', b'{"ids": [], "at": true}'])
def test_unreadable_records_raise_decode_error(body):
    with pytest.raises(DecodeError):
        decode_completed(body, {"type": COMPLETED_TYPE})
