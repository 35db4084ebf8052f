"""Message <-> job mapping of ojs_dramatiq (no broker)."""

from __future__ import annotations

import uuid

import dramatiq
import pytest
from dramatiq.message import Message

from ojs_dramatiq import OjsEncoder, job_id_for, job_to_message, message_to_job, ojs_queue_for, retry_policy_for
from ojs_kombu import Job, ValidationError
from tools.schema import validate_job


def message(**fields) -> Message:
    defaults = dict(queue_name="default", actor_name="add", args=(1, 2), kwargs={}, options={})
    return Message(**{**defaults, **fields})


def test_the_job_id_is_a_uuid7_derived_deterministically_from_the_message():
    m = message()
    job_id = job_id_for(m.message_id, m.message_timestamp)
    assert uuid.UUID(job_id).version == 7 and job_id == job_id.lower()
    assert job_id == job_id_for(m.message_id, m.message_timestamp)
    assert job_id != job_id_for(str(uuid.uuid4()), m.message_timestamp)
    assert int(job_id.replace("-", "")[:12], 16) == m.message_timestamp  # sorts by creation time
    assert job_id_for(job_id, 0) == job_id  # a UUIDv7 message id is the job id
    assert uuid.UUID(job_id_for("custom-id", 1)).version == 7


def test_a_message_round_trips_through_its_envelope():
    m = message(
        actor_name="LegacyActor",
        queue_name="high_priority",
        args=(1, [2, {"a": None}]),
        kwargs={"k": "v"},
        options={"broker_priority": 5, "pipe_ignore": True, "eta": 1, "retries": 3},
    )
    job = message_to_job(m, retry=retry_policy_for(4, 100, 5000))
    validate_job(job.to_dict())
    assert job.type == "legacy_actor" and job.queue == "high-priority" and job.priority == 5
    assert job.meta["kwargs"] == {"k": "v"}
    assert job.meta["dramatiq"]["options"] == {"broker_priority": 5, "pipe_ignore": True}
    assert job.retry.max_attempts == 5
    back = job_to_message(Job.from_json(job.to_json(), strict=False), "high_priority")
    assert back == message(
        actor_name="LegacyActor",
        queue_name="high_priority",
        args=(1, [2, {"a": None}]),
        kwargs={"k": "v"},
        options={"broker_priority": 5, "pipe_ignore": True},
        message_id=m.message_id,
        message_timestamp=m.message_timestamp,
    )


def test_the_attempt_becomes_the_retries_option():
    job = message_to_job(message()).model_copy(update={"attempt": 2})
    assert job_to_message(job, "default").options == {"retries": 2}


def test_a_foreign_job_reaches_the_actor_its_type_maps_to():
    job = Job.create("build_report", [1], queue="reports", kwargs={"fmt": "a4"})
    m = job_to_message(job, "reports", {"build_report": "BuildReport"})
    assert (m.actor_name, m.args, m.kwargs, m.message_id) == ("BuildReport", (1,), {"fmt": "a4"}, job.id)


def test_values_json_cannot_carry_are_refused():
    with pytest.raises(ValidationError):
        message_to_job(message(args=(b"bytes",)))
    with pytest.raises(ValidationError):
        message_to_job(message(options={"when": object()}))


@pytest.mark.parametrize(
    "name, expected",
    [("default", "default"), ("high_priority", "high-priority"), ("Emails", "emails"), ("a.b-c", "a.b-c")],
)
def test_queue_names(name, expected):
    assert ojs_queue_for(name) == expected


@pytest.mark.parametrize("name", ["dlx.email", "retry.x", "___"])
def test_unusable_queue_names_are_refused(name):
    with pytest.raises(ValidationError):
        ojs_queue_for(name)


def test_unbounded_retries_and_delays():
    assert retry_policy_for(None, 15000, 604800000).max_attempts == 2**31 - 1
    job = message_to_job(message(), delay_ms=1500)
    assert job.scheduled_datetime > job.created_datetime


def test_the_encoder_speaks_envelopes():
    m = message(kwargs={"x": 1})
    encoder = OjsEncoder()
    data = encoder.encode(m.asdict())
    validate_job(Job.from_json(data).to_dict())
    assert Message(**encoder.decode(data)) == m


def test_the_broker_refuses_invalid_queue_names_when_actors_are_declared():
    from ojs_dramatiq import OjsBroker

    broker = OjsBroker("amqp://guest:guest@127.0.0.1:1//")  # never connects: declaring is lazy
    with pytest.raises(ValueError):
        dramatiq.actor(lambda: None, actor_name="x", queue_name="dlx.things", broker=broker)
    assert broker.get_declared_delay_queues() == set()
    broker.close()
