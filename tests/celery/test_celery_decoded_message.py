"""A job delivery reaches Celery as a kombu message with its payload already decoded (no broker).

The payload the codec hands over must be what kombu's JSON decoding of the body gives,
for every valid OJS fixture and for the values kombu's decoder treats specially.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from celery import Celery as StockCelery
from celery.app.trace import trace_task_ret
from kombu.exceptions import ContentDisallowed
from kombu.serialization import loads as kombu_loads
from kombu.serialization import prepare_accept_content

from ojs_celery.protocol import CeleryCodec
from ojs_celery.request import Request
from ojs_kombu import decode
from ojs_kombu.transport.message import DecodedMessage
from tools.schema import fixtures_dir

VALID = sorted((fixtures_dir() / "valid").glob("*.json"))
JSON_ONLY = prepare_accept_content(["json"])
#: An envelope whose argument kombu's JSON decoder turns into a datetime (a Celery producer's).
KOMBU_TYPED = {
    "specversion": "1.0",
    "id": "01946a8e-1a2b-7c3d-8e4f-5a6b7c8d9e0f",
    "type": "reports.build_pdf",
    "queue": "reports",
    "args": [{"__type__": "datetime", "__value__": "2026-01-02T03:04:05"}],
    "attempt": 0,
}
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
    task = CeleryCodec(Tasks()).task_message(job_of(KOMBU_TYPED), {}, {})
    assert task.payload is None
    args, _, _ = received(task).payload
    assert args == [datetime(2026, 1, 2, 3, 4, 5)]


def test_a_consumer_that_does_not_accept_json_still_refuses_the_message():
    envelope = {"specversion": "1.0", "id": "01946a8e-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "type": "a.b", "queue": "q"}
    task = CeleryCodec(Tasks()).task_message(job_of({**envelope, "args": []}), {}, {})
    with pytest.raises(ContentDisallowed):
        received(task, accept=prepare_accept_content(["msgpack"])).decode()


def _request_and_trace(envelope: dict) -> tuple[Any, list[tuple[Any, Any]]]:
    """The worker's ``Request`` of the delivery (as Celery's strategy builds it) and what the task
    got when run as a pool process runs it (``trace_task_ret`` with what the request hands over)."""
    app = StockCelery("decoded", set_as_current=False)
    ran: list[tuple[Any, Any]] = []

    @app.task(name="reports.build_pdf", shared=False)
    def build(*args: Any, **kwargs: Any) -> None:
        ran.append((args, kwargs))

    task = CeleryCodec(Tasks()).task_message(job_of(envelope), {}, {})
    message = received(task)
    request = Request(message, app=app, task=build, body=message.body, headers=message.headers, decoded=False)
    trace_task_ret(
        request.type, request.id, request.request_dict, request.body, request.content_type,
        request.content_encoding, app=app,
    )  # fmt: skip
    return request, ran


def test_the_pool_gets_the_payload_the_transport_decoded_not_the_json_body():
    envelope = {
        "specversion": "1.0",
        "id": "01946a8e-1a2b-7c3d-8e4f-5a6b7c8d9e0f",
        "type": "reports.build_pdf",
        "queue": "reports",
        "args": [1, "x", {"nested": [None]}],
        "meta": {"kwargs": {"n": 2}},
        "attempt": 0,
    }
    request, ran = _request_and_trace(envelope)
    assert request.content_type is None and request.content_encoding is None  # no JSON to parse
    assert request.body is request.message.payload is request.message.handed_over
    assert (request.args, request.kwargs) == ([1, "x", {"nested": [None]}], {"n": 2})
    assert ran == [((1, "x", {"nested": [None]}), {"n": 2})]


def test_a_kombu_typed_payload_still_reaches_the_pool_as_json_for_kombu_to_decode():
    request, ran = _request_and_trace(KOMBU_TYPED)
    assert request.content_type == "application/json" and isinstance(request.body, bytes)
    assert ran == [((datetime(2026, 1, 2, 3, 4, 5),), {})]


def test_no_payload_is_handed_over_for_a_content_type_the_consumer_does_not_accept():
    envelope = {"specversion": "1.0", "id": "01946a8e-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "type": "a.b", "queue": "q"}
    task = CeleryCodec(Tasks()).task_message(job_of({**envelope, "args": []}), {}, {})
    accepted = received(task)
    assert accepted.handed_over is None  # not decoded yet
    assert accepted.payload is task.payload and accepted.handed_over is task.payload
    refused = received(task, accept=prepare_accept_content(["msgpack"]))
    with pytest.raises(ContentDisallowed):
        refused.decode()
    assert refused.handed_over is None
