"""enqueue_many's per-key properties: jobs with equal ``properties_key`` get equal properties from
``encode`` but for the message id, and ``PublishBuffer.add_job`` writes the frames ``add`` writes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from amqp.method_framing import frame_writer
from amqp.serialization import dumps

from ojs_kombu import Job
from ojs_kombu.amqp.properties import encode_properties, properties_template, shortstr
from ojs_kombu.amqp.publish_buffer import PublishBuffer, method_frame
from ojs_kombu.model.ids import new_job_id
from ojs_kombu.wire.codec import encode, encode_body, properties_key

OPTIONS: list[dict[str, Any]] = [
    {},
    {"queue": "email"},
    {"priority": 7},
    {"priority": 20},  # clamped to 9 on the wire
    {"priority": 0},
    {"retry": {"max_attempts": 5}},
    {"tags": ["a", "b"]},
    {"meta": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "k=v"}},
    {"meta": {"tags": "not a list"}},
    {"kwargs": {"to": "x"}},
    {"scheduled_at": timedelta(hours=1), "expires_at": timedelta(hours=2)},
    {"timeout": 30},
]


def same_but_id(job: Job) -> Job:
    """``job`` with another id: what encode reads for the properties, the id apart, is the same."""
    return job.model_copy(update={"id": new_job_id()})


def whole_properties(job: Job, app_id: str | None = None) -> bytes:
    message = encode(job, app_id=app_id)
    return encode_properties(message.properties, message.headers)


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("app_id", [None, "billing"])
def test_jobs_with_equal_keys_get_the_template_around_their_own_id(options: dict[str, Any], app_id: str | None):
    first = Job.create("a.b", ["x", 1], **options)
    second = same_but_id(first)
    key = properties_key(first, app_id)
    assert key is not None and properties_key(second, app_id) == key
    message = encode(first, app_id=app_id)
    before, after = properties_template(message.properties, message.headers)
    for job in (first, second):
        assert before + shortstr(job.id) + after == whole_properties(job, app_id)
        assert encode_body(job) == encode(job, app_id=app_id).body


def test_every_input_of_the_properties_changes_the_key():
    base = Job.create("a.b", [1], queue="q")
    key = properties_key(base)
    changed = [
        base.model_copy(update={"type": "a.c"}),
        base.model_copy(update={"queue": "r"}),
        base.model_copy(update={"created_at": "2026-01-01T00:00:00.000Z"}),
        base.model_copy(update={"enqueued_at": "2026-01-01T00:00:00.000Z"}),
        base.model_copy(update={"scheduled_at": "2030-01-01T00:00:00.000Z"}),
        base.model_copy(update={"attempt": 1}),
        Job.create("a.b", [1], queue="q", retry={"max_attempts": 4}),
        base.model_copy(update={"priority": 1}),
        base.model_copy(update={"meta": {"tags": ["t"]}}),
        base.model_copy(update={"meta": {"traceparent": "00-x"}}),
        base.model_copy(update={"meta": {"tracestate": "k=v"}}),
    ]
    keys = [properties_key(job) for job in changed]
    assert None not in keys and key not in keys and len(set(keys)) == len(keys)
    assert properties_key(base, "other") != key
    assert properties_key(base, "ojs") == key  # the default app id, named


@pytest.mark.parametrize(
    "update",
    [
        {"attempt": True},  # a bool, equal to 1: exact types only
        {"priority": 1.0},
        {"queue": b"q"},
        {"meta": {"traceparent": 1.5}},
        {"id": 12345},
    ],
)
def test_a_value_that_is_not_a_plain_str_or_int_has_no_key(update: dict[str, Any]):
    job = Job.model_construct(**{**Job.create("a.b", [1]).__dict__, **update})
    assert properties_key(job) is None


def test_add_job_buffers_the_frames_add_buffers():
    jobs = [Job.create("a.b", ["x", i], queue="email", tags=["t"]) for i in range(3)]
    jobs.append(Job.create("a.b", ["y" * 10_000], queue="email"))  # more than one body frame
    args = dumps("Bssbb", (0, "ojs.exchange.direct", "email", True, False))
    method = method_frame(3, args)
    written = []
    for use_template in (False, True):
        wire = _Wire(frame_max=4096)
        buffer = PublishBuffer(wire, channel_id=3)  # type: ignore[arg-type]  # a recording stand-in
        for job in jobs:
            message = encode(job)
            if use_template:
                template = properties_template(message.properties, message.headers)
                size = buffer.add_job(method, template, job.id, message.body)
                assert size == len(buffer)
            else:
                buffer.add(method, message)
        buffered = len(buffer)
        buffer.flush()
        assert buffered == len(wire.writes[0])  # what the buffer counts is what it writes
        written.append(wire.writes)
    assert written[0] == written[1] and len(written[0]) == 1


def test_add_job_refuses_an_id_too_long_and_buffers_nothing():
    buffer = PublishBuffer(_Wire(), channel_id=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        buffer.add_job(method_frame(1, b""), (b"\x00\x00", b""), "x" * 256, b"{}")
    assert len(buffer) == 0


class _Wire:
    """A connection and transport stand-in that records the writes."""

    def __init__(self, frame_max: int = 131072) -> None:
        self.frame_max = frame_max
        self.bytes_sent = 0
        self.writes: list[bytes] = []
        self.transport = self
        self.frame_writer_cls = frame_writer  # the outbox builds py-amqp's writer over itself

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def blocking_read(self, timeout: float | None = None) -> None:
        raise AssertionError("nothing reads")
