"""A job delivery reaches Celery as a kombu message with its payload already decoded (no broker).

The payload the codec hands over must be what kombu's JSON decoding of the body gives,
for every valid OJS fixture and for the values kombu's decoder treats specially.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from kombu.exceptions import ContentDisallowed
from kombu.serialization import loads as kombu_loads
from kombu.serialization import prepare_accept_content

from ojs_celery.protocol import CeleryCodec
from ojs_kombu import decode
from ojs_kombu.testing.schema import fixtures_dir
from ojs_kombu.transport.message import DecodedMessage

VALID = sorted((fixtures_dir() / "valid").glob("*.json"))
JSON_ONLY = prepare_accept_content(["json"])
DELIVERY_INFO = {"delivery_tag": 7, "redelivered": False, "exchange": "", "routing_key": "reports"}


class Tasks:
    """A stand-in task index."""

    def name_for(self, job_type):
        return job_type

    def max_attempts(self, name):
        return None


def job_of(envelope: dict):
    return decode(json.dumps(envelope).encode(), {"content_type": "application/openjobspec+json"}, {})


def received(task, accept=JSON_ONLY) -> DecodedMessage:
    """The message as kombu's consumer hands it to Celery (``accept`` is set by the consumer)."""
    message = DecodedMessage(None, task, dict(DELIVERY_INFO))
    message.accept = accept
    return message


def kombu_decoded(task):
    return kombu_loads(task.body, task.properties["content_type"], task.properties["content_encoding"])


@pytest.mark.parametrize("path", VALID, ids=lambda p: Path(p).stem)
def test_the_payload_is_what_kombu_decodes_the_body_to(path):
    task = CeleryCodec(Tasks()).task_message(job_of(json.loads(path.read_text(encoding="utf-8"))), {}, {})
    assert task.payload is not None
    message = received(task)
    assert message.payload == kombu_decoded(task)
    assert message.payload is task.payload  # not parsed again
    assert message.headers is task.headers and message.properties["application_headers"] is task.headers
    assert message.delivery_tag == 7 and message.content_type == "application/json"


def test_values_json_reads_back_exactly_are_handed_over_as_they_are():
    envelope = {
        "specversion": "1.0",
        "id": "01946a8e-1a2b-7c3d-8e4f-5a6b7c8d9e0f",
        "type": "reports.build_pdf",
        "queue": "reports",
        "args": [2**70, "é\u2028", 1.5, None, True, {"nested": [1, {"a": []}]}, "type"],
        "meta": {"kwargs": {"n": -(2**65), "__value__": 1}},
        "attempt": 0,
    }
    task = CeleryCodec(Tasks()).task_message(job_of(envelope), {}, {})
    assert received(task).payload == kombu_decoded(task) == task.payload


def test_a_kombu_typed_object_is_left_to_kombu():
    # kombu's JSON decoder turns {"__type__": ..., "__value__": ...} into a Python value (a
    # Celery producer's datetime argument): the body is decoded by kombu, as stock Celery does.
    envelope = {
        "specversion": "1.0",
        "id": "01946a8e-1a2b-7c3d-8e4f-5a6b7c8d9e0f",
        "type": "reports.build_pdf",
        "queue": "reports",
        "args": [{"__type__": "datetime", "__value__": "2026-01-02T03:04:05"}],
        "attempt": 0,
    }
    task = CeleryCodec(Tasks()).task_message(job_of(envelope), {}, {})
    assert task.payload is None
    args, _, _ = received(task).payload
    assert args == [datetime(2026, 1, 2, 3, 4, 5)]


def test_a_consumer_that_does_not_accept_json_still_refuses_the_message():
    envelope = {"specversion": "1.0", "id": "01946a8e-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "type": "a.b", "queue": "q"}
    task = CeleryCodec(Tasks()).task_message(job_of({**envelope, "args": []}), {}, {})
    with pytest.raises(ContentDisallowed):
        received(task, accept=prepare_accept_content(["msgpack"])).decode()
