"""The Celery <-> OJS codec on its own (no broker): the mapping round-trips."""

from __future__ import annotations

import json

import pytest

from ojs_celery.protocol import CHORD_OPTION, CHORD_RESULTS, ENVELOPE_HEADER, CeleryCodec
from ojs_kombu import ValidationError, decode
from tools.schema import validate_job


class Tasks:
    """A stand-in task index: one known task."""

    def name_for(self, job_type):
        return {"reports.build_pdf": "Reports.BuildPDF"}.get(job_type, job_type)

    def max_attempts(self, name):
        return 4

    def unique(self, name):
        return None


def celery_message(**headers):
    base = {
        "lang": "py",
        "task": "Reports.BuildPDF",
        "id": "order-42",
        "shadow": None,
        "eta": None,
        "expires": "2030-01-01T00:00:00+00:00",
        "group": "g-1",
        "group_index": 2,
        "retries": 0,
        "timelimit": [30, 20],
        "root_id": "root-1",
        "parent_id": "parent-1",
        "argsrepr": "(7,)",
        "kwargsrepr": "{'paper': 'A4'}",
        "origin": "gen1@host",
        "ignore_result": False,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
        "x-custom": "kept",
    }
    base.update(headers)
    embed = {
        "callbacks": [
            {"task": "notify", "args": [], "kwargs": {}, "options": {}, "subtask_type": None, "immutable": False}
        ],
        "errbacks": None,
        "chain": None,
        "chord": None,
    }
    body = json.dumps([[7], {"paper": "A4"}, embed]).encode()
    return (
        body,
        {
            "content_type": "application/json",
            "content_encoding": "utf-8",
            "priority": 4,
            "correlation_id": "order-42",
            "reply_to": "reply-q",
        },
        base,
    )


def test_round_trip_keeps_every_celery_detail():
    codec = CeleryCodec(Tasks())
    body, properties, headers = celery_message()
    job, message = codec.to_job(body, properties, headers, "reports")
    validate_job(json.loads(message.body))
    assert job.type == "reports.build_pdf" and job.args == [7] and job.kwargs == {"paper": "A4"}
    assert job.priority == 4 and job.expires_at == "2030-01-01T00:00:00.000Z"
    assert message.headers["x-ojs-max-attempts"] == 4 and message.headers["x-ojs-attempt"] == 1
    assert message.properties["reply_to"] == "reply-q"

    delivered = decode(message.body, message.properties, message.headers)
    body2, properties2, headers2 = codec.from_job(delivered, message.properties, message.headers)
    args, kwargs, embed = json.loads(body2)
    assert (args, kwargs) == ([7], {"paper": "A4"})
    assert embed["callbacks"][0]["task"] == "notify" and embed["errbacks"] is None
    for key in (
        "task",
        "id",
        "group",
        "group_index",
        "timelimit",
        "root_id",
        "parent_id",
        "argsrepr",
        "kwargsrepr",
        "origin",
        "x-custom",
    ):
        assert headers2[key] == headers[key], key
    assert headers2["retries"] == 0 and headers2[ENVELOPE_HEADER]["id"] == job.id
    assert properties2["content_type"] == "application/json" and properties2["correlation_id"] == "order-42"


def test_a_foreign_job_becomes_a_message_for_the_mapped_task():
    codec = CeleryCodec(Tasks())
    envelope = {
        "specversion": "1.0",
        "id": "01946a8e-1a2b-7c3d-8e4f-5a6b7c8d9e0f",
        "type": "reports.build_pdf",
        "queue": "reports",
        "args": [1],
        "meta": {"kwargs": {"paper": "Letter"}, "tenant": "acme"},
        "attempt": 0,
    }
    job = decode(json.dumps(envelope).encode(), {"content_type": "application/openjobspec+json"}, {})
    body, properties, headers = codec.from_job(job, {}, {})
    assert headers["task"] == "Reports.BuildPDF" and headers["id"] == envelope["id"]
    assert json.loads(body)[:2] == [[1], {"paper": "Letter"}]
    assert headers[ENVELOPE_HEADER]["meta"] == {"tenant": "acme"}  # foreign meta survives a retry


def test_pickle_is_refused():
    body, properties, headers = celery_message()
    with pytest.raises(ValidationError, match="JSON only"):
        CeleryCodec(Tasks()).to_job(
            b"\x80\x04", {**properties, "content_type": "application/x-python-serialize"}, headers, "reports"
        )


def test_a_job_with_an_integer_beyond_64_bits_still_becomes_a_task_body():
    # The body is written by orjson, which refuses integers beyond 64 bits: a tolerantly
    # read job may hold one (another producer's), and json writes it instead.
    envelope = {
        "specversion": "1.0",
        "id": "01946a8e-1a2b-7c3d-8e4f-5a6b7c8d9e0f",
        "type": "reports.build_pdf",
        "queue": "reports",
        "args": [2**70, "é", 1.5],
        "meta": {"kwargs": {"n": -(2**65)}},
        "attempt": 0,
    }
    job = decode(json.dumps(envelope).encode(), {"content_type": "application/openjobspec+json"}, {})
    body, _, _ = CeleryCodec(Tasks()).from_job(job, {}, {})
    assert json.loads(body) == [
        [2**70, "é", 1.5],
        {"n": -(2**65)},
        {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    ]


def test_chord_header_tasks_become_batch_members_and_the_callback_gets_the_results_first():
    codec = CeleryCodec(Tasks())
    batch_id = "01946a8e-1a2b-7c3d-8e4f-5a6b7c8d9e0f"
    mark = {"id": batch_id, "group": "g-1", "count": 3}
    body, properties, headers = celery_message()
    payload = json.loads(body)
    payload[2]["chord"] = {"task": "tsum", "args": [], "kwargs": {}, "options": {CHORD_OPTION: mark}}
    job, _ = codec.to_job(json.dumps(payload).encode(), properties, headers, "reports")
    assert job.meta["workflow"] == {
        "id": batch_id,
        "path": [2],  # group_index
        "parent_results": {},
        "fan_in": {"id": batch_id, "index": 2, "count": 3},
    }
    for other in ({"group": "g-2"}, {"group_index": 3}):  # another group's task, an index out of range
        job, _ = codec.to_job(json.dumps(payload).encode(), properties, {**headers, **other}, "reports")
        assert "workflow" not in job.meta, other

    # The callback job the fan-in publishes: results in index order first, reply_to/correlation_id restored.
    callback = job.model_copy(
        update={
            "meta": {
                "celery": {"task": "tsum", CHORD_RESULTS: True, "reply_to": "client-q", "correlation_id": "body-1"},
                "workflow": {"id": batch_id, "path": ["on_success"], "parent_results": {"1": 20, "0": 10, "2": 30}},
            },
            "args": [5],
        }
    )
    body2, properties2, _ = codec.from_job(callback, {}, {})
    assert json.loads(body2)[0] == [[10, 20, 30], 5]
    assert properties2["reply_to"] == "client-q" and properties2["correlation_id"] == "body-1"
    no_inline = callback.model_copy(
        update={"meta": {**callback.meta, "workflow": {"id": batch_id, "path": ["on_success"], "results_from": "x"}}}
    )
    with pytest.raises(ValidationError, match="inline header results"):
        codec.from_job(no_inline, {}, {})
