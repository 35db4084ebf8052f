"""encode_properties' per-batch templates (everything but the message id kept) give py-amqp's bytes."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest
from amqp.basic_message import Message

from ojs_kombu import Job
from ojs_kombu.amqp.properties import encode_properties
from ojs_kombu.wire.codec import encode


def py_amqp(properties: dict[str, Any], headers: dict[str, Any] | None) -> bytes:
    if headers is not None:
        properties = {**properties, "application_headers": headers}
    if isinstance(properties.get("timestamp"), datetime):  # py-amqp takes epoch seconds only
        properties = {**properties, "timestamp": int(properties["timestamp"].timestamp())}
    return Message(b"", **properties)._serialize_properties()  # type: ignore[no-any-return]


BASE = {"message_id": "m", "type": "a.b", "content_type": "application/json", "delivery_mode": 2, "app_id": "ojs"}

# Properties and tables that a key of equal values would confuse: True == 1 == 1.0, an empty table
# against none, a datetime against its epoch seconds, a property set against one left out.
PROPERTY_VARIANTS: list[dict[str, Any]] = [
    BASE,
    {**BASE, "priority": 0},
    {**BASE, "priority": None},
    {**BASE, "timestamp": 1_767_225_600},
    {**BASE, "timestamp": datetime(2026, 1, 1, tzinfo=UTC)},
    {**BASE, "expiration": "100", "correlation_id": "c", "reply_to": "r"},
]
HEADER_VARIANTS: list[dict[str, Any] | None] = [
    None,
    {},
    {"k": 1},
    {"k": True},
    {"k": 1.0},  # not a plain value: encoded every time
    {"k": "1"},
    {"k": 1, "j": "x"},
    {"j": "x", "k": 1},
    {"k": {"nested": [1, "x"]}},  # py-amqp's encoder
    {"k": 2**40, "s": "日本語"},
]


def test_every_mix_of_properties_and_headers_matches_py_amqp_in_any_order() -> None:
    cases = list(itertools.product(PROPERTY_VARIANTS, HEADER_VARIANTS))
    for round_ in range(3):  # later rounds read the templates the first one made
        for n, (properties, headers) in enumerate(cases if round_ != 1 else reversed(cases)):
            properties = {**properties, "message_id": f"id-{round_}-{n}"}
            expected = py_amqp(properties, headers)
            assert encode_properties(properties, headers) == expected, (properties, headers)
            if headers is not None:  # the table inside the properties, as WireMessage passes it
                assert encode_properties({**properties, "application_headers": headers}) == expected


def test_jobs_of_a_batch_share_a_template_but_not_their_ids() -> None:
    jobs = [Job.create("a.b", [i], queue="q", priority=i % 3, tags=["t"] if i % 2 else None) for i in range(200)]
    for job in jobs:
        message = encode(job)
        assert encode_properties(message.properties, message.headers) == py_amqp(message.properties, message.headers)


def test_properties_without_a_message_id_unhashable_or_with_an_id_too_long() -> None:
    properties = {k: v for k, v in BASE.items() if k != "message_id"}
    assert encode_properties(properties, {"k": 1}) == py_amqp(properties, {"k": 1})
    # a table both in the properties and given apart (the one given wins): an unhashable key
    both = {**BASE, "application_headers": {"ignored": 1}}
    assert encode_properties(both, {"k": 1}) == py_amqp(BASE, {"k": 1})
    with pytest.raises(ValueError):
        encode_properties({**BASE, "message_id": "x" * 256}, {"k": 1})


def test_templates_start_over_when_full_and_stay_exact() -> None:
    for i in range(10_000):  # more distinct tables than the memo holds
        properties = {**BASE, "message_id": f"id-{i}"}
        headers = {"x-ojs-created-at": f"2026-01-01T00:00:{i % 60:02d}.{i:03d}Z", "n": i % 5}
        assert encode_properties(properties, headers) == py_amqp(properties, headers)
