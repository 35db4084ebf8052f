"""The publisher's own property/table encoder must produce exactly what py-amqp would."""

import pytest
from amqp.basic_message import Message

from ojs_kombu import Job
from ojs_kombu.amqp.properties import encode_properties, encode_table
from ojs_kombu.wire.codec import encode


def py_amqp(properties: dict) -> bytes:
    return Message(b"", **properties)._serialize_properties()


def test_job_properties_match_py_amqp_byte_for_byte():
    message = encode(Job.create("a.b", [1], priority=3, tags=["x", "y"], meta={"traceparent": "00-ab-cd-01"}))
    properties = {**message.properties, "application_headers": message.headers}
    assert encode_properties(properties) == py_amqp(properties)


@pytest.mark.parametrize(
    "headers",
    [
        {"s": "text", "u": "日本語", "i": 7, "neg": -3, "big": 2**40, "t": True, "f": False},
        {"nested": {"a": 1}, "list": [1, "x"], "float": 1.5},  # falls back to py-amqp's encoder
        {},
    ],
)
def test_tables_match_py_amqp(headers):
    properties = {
        "application_headers": headers,
        "correlation_id": "c",
        "reply_to": "r",
        "expiration": "100",
        "user_id": "guest",
        "timestamp": 1_767_225_600,
    }
    assert encode_properties(properties) == py_amqp(properties)


def test_round_trip_through_py_amqp_decoder():
    properties = {
        "content_type": "application/openjobspec+json",
        "delivery_mode": 2,
        "priority": 9,
        "message_id": "m",
        "timestamp": 1_700_000_000,
        "type": "a.b",
        "app_id": "ojs",
        "application_headers": {"x-ojs-attempt": 2, "x-ojs-queue": "email"},
    }
    raw = encode_properties(properties)
    decoded = Message()
    decoded._load_properties(60, raw, 0)
    assert decoded.properties["application_headers"] == {"x-ojs-attempt": 2, "x-ojs-queue": "email"}
    assert decoded.properties["priority"] == 9 and decoded.properties["message_id"] == "m"
    assert encode_table({})[:4] == b"\x00\x00\x00\x00"


def test_short_strings_longer_than_255_bytes_are_refused():
    with pytest.raises(ValueError):
        encode_properties({"message_id": "x" * 256})


def test_memoised_fields_keep_types_apart_and_survive_starting_over():
    # True == 1 and hash(True) == hash(1): a memo keyed by value alone would mix them up.
    for headers in ({"k": 1}, {"k": True}, {"k": 1}, {"k": "1"}, {"k": False}, {"k": 0}):
        assert encode_table(headers) == py_amqp_table(headers)
    for i in range(10_000):  # more distinct values than the memo holds: it starts over, still exact
        headers = {f"key-{i % 7}": f"value-{i}", "n": i, "long": "x" * (100 + i % 3)}
        assert encode_table(headers) == py_amqp_table(headers)


def py_amqp_table(headers: dict) -> bytes:
    return py_amqp({"application_headers": headers})[2:]  # after the property flags
