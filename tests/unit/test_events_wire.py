"""The events stream's wire (presence, job events), its names and options, and the pure parts of the beacon."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import click
import pytest

from ojs_kombu import DecodeError, Job, Names, ValidationError
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.cli import since_arg
from ojs_kombu.runtime import lifecycle as lifecycle_module
from ojs_kombu.runtime.lifecycle import Lifecycle
from ojs_kombu.runtime.presence import Beacon, check_presence_interval
from ojs_kombu.wire.entities import BindingSpec, ExchangeSpec, QueueSpec
from ojs_kombu.wire.events import (
    ActiveJob,
    EventsOptions,
    JobEvent,
    JobEventRecord,
    WorkerPresence,
    decode_event,
    job_event_message,
    library_version,
    marker_message,
    presence_message,
)

T0 = datetime(2026, 11, 24, 10, 0, 0, 123000, tzinfo=UTC)


def presence(**changes) -> WorkerPresence:
    fields = {
        "worker_id": "host-1.4242.a1b2c3",
        "host": "host-1",
        "pid": 4242,
        "queues": ("email", "sms"),
        "concurrency": 10,
        "active": (ActiveJob("0190a7e2-0000-7000-8000-000000000001", "email", "email.send", 2, T0),),
        "started_at": T0,
        "sent_at": T0 + timedelta(seconds=5),
        "state": "online",
        "version": "0.1.0",
    }
    fields.update(changes)
    return WorkerPresence(**fields)


def event(**changes) -> JobEventRecord:
    fields = {
        "event": "failed",
        "job_id": "0190a7e2-0000-7000-8000-000000000002",
        "job_type": "email.send",
        "queue": "email",
        "attempt": 1,
        "worker_id": "host-1.4242.a1b2c3",
        "at": T0,
        "error": {"code": "handler_error", "type": "ValueError", "message": "boom"},
    }
    fields.update(changes)
    return JobEventRecord(**fields)


# -- names and options -----------------------------------------------------------------------------


def test_event_names_follow_design_14_and_take_the_prefix():
    assert Names().events_exchange == "ojs.exchange.events"
    assert Names().events_stream == "ojs.stream.events"
    assert Names("tenant1").events_exchange == "tenant1.ojs.exchange.events"
    assert Names("tenant1").events_stream == "tenant1.ojs.stream.events"
    assert Names.worker_routing_key("h.1.abc") == "worker.h.1.abc"
    assert Names.job_event_routing_key("dead-lettered", "a.b") == "job.dead-lettered.a.b"


def test_events_options_trim_by_age_size_and_small_segments():
    assert EventsOptions().arguments() == {
        "x-queue-type": "stream",
        "x-max-age": "1h",
        "x-max-length-bytes": 100_000_000,
        "x-stream-max-segment-size-bytes": 1_000_000,
    }
    assert EventsOptions(max_age="10m").arguments()["x-max-age"] == "10m"
    with pytest.raises(ValidationError):
        EventsOptions(max_age="1 hour")
    with pytest.raises(ValidationError):
        EventsOptions(max_length_bytes=0)


def test_topology_declares_a_topic_exchange_and_a_stream_bound_with_hash():
    names = Names("p")
    specs = Topology(names, events=EventsOptions(max_age="2h")).events_specs()
    assert specs[0] == ExchangeSpec("p.ojs.exchange.events", "topic")
    assert isinstance(specs[1], QueueSpec) and specs[1].name == "p.ojs.stream.events"
    assert specs[1].argument_dict["x-max-age"] == "2h"
    assert specs[1].argument_dict["x-queue-type"] == "stream"
    assert specs[2] == BindingSpec("p.ojs.stream.events", "p.ojs.exchange.events", "#")


# -- messages --------------------------------------------------------------------------------------


def test_presence_message_wire():
    message = presence_message(presence())
    assert message.properties["type"] == "ojs.event.worker"
    assert message.properties["content_type"] == "application/json"
    assert message.properties["timestamp"] == int((T0 + timedelta(seconds=5)).timestamp())
    assert message.properties["message_id"] != presence_message(presence()).properties["message_id"]
    assert json.loads(message.body) == {
        "worker_id": "host-1.4242.a1b2c3",
        "host": "host-1",
        "pid": 4242,
        "queues": ["email", "sms"],
        "concurrency": 10,
        "state": "online",
        "version": "0.1.0",
        "started_at": "2026-11-24T10:00:00.123Z",
        "sent_at": "2026-11-24T10:00:05.123Z",
        "active": [
            {
                "job_id": "0190a7e2-0000-7000-8000-000000000001",
                "queue": "email",
                "type": "email.send",
                "attempt": 2,
                "started_at": "2026-11-24T10:00:00.123Z",
            }
        ],
    }


def test_presence_and_job_events_round_trip():
    for original in (presence(), presence(state="offline", active=())):
        message = presence_message(original)
        assert decode_event(message.body, message.properties) == original
    for original in (event(), event(event="started", error=None)):
        message = job_event_message(original)
        assert message.properties["type"] == f"ojs.event.job.{original.event}"
        assert decode_event(message.body, message.properties) == original
    assert "error" not in json.loads(job_event_message(event(error=None)).body)


def test_decoders_ignore_unknown_fields_and_types():
    message = presence_message(presence())
    body = json.loads(message.body)
    body["gpu"] = "A100"
    body["active"][0]["node"] = 3
    assert decode_event(json.dumps(body).encode(), message.properties) == presence()
    assert decode_event(b'{"x": 1}', {"type": "ojs.event.queue.depth"}) is None
    marker = marker_message()
    assert decode_event(marker.body, marker.properties) is None


@pytest.mark.parametrize(
    ("body", "properties"),
    [
        (b"{}", {}),
        (b"not json", {"type": "ojs.event.worker"}),
        (b"\xff\xfe", {"type": "ojs.event.worker"}),
        (b"[1, 2]", {"type": "ojs.event.job.started"}),
        (b'{"host": "h"}', {"type": "ojs.event.worker"}),
        (b'{"event": "started"}', {"type": "ojs.event.job.started"}),
    ],
)
def test_garbage_is_a_decode_error(body, properties):
    with pytest.raises(DecodeError):
        decode_event(body, properties)


@pytest.mark.parametrize(
    ("field", "value"),
    [("pid", True), ("pid", "4242"), ("queues", "email"), ("queues", [1]), ("sent_at", "yesterday"),
     ("sent_at", "2026-11-24T10:00:00"), ("state", "sleeping"), ("active", [{"job_id": "x"}])],
)  # fmt: skip
def test_a_presence_with_a_bad_field_is_a_decode_error(field, value):
    body = json.loads(presence_message(presence()).body)
    body[field] = value
    with pytest.raises(DecodeError):
        decode_event(json.dumps(body).encode(), {"type": "ojs.event.worker"})


def test_library_version_is_the_distribution_version():
    import ojs_kombu

    assert library_version() == ojs_kombu.__version__


# -- the beacon's pure parts -----------------------------------------------------------------------


def test_a_lifecycle_event_is_what_a_reader_of_the_stream_decodes():
    """One definition of the fields (``wire.events.JobEvent``): the worker's event, published, reads
    back as the same record, with the job's enqueued_at (to the millisecond) on a started event."""
    job = Job.create("a.b", [], queue="q")
    emitted = Lifecycle("w1").emit("started", job, 1)
    assert emitted is None  # nobody subscribed: nothing built
    lifecycle = Lifecycle("w1")
    lifecycle.subscribe(lambda e: None)
    emitted = lifecycle.emit("started", job, 2)
    assert emitted is not None and emitted.enqueued_at is not None
    message = job_event_message(emitted)
    decoded = decode_event(message.body, message.properties)
    assert isinstance(decoded, JobEventRecord)
    assert abs(decoded.at - emitted.at) < timedelta(milliseconds=1)  # RFC 3339 with milliseconds
    assert decoded.enqueued_at is not None and abs(decoded.enqueued_at - emitted.enqueued_at) < timedelta(
        milliseconds=1
    )
    assert decoded.scheduled_at is None
    same = decoded._replace(at=emitted.at, enqueued_at=emitted.enqueued_at)
    assert same == JobEventRecord("started", job.id, "a.b", "q", 2, "w1", emitted.at, None, emitted.enqueued_at)
    assert same == emitted
    finished = lifecycle.emit("succeeded", job, 2)
    assert finished is not None
    message = job_event_message(finished)
    assert "enqueued_at" not in message.body.decode()  # only a started event carries it


def test_an_unreadable_enqueued_at_of_an_event_is_none_and_not_a_decode_error():
    body = b'{"event": "started", "job_id": "j", "type": "t", "queue": "q", "attempt": 1, "worker_id": "w",'
    body += b' "at": "2026-11-27T10:00:00.000Z", "enqueued_at": "yesterday", "scheduled_at": 5}'
    decoded = decode_event(body, {"type": "ojs.event.job.started"})
    assert isinstance(decoded, JobEventRecord) and (decoded.enqueued_at, decoded.scheduled_at) == (None, None)
    assert isinstance(decoded, JobEvent) and lifecycle_module.JobEvent is JobEvent


def test_a_full_event_queue_drops_counts_and_logs(caplog):
    beacon = Beacon(
        "amqp://guest:guest@127.0.0.1:1//",
        Names(),
        Topology(),
        worker_id="w1",
        queues=["q"],
        concurrency=1,
        active=list,
        max_pending=2,
    )  # never started: nothing drains its queue
    lifecycle = Lifecycle("w1")
    lifecycle.subscribe(beacon.offer)
    job = Job.create("a.b", [], queue="q")
    with caplog.at_level(logging.WARNING, logger="ojs_kombu.runtime.presence"):
        for _ in range(5):
            lifecycle.emit("started", job, 1)
    assert beacon.dropped == 3
    assert "1 job event(s) dropped" in caplog.text
    assert "guest:guest" not in caplog.text


def test_presence_survives_a_failing_provider(caplog):
    def broken() -> list[ActiveJob]:
        raise RuntimeError("bug")

    beacon = Beacon(
        "amqp://127.0.0.1:1//", Names(), Topology(), worker_id="w1", queues=["q"], concurrency=4, active=broken
    )
    with caplog.at_level(logging.ERROR):
        snapshot = beacon.presence()
    assert snapshot.active == () and snapshot.concurrency == 4 and snapshot.queues == ("q",)
    assert "active-jobs provider" in caplog.text


@pytest.mark.parametrize("value", [0, -1, True, "5"])
def test_bad_presence_intervals_are_refused(value):
    with pytest.raises(ValidationError):
        check_presence_interval(value)


def test_cli_since_takes_durations_and_timestamps():
    assert since_arg("90s") == timedelta(seconds=90)
    assert since_arg("10m") == timedelta(minutes=10)
    assert since_arg("1.5h") == timedelta(hours=1.5)
    assert since_arg("2d") == timedelta(days=2)
    assert since_arg("2026-11-24T10:00:00Z") == datetime(2026, 11, 24, 10, tzinfo=UTC)
    for bad in ("10 minutes", "2026-11-24T10:00:00", ""):
        with pytest.raises(click.BadParameter):
            since_arg(bad)
