"""Cron tick ids, the cron stream's records and their fold, cron events (DESIGN §20, ojs-cron.md §8–9): pure logic."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.cron import CronJob, tick_job_id
from ojs_kombu.model.ids import JOB_ID_RE
from ojs_kombu.model.naming import Names
from ojs_kombu.policy.cron import first_due
from ojs_kombu.runtime.cron import CronScheduler, CronStreamReader, RegisteredCron, next_run_of, registered
from ojs_kombu.wire.cron import (
    CRON_SNAPSHOT_INTERVAL,
    CronBook,
    CronDefinition,
    CronFired,
    CronLeader,
    CronRemoval,
    CronSnapshot,
    cron_marker_message,
    cron_stream_arguments,
    decode_cron_record,
    definition_message,
    fired_message,
    leader_message,
    removal_message,
    snapshot_message,
)
from ojs_kombu.wire.events import CronEvent, cron_event_message, decode_cron_event, decode_event

T0 = datetime(2026, 2, 12, 14, 0, tzinfo=UTC)


def job(name: str = "daily-report", **changes) -> CronJob:
    return CronJob(name=name, cron=changes.pop("cron", "0 9 * * *"), type="report.generate", **changes)


# -- tick ids ---------------------------------------------------------------------------------------------


def test_tick_ids_are_uuidv7_derived_from_the_name_and_the_scheduled_time():
    first = tick_job_id("daily-report", T0)
    assert JOB_ID_RE.fullmatch(first)
    assert tick_job_id("daily-report", T0) == first  # every scheduler derives the same id
    assert tick_job_id("daily-report", T0.astimezone(datetime.now().astimezone().tzinfo)) == first  # an instant
    assert tick_job_id("other", T0) != first
    assert tick_job_id("daily-report", T0 + timedelta(milliseconds=1)) != first
    # The UUIDv7 timestamp is the scheduled time: ids of a cron job sort by their occurrence.
    assert int(first.replace("-", "")[:12], 16) == int(T0.timestamp() * 1000)
    later = tick_job_id("daily-report", T0 + timedelta(days=1))
    assert later > first


def test_tick_ids_refuse_naive_and_pre_epoch_times():
    with pytest.raises(ValidationError):
        tick_job_id("x", datetime(2026, 1, 1))
    with pytest.raises(ValidationError):
        tick_job_id("x", datetime(1969, 12, 31, tzinfo=UTC))


# -- records ----------------------------------------------------------------------------------------------


def roundtrip(message):
    return decode_cron_record(message.body, message.properties)


def test_records_round_trip_through_their_messages():
    cron = job(timezone="America/New_York", args=[1], options={"queue": "reports"})
    definition = roundtrip(definition_message(cron, registered_at=T0))
    assert definition == CronDefinition(cron, T0)
    assert definition_message(cron).properties["delivery_mode"] == 2
    removal = roundtrip(removal_message("daily-report"))
    assert isinstance(removal, CronRemoval) and removal.name == "daily-report"
    fired = roundtrip(fired_message("daily-report", T0, "0195-id"))
    assert isinstance(fired, CronFired) and (fired.scheduled_time, fired.job_id, fired.skipped) == (T0, "0195-id", None)
    skipped = roundtrip(fired_message("daily-report", T0, None, skipped="overlap_skip"))
    assert isinstance(skipped, CronFired) and skipped.job_id is None and skipped.skipped == "overlap_skip"
    leader = CronLeader("host.1.abc", "host", 1, T0)
    assert roundtrip(leader_message(leader)) == leader
    assert roundtrip(cron_marker_message()) is None
    assert decode_cron_record(b"{}", {"type": "ojs.cron.newer"}) is None
    assert cron_stream_arguments()["x-queue-type"] == "stream"
    assert cron_stream_arguments()["x-max-age"] == "1D"  # bounded: snapshots keep the definitions


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("ojs.cron.definition", b"not json"),
        ("ojs.cron.definition", b"[]"),
        ("ojs.cron.definition", b'{"cron_job": {"name": "BAD", "cron": "* * * * *", "type": "a"}, "registered_at": "2026-01-01T00:00:00Z"}'),
        ("ojs.cron.definition", b'{"cron_job": {"name": "ok", "cron": "61 * * * *", "type": "a"}, "registered_at": "2026-01-01T00:00:00Z"}'),
        ("ojs.cron.removed", b'{"removed_at": "2026-01-01T00:00:00Z"}'),
        ("ojs.cron.fired", b'{"name": "a", "scheduled_time": "yesterday", "at": "2026-01-01T00:00:00Z"}'),
        ("ojs.cron.leader", b'{"scheduler_id": "s", "host": "h", "pid": "1", "elected_at": "2026-01-01T00:00:00Z"}'),
        ("ojs.cron.snapshot", b'{"entries": {}, "through": 1, "at": "2026-01-01T00:00:00Z"}'),
        ("ojs.cron.snapshot", b'{"entries": [1], "through": 1, "at": "2026-01-01T00:00:00Z"}'),
        ("ojs.cron.snapshot", b'{"entries": [], "through": -1, "at": "2026-01-01T00:00:00Z"}'),
        ("ojs.cron.snapshot", b'{"entries": [], "leader": [], "through": 1, "at": "2026-01-01T00:00:00Z"}'),
    ],
)  # fmt: skip
def test_unreadable_records_raise_decode_errors(kind, body):
    with pytest.raises(DecodeError):
        decode_cron_record(body, {"type": kind})


def test_the_book_keeps_the_latest_definition_per_name_and_folds_ticks():
    book = CronBook()
    book.apply(CronDefinition(job(), T0))
    book.apply(CronDefinition(job("other"), T0))
    book.apply(CronFired("daily-report", T0 + timedelta(hours=1), "id-1", None, T0))
    book.apply(CronFired("daily-report", T0 + timedelta(hours=1), "id-1", None, T0))  # read twice: counted once
    book.apply(CronFired("daily-report", T0 + timedelta(minutes=30), "id-0", None, T0))  # older: ignored
    book.apply(CronFired("daily-report", T0 + timedelta(hours=2), None, "overlap_skip", T0))
    entry = book.entries["daily-report"]
    assert (entry.run_count, entry.last_job_id, entry.last_run_at) == (1, "id-1", T0 + timedelta(hours=2))
    replaced = job(cron="0 10 * * *")
    book.apply(CronDefinition(replaced, T0 + timedelta(days=1)))  # upsert keeps the runs
    entry = book.entries["daily-report"]
    assert entry.cron == replaced and entry.run_count == 1 and entry.created_at == T0
    book.apply(CronRemoval("daily-report", T0))
    assert list(book.entries) == ["other"]
    book.apply(CronFired("daily-report", T0 + timedelta(days=2), "id-9", None, T0))  # a tick of a removed job
    assert "daily-report" not in book.entries
    book.apply(CronDefinition(job(), T0 + timedelta(days=3)))  # registered again: a fresh start
    assert book.entries["daily-report"].run_count == 0
    assert book.entries["daily-report"].created_at == T0 + timedelta(days=3)
    book.apply(CronLeader("s", "h", 1, T0))
    assert book.leader is not None and book.leader.scheduler_id == "s"


def test_next_runs_follow_the_last_run_and_are_null_when_disabled():
    book = CronBook()
    book.apply(CronDefinition(job(timezone="America/New_York"), T0))
    entry = book.entries["daily-report"]
    assert next_run_of(entry) == datetime(2026, 2, 13, 14, tzinfo=UTC)  # 09:00 EST
    entry.last_run_at = datetime(2026, 2, 13, 14, tzinfo=UTC)
    assert next_run_of(entry) == datetime(2026, 2, 14, 14, tzinfo=UTC)
    book.apply(CronDefinition(job(timezone="America/New_York", enabled=False), T0))
    assert next_run_of(book.entries["daily-report"]) is None  # CRON-28
    shown = registered(book.entries["daily-report"])
    assert isinstance(shown, RegisteredCron) and isinstance(shown, CronJob)
    assert shown.to_dict()["next_run_at"] is None and shown.to_dict()["last_run_at"] == "2026-02-13T14:00:00.000Z"
    assert shown.definition == job(timezone="America/New_York", enabled=False)


def test_every_counts_from_the_registration_then_from_the_last_run():
    every = job(cron="@every 90s").expression
    assert first_due(every, UTC, T0, None) == T0 + timedelta(seconds=90)
    assert first_due(every, UTC, T0, T0 + timedelta(seconds=100)) == T0 + timedelta(seconds=190)


# -- evaluation timing --------------------------------------------------------------------------------------


def test_evaluations_are_planned_when_due_at_most_once_a_second_after_a_fire():
    plan = CronScheduler._next_evaluation
    assert plan(0.0, 100.0, 0.25) == pytest.approx(100.251)  # nothing fired: when due
    assert plan(101.0, 100.0, 0.25) == 101.0  # fired at a plan of 100.0: not before 101.0
    assert plan(101.0, 100.05, 0.95) == pytest.approx(101.001)  # lateness does not add up
    assert plan(0.0, 100.0, 3600.0) == 160.0  # at most 60 s


# -- events ---------------------------------------------------------------------------------------------------


def test_cron_events_have_the_spec_body_and_round_trip():
    triggered = CronEvent(
        "triggered", "daily-report", "0 9 * * *", "America/New_York", T0,
        job_id="019501a2-3b4c-7d5e-8f6a-1b2c3d4e5f6a", job_type="report.generate", run_count=43,
        actual_time=T0 + timedelta(milliseconds=123), timestamp=T0 + timedelta(milliseconds=123),
    )  # fmt: skip
    body = triggered.to_json()
    assert body == {
        "event": "cron.triggered",
        "timestamp": "2026-02-12T14:00:00.123Z",
        "data": {
            "cron_name": "daily-report",
            "cron_expression": "0 9 * * *",
            "timezone": "America/New_York",
            "job_id": "019501a2-3b4c-7d5e-8f6a-1b2c3d4e5f6a",
            "job_type": "report.generate",
            "run_count": 43,
            "scheduled_time": "2026-02-12T14:00:00.000Z",
            "actual_time": "2026-02-12T14:00:00.123Z",
        },
    }
    message = cron_event_message(triggered)
    assert message.properties["type"] == "ojs.event.cron.triggered"
    assert decode_cron_event(message.body, message.properties) == triggered
    assert decode_event(message.body, message.properties) is None  # job-event readers skip it
    skipped = CronEvent("skipped", "a", "@every 1s", "UTC", T0, reason="overlap_skip", active_job_id="x", timestamp=T0)
    assert skipped.to_json()["data"] == {
        "cron_name": "a",
        "cron_expression": "@every 1s",
        "timezone": "UTC",
        "reason": "overlap_skip",
        "active_job_id": "x",
        "scheduled_time": "2026-02-12T14:00:00.000Z",
    }
    message = cron_event_message(skipped)
    assert decode_cron_event(message.body, message.properties) == skipped
    assert decode_cron_event(b"{}", {"type": "ojs.event.worker"}) is None
    with pytest.raises(DecodeError):
        decode_cron_event(b"[]", {"type": "ojs.event.cron.triggered"})
    assert Names("t").cron_event_routing_key("triggered", "a") == "cron.triggered.a"
    assert Names("t").cron_stream == "t.ojs.stream.cron"


def test_a_snapshot_replaces_the_book_and_the_records_written_while_it_was_made_apply_again():
    writer = CronBook()  # what the leader folded up to offset 2
    writer.apply(CronDefinition(job("a", cron="@every 1s"), T0), 0)
    writer.apply(CronFired("a", T0 + timedelta(seconds=1), "id-1", None, T0), 1)
    writer.apply(CronLeader("s", "h", 1, T0), 2)
    snapshot = roundtrip(snapshot_message(writer, writer.offset))
    assert isinstance(snapshot, CronSnapshot) and snapshot.through == 2 and snapshot.leader == writer.leader
    assert [(e.cron, e.run_count, e.last_run_at) for e in snapshot.entries] == [
        (job("a", cron="@every 1s"), 1, T0 + timedelta(seconds=1))
    ]
    # A reader whose stream lost offsets 0-1 to retention: the snapshot (offset 5) comes after records 3-4,
    # written while it was made; they are kept, the tick at offset 1 is not counted twice.
    reader = CronBook()
    reader.apply(CronFired("a", T0 + timedelta(seconds=1), "id-1", None, T0), 1)
    reader.apply(CronDefinition(job("b"), T0), 3)
    reader.apply(CronFired("a", T0 + timedelta(seconds=2), "id-2", None, T0), 4)
    reader.apply(snapshot, 5)
    assert sorted(reader.entries) == ["a", "b"] and reader.leader == writer.leader
    a = reader.entries["a"]
    assert (a.run_count, a.last_job_id, a.last_run_at) == (2, "id-2", T0 + timedelta(seconds=2))
    assert a.created_at == T0 and reader.offset == 5
    reader.apply(CronRemoval("b", T0), 6)
    reader.apply(snapshot, 7)  # an older (or the same) snapshot changes nothing
    assert sorted(reader.entries) == ["a"]
    assert writer.entries["a"].run_count == 1  # the snapshot's entries were copied, not shared
    # The leader's own tick, folded before it is read back, survives a snapshot read meanwhile.
    reader.apply(CronFired("a", T0 + timedelta(seconds=3), "id-3", None, T0))
    reader.apply(roundtrip(snapshot_message(writer, 8)), 10)
    assert (reader.entries["a"].last_job_id, reader.entries["a"].run_count) == ("id-3", 2)
    big = {"entries": [], "through": 1, "at": "2026-01-01T00:00:00Z", "pad": "x" * 2_000_000}
    assert isinstance(decode_cron_record(json.dumps(big).encode(), {"type": "ojs.cron.snapshot"}), CronSnapshot)
    empty = roundtrip(snapshot_message(CronBook(), None))
    assert isinstance(empty, CronSnapshot) and (empty.entries, empty.leader, empty.through) == ((), None, None)


def test_a_reader_makes_a_snapshot_when_none_read_or_made_is_recent():
    reader = CronStreamReader(Names("t"))
    assert reader.snapshot_due(T0)  # none yet
    reader.book.apply(CronDefinition(job(), T0), 4)
    made = roundtrip(reader.snapshot())
    assert isinstance(made, CronSnapshot) and made.through == 4
    assert not reader.snapshot_due(made.at + timedelta(minutes=59))  # made here, not read back yet
    reader.book.apply(made, 5)
    assert reader.snapshot_due(made.at + CRON_SNAPSHOT_INTERVAL + timedelta(seconds=1))
