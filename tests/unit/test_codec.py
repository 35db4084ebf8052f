"""Job <-> AMQP message (DESIGN §2): strict on the way out, tolerant on the way in."""

import json

import pytest

from ojs_kombu import DecodeError, Job, RetryPolicy
from ojs_kombu.wire.codec import CONTENT_TYPE, amqp_priority, decode, encode
from ojs_kombu.wire.headers import Header
from tools.schema import validate_job


def test_encode_sets_every_property_and_header():
    job = Job.create(
        "email.send",
        ["a"],
        queue="email",
        priority=12,
        tags=["x"],
        retry=RetryPolicy(max_attempts=5),
        meta={"traceparent": "00-aa-bb-01", "tracestate": "k=v"},
    )
    message = encode(job)
    assert message.properties == {
        "message_id": job.id,
        "type": "email.send",
        "content_type": CONTENT_TYPE,
        "content_encoding": "utf-8",
        "delivery_mode": 2,
        "app_id": "ojs",
        "timestamp": int(job.created_datetime.timestamp()),
        "priority": 9,
    }
    assert message.headers == {
        Header.QUEUE: "email",
        Header.ATTEMPT: 1,
        Header.MAX_ATTEMPTS: 5,
        Header.CREATED_AT: job.created_at,
        Header.ENQUEUED_AT: job.enqueued_at,
        Header.TAGS: "x",
        Header.TRACE_ID: "00-aa-bb-01",
        Header.TRACE_STATE: "k=v",
    }
    validate_job(json.loads(message.body))


def test_priority_is_clamped_to_amqp_range():
    assert [amqp_priority(p) for p in (None, -10, 0, 5, 9, 10, 255)] == [None, 0, 0, 5, 9, 9, 9]


def test_round_trip():
    job = Job.create("a.b", [1, {"x": None}], kwargs={"k": [1]})
    message = encode(job)
    assert decode(message.body, message.properties, message.headers) == job


def test_header_attempt_wins_over_body():
    job = Job.create("a.b", [])
    message = encode(job)
    decoded = decode(message.body, message.properties, {**message.headers, Header.ATTEMPT: 3})
    assert decoded.attempt == 2  # two executions before this delivery


def test_foreign_producer_seed_15_1():
    """Seed 001 §15.1: no specversion, +00:00 timestamp, max attempts only in a header."""
    body = json.dumps(
        {
            "id": "019414d4-8b2e-7c3a-b5d1-f0e2a3b4c5d6",
            "type": "email.send",
            "queue": "email",
            "args": ["user@example.com", "welcome"],
            "created_at": "2026-02-15T10:30:00.123456+00:00",
        }
    )
    job = decode(
        body.encode(),
        {"content_type": CONTENT_TYPE, "message_id": "019414d4-8b2e-7c3a-b5d1-f0e2a3b4c5d6"},
        {"x-ojs-queue": "email", "x-ojs-attempt": 1, "x-ojs-max-attempts": 5},
    )
    assert job.specversion == "1.0" and job.retry.max_attempts == 5 and job.attempt == 0


def test_missing_fields_come_from_properties():
    body = json.dumps({"args": []}).encode()
    job = decode(
        body,
        {"message_id": "019414D4-8B2E-7C3A-B5D1-F0E2A3B4C5D6", "type": "a.b", "timestamp": 1_700_000_000},
        {"x-ojs-queue": "q"},
    )
    assert (job.id, job.type, job.queue) == ("019414d4-8b2e-7c3a-b5d1-f0e2a3b4c5d6", "a.b", "q")
    assert job.created_at.startswith("2023-11-14T22:13:20")


@pytest.mark.parametrize(
    "body,properties,headers,code",
    [
        (b"not json", {}, {}, "decode_error"),
        (b"\xff\xfe", {}, {}, "decode_error"),
        (b"[1]", {}, {}, "invalid_envelope"),
        (
            b'{"type": "a.b", "queue": "q", "args": [NaN], "id": "019414d4-8b2e-7c3a-b5d1-f0e2a3b4c5d6"}',
            {},
            {},
            "decode_error",
        ),
        (b"{}", {"content_type": "application/x-python-serialize"}, {}, "unsupported_content_type"),
        (b"{}", {"content_encoding": "latin-1"}, {}, "unsupported_content_encoding"),
        (b"x" * (1024 * 1024 + 1), {}, {}, "envelope_too_large"),
        (
            b'{"type": "a.b", "queue": "q", "args": "x", "id": "019414d4-8b2e-7c3a-b5d1-f0e2a3b4c5d6"}',
            {},
            {},
            "invalid_envelope",
        ),
        (
            b'{"type": "a.b", "queue": "q", "args": [], "id": "019414d4-8b2e-7c3a-b5d1-f0e2a3b4c5d6"}',
            {},
            {"x-ojs-attempt": "three"},
            "invalid_header",
        ),
        (b'{"type": "a.b", "queue": "q", "args": [], "id": "not-a-uuid"}', {}, {}, "invalid_envelope"),
    ],
)
def test_bad_messages_raise_decode_error_with_a_code(body, properties, headers, code):
    with pytest.raises(DecodeError) as info:
        decode(body, properties, headers)
    assert info.value.code == code


def test_decode_is_as_tolerant_as_from_json_of_a_byte_order_mark():
    body = "\ufeff" + Job.create("a.b", [1]).to_json()
    assert decode(body.encode("utf-8")).args == [1]
    assert Job.from_json(body.encode("utf-8"), strict=False).args == [1]


@pytest.mark.parametrize(
    "body,message",
    [
        (b"{this is not json", "body is not JSON: "),
        (b'{"args": [NaN]}', "body is not JSON: NaN is not a JSON value"),
        (b'{"args": ["\xff"]}', "body is not valid UTF-8: "),
        (b"[" * 100_000 + b"]" * 100_000, "body is not usable JSON: nested too deeply"),
        (b"[1]", "body must be a JSON object, got a JSON list"),
        (b" " * (1024 * 1024 + 1), "body is 1048577 bytes, over the 1048576-byte limit"),
    ],
)
def test_decode_errors_say_what_is_wrong_with_the_body(body, message):
    # The message becomes x-ojs-error-message of the dead letter.
    with pytest.raises(DecodeError) as info:
        decode(body)
    assert str(info.value).startswith(message)
