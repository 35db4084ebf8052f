"""PublishBuffer writes exactly the frames py-amqp's own frame writer would, and py-amqp reads them back."""

from __future__ import annotations

import struct

import pytest
from amqp import spec
from amqp.method_framing import frame_handler, frame_writer
from amqp.serialization import dumps, loads

from ojs_kombu import Job
from ojs_kombu.amqp.properties import WireMessage
from ojs_kombu.amqp.publish_buffer import PublishBuffer, method_frame
from ojs_kombu.wire.codec import OutgoingMessage, encode


class Wire:
    """What a py-amqp connection and its transport need to write and read frames, recording the writes."""

    def __init__(self, frame_max: int = 131072) -> None:
        self.frame_max = frame_max
        self.bytes_sent = 0
        self.bytes_recv = 0
        self.writes: list[bytes] = []
        self.transport = self
        self.frame_writer_cls = frame_writer  # the outbox builds py-amqp's writer over itself

    def write(self, data: bytes | memoryview) -> None:
        self.writes.append(bytes(data))

    def blocking_read(self, timeout: float | None = None) -> None:
        raise AssertionError("nothing reads")


def py_amqp_bytes(messages: list[OutgoingMessage], channel: int, args: bytes, frame_max: int) -> bytes:
    wire = Wire(frame_max)
    write = frame_writer(wire, wire)
    for message in messages:
        content = WireMessage(message.body, application_headers=message.headers, **message.properties)
        write(1, channel, spec.Basic.Publish, args, content)
    return b"".join(wire.writes)


def read_back(data: bytes, frame_max: int) -> list[tuple[int, tuple[int, int], bytes, object]]:
    """Cut ``data`` into frames and run them through py-amqp's frame handler."""
    received: list[tuple[int, tuple[int, int], bytes, object]] = []
    on_frame = frame_handler(  # as the broker reads them: Basic.Publish carries content
        Wire(frame_max), lambda *method: received.append(method), content_methods={spec.Basic.Publish}
    )
    pos = 0
    while pos < len(data):
        frame_type, channel, size = struct.unpack_from(">BHI", data, pos)
        assert size <= frame_max - 8 and data[pos + 7 + size] == 0xCE
        on_frame((frame_type, channel, data[pos + 7 : pos + 7 + size]))
        pos += 8 + size
    return received


def job_messages() -> list[OutgoingMessage]:
    small = encode(Job.create("a.b", ["x", 1], queue="email", priority=4, tags=["t"]), app_id="app")
    big = encode(Job.create("a.b", ["y" * 10_000], queue="email"))
    empty = OutgoingMessage(b"", {"message_id": "m", "delivery_mode": 2}, {})
    return [small, big, empty, small]


@pytest.mark.parametrize("frame_max", [131072, 4096])
def test_buffered_frames_equal_py_amqps_and_decode_back(frame_max: int) -> None:
    messages = job_messages()
    args = dumps("Bssbb", (0, "ojs.exchange.direct", "email", True, False))
    wire = Wire(frame_max)
    buffer = PublishBuffer(wire, channel_id=3)  # type: ignore[arg-type]  # a recording stand-in, no socket
    for message in messages:
        buffer.add(method_frame(3, args), message)
    assert wire.writes == [] and len(buffer) > 0
    buffer.flush()
    assert len(wire.writes) == 1 and wire.bytes_sent == 1 and len(buffer) == 0
    assert wire.writes[0] == py_amqp_bytes(messages, 3, args, frame_max)

    received = read_back(wire.writes[0], frame_max)
    assert len(received) == len(messages)
    for (channel, method, raw_args, content), message in zip(received, messages, strict=True):
        assert channel == 3 and method == spec.Basic.Publish
        assert loads("Bssbb", raw_args, 4)[0] == [0, "ojs.exchange.direct", "email", True, False]
        assert (content.body or b"") == message.body  # type: ignore[attr-defined]  # py-amqp: "" when empty
        assert content.properties == {**message.properties, "application_headers": message.headers}  # type: ignore[attr-defined]


def test_flush_of_an_empty_buffer_writes_nothing() -> None:
    wire = Wire()
    PublishBuffer(wire, channel_id=1).flush()  # type: ignore[arg-type]
    assert wire.writes == [] and wire.bytes_sent == 0


def test_a_property_too_long_buffers_nothing() -> None:
    wire = Wire()
    buffer = PublishBuffer(wire, channel_id=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        buffer.add(method_frame(1, b""), OutgoingMessage(b"{}", {"message_id": "x" * 256}, {}))
    assert len(buffer) == 0
    buffer.flush()
    assert wire.writes == []
