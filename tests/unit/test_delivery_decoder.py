"""The direct delivery decoder (ojs_kombu.amqp.delivery) makes of a delivery what py-amqp makes of it.

No broker: the frames are written by py-amqp's own frame writer, with every basic property
type and bodies of every shape; py-amqp's frame handler is the reference.
"""

from __future__ import annotations

import struct
from datetime import datetime
from decimal import Decimal
from types import SimpleNamespace

import pytest
from amqp import spec
from amqp.basic_message import Message
from amqp.method_framing import frame_handler
from amqp.serialization import dumps, loads
from test_framing import Harness, deliver, encode

from ojs_kombu.amqp.delivery import DELIVER_SIGNATURE, RawDelivery, read_delivery

ALL_PROPERTIES = {
    "content_type": "application/json",
    "content_encoding": "utf-8",
    "application_headers": {
        "s": "välue",
        "i": -7,
        "big": 2**40,
        "f": 1.5,
        "b": True,
        "n": None,
        "d": Decimal("1.25"),
        "t": datetime(2026, 11, 24, 20, 0, 0),
        "l": ["a", 1, {"x": "y"}],
        "m": {"nested": {"deep": [1, 2]}},
        "x-death": [{"count": 1, "queue": "q", "reason": "rejected"}],
    },
    "delivery_mode": 2,
    "priority": 9,
    "correlation_id": "corr",
    "reply_to": "reply",
    "expiration": "60000",
    "message_id": "0193c5c2-0000-7000-8000-000000000000",
    "timestamp": 1_764_014_462,
    "type": "email.send",
    "user_id": "guest",
    "app_id": "ojs",
    "cluster_id": "c",
}

BODIES = [b"", b'{"a": 1}', "é".encode() * 3000, bytes(range(256)) * 100]
PROPERTY_SETS = [{}, {"content_type": "application/json"}, ALL_PROPERTIES]


def deliver_with(tag: int, body: bytes, properties: dict, *, redelivered: bool = False, channel: int = 1):
    args = dumps("sLbss", ("amq.ctag-é", tag, redelivered, "ojs.exchange.direct", "email"))
    return (channel, spec.Basic.Deliver, args, Message(body, **properties))


def py_amqp_reads(wire: bytes, frame_max: int) -> list[RawDelivery]:
    """Every delivery in ``wire`` as py-amqp's frame handler decodes it."""
    read: list[RawDelivery] = []

    def on_method(channel, sig, args, content):
        assert sig == spec.Basic.Deliver
        tag, delivery_tag, redelivered, exchange, routing_key = loads("sLbss", args, 4)[0]
        body = content.body if isinstance(content.body, bytes) else str(content.body).encode()
        read.append(RawDelivery(tag, delivery_tag, redelivered, exchange, routing_key, dict(content.properties), body))

    on_frame = frame_handler(SimpleNamespace(frame_max=frame_max, bytes_recv=0), on_method)
    pos = 0
    while pos < len(wire):
        frame_type, channel, size = struct.unpack_from(">BHI", wire, pos)
        on_frame((frame_type, channel, wire[pos + 7 : pos + 7 + size]))
        pos += 8 + size
    return read


@pytest.mark.parametrize("frame_max", [131072, 4096])
@pytest.mark.parametrize("properties", PROPERTY_SETS, ids=["none", "one", "all"])
@pytest.mark.parametrize("body", BODIES, ids=["empty", "small", "multi-byte", "binary"])
@pytest.mark.parametrize("redelivered", [False, True])
def test_read_delivery_equals_py_amqp(frame_max: int, properties: dict, body: bytes, redelivered: bool) -> None:
    wire = encode([deliver_with(2**33 + 5, body, properties, redelivered=redelivered)], frame_max)
    found = read_delivery(wire, 0)
    assert found is not None
    delivery, end, frames = found
    assert end == len(wire)
    assert frames == len(_frames(wire))
    assert [delivery] == py_amqp_reads(wire, frame_max)
    assert delivery.properties.keys() == properties.keys()
    assert delivery.redelivered is redelivered and delivery.body == body


def _frames(wire: bytes) -> list[int]:
    pos, starts = 0, []
    while pos < len(wire):
        starts.append(pos)
        pos += 8 + struct.unpack_from(">I", wire, pos + 3)[0]
    return starts


def test_an_incomplete_delivery_is_left_alone() -> None:
    wire = encode([deliver_with(1, b"y" * 10_000, ALL_PROPERTIES)], 4096)
    assert read_delivery(wire, 0) is not None
    for cut in range(len(wire)):
        assert read_delivery(wire[:cut], 0) is None


@pytest.mark.parametrize("between", ["heartbeat", "other channel"])
def test_a_foreign_frame_inside_a_delivery_is_left_to_py_amqp(between: str) -> None:
    wire = encode([deliver_with(1, b"z" * 5000, {})], 4096)
    starts = _frames(wire)
    assert len(starts) == 4  # method, header, two body frames
    foreign = (
        encode([("heartbeat",)])
        if between == "heartbeat"
        else encode([(2, spec.Basic.Ack, dumps("Lb", (7, False)), None)])
    )
    for split in starts[1:]:
        assert read_delivery(wire[:split] + foreign + wire[split:], 0) is None


def test_another_content_class_or_a_bad_frame_end_is_left_to_py_amqp() -> None:
    wire = bytearray(encode([deliver_with(1, b"body", {})]))
    header = _frames(bytes(wire))[1]
    other_class = bytearray(wire)
    other_class[header + 7 : header + 9] = b"\x00\x3d"
    assert read_delivery(bytes(other_class), 0) is None
    for frame_end in [pos - 1 for pos in _frames(bytes(wire))[1:]] + [len(wire) - 1]:
        broken = bytearray(wire)
        broken[frame_end] = 0
        assert read_delivery(bytes(broken), 0) is None


def test_signature_is_basic_deliver() -> None:
    assert DELIVER_SIGNATURE == struct.pack(">HH", *spec.Basic.Deliver)


# -- through the FrameReader ------------------------------------------------------------------


class Decoding(Harness):
    """The framing harness with direct decoding on channel 1; ``accept`` decides per consumer tag."""

    def __init__(self, accept=lambda tag: True):
        super().__init__()
        self.raw: list[RawDelivery] = []
        self.accept = accept
        self.reader.decode_deliveries(1, self._on_raw)

    def _on_raw(self, delivery: RawDelivery) -> bool:
        if not self.accept(delivery.consumer_tag):
            return False
        self.raw.append(delivery)
        args = DELIVER_SIGNATURE + dumps("sLbss", delivery[:5])  # as py-amqp received them
        self.methods.append((1, spec.Basic.Deliver, args, (delivery.body, delivery.properties)))
        return True


WIRE = [
    deliver(1, b'{"small": 1}'),
    ("heartbeat",),
    deliver(2, b"x" * 10_000),
    (2, spec.Basic.Ack, dumps("Lb", (7, True)), None),
    deliver(3, b""),
    deliver(4, bytes(range(256)) * 3, channel=2),
    deliver_with(5, b"all", ALL_PROPERTIES),
]


@pytest.mark.parametrize("step", [1, 7, 100, 4099, 1 << 20])
def test_reader_decodes_channel_deliveries_and_leaves_the_rest_to_py_amqp(step: int) -> None:
    wire = encode(WIRE)
    reference = Harness()  # no direct decoding: py-amqp reads everything
    decoding = Decoding()
    try:
        for harness in (reference, decoding):
            for start in range(0, len(wire), step):
                harness.peer.sendall(wire[start : start + step])
                while harness.reader.fill() == 0:
                    pass
                harness.reader.dispatch()
            assert harness.reader.buffered == 0
        assert decoding.connection.bytes_recv == reference.connection.bytes_recv  # heartbeats count frames
        # Same methods, same order, whoever decoded them (an empty body: py-amqp's "", which the
        # consumer turns into b"", as it turns every body into bytes).
        assert _bytes_bodies(decoding.methods) == _bytes_bodies(reference.methods)
        # A delivery split between two reads is left to py-amqp; one read holds them all.
        direct = [d.delivery_tag for d in decoding.raw]
        assert direct == [1, 2, 3, 5] if step > len(wire) else set(direct) <= {1, 2, 3, 5}
        assert direct or step < 4099
    finally:
        reference.close()
        decoding.close()


def _bytes_bodies(methods):
    return [m if m[3] is None or m[3][0] != "" else (*m[:3], (b"", m[3][1])) for m in methods]


def test_a_refused_delivery_goes_through_py_amqp() -> None:
    harness = Decoding(accept=lambda tag: False)
    try:
        harness.peer.sendall(encode([deliver(1, b"a"), deliver(2, b"b" * 9000)]))
        while harness.reader.buffered < 1 or harness.reader.has_frame() is False:
            harness.reader.fill()
        while harness.reader.buffered:
            harness.reader.dispatch()
            if harness.reader.buffered and not harness.reader.has_frame():
                harness.reader.fill()
        assert harness.raw == []
        assert [loads("sLbss", m[2], 4)[0][1] for m in harness.methods] == [1, 2]
    finally:
        harness.close()
