"""The consumer's buffered frame reader (ojs_kombu.amqp.framing), against py-amqp's own framing.

No broker: frames are produced by py-amqp's frame writer and fed through a socket pair in
chunks split at awkward places; what comes out must be what py-amqp's frame handler makes
of them, whichever path (our dispatch or py-amqp's read_frame) consumes them.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
from amqp import spec
from amqp.basic_message import Message
from amqp.exceptions import UnexpectedFrame
from amqp.method_framing import frame_handler, frame_writer
from amqp.serialization import dumps
from amqp.transport import TCPTransport

from ojs_kombu.amqp.framing import FrameReader
from ojs_kombu.amqp.outbox import outbox
from ojs_kombu.amqp.publish_buffer import PublishBuffer, method_frame
from ojs_kombu.wire.codec import OutgoingMessage


class Sink:
    """A transport stand-in for py-amqp's frame writer: collects the bytes written."""

    def __init__(self):
        self.data = bytearray()

    def write(self, data):
        self.data += bytes(data)


def encode(frames, frame_max=4096) -> bytes:
    """Wire bytes of ``frames``: (channel, method_sig, args, content) or ("heartbeat",)."""
    sink = Sink()
    writer = frame_writer(SimpleNamespace(frame_max=frame_max, bytes_sent=0), sink)
    for frame in frames:
        if frame == ("heartbeat",):
            writer(8, 0, None, None, None)
        else:
            channel, sig, args, content = frame
            writer(1, channel, sig, args, content)
    return bytes(sink.data)


def deliver(tag: int, body: bytes, channel: int = 1):
    args = dumps("sLbss", ("ctag", tag, False, "ex", "rk"))
    return (
        channel,
        spec.Basic.Deliver,
        args,
        Message(body, content_type="application/json", application_headers={"k": "v"}),
    )


WIRE_FRAMES = [
    deliver(1, b'{"small": 1}'),
    ("heartbeat",),
    deliver(2, b"x" * 10_000),  # several body frames at frame_max 4096
    (2, spec.Basic.Ack, dumps("Lb", (7, True)), None),
    deliver(3, b""),  # bodyless: method + header only
    deliver(4, bytes(range(256)) * 3, channel=2),
]


class Harness:
    """A TCPTransport on one end of a socket pair, a FrameReader on it, py-amqp's frame handler."""

    def __init__(self):
        self.ours, self.peer = socket.socketpair()
        self.transport = TCPTransport("localhost:5672")
        self.transport.sock = self.ours
        self.transport._setup_transport()
        self.transport.connected = True
        self.methods = []
        self.connection = SimpleNamespace(transport=self.transport, bytes_recv=0)
        self.connection.on_inbound_frame = frame_handler(self.connection, self._on_method)
        self.reader = FrameReader(self.connection)

    def _on_method(self, channel, sig, args, content):
        self.methods.append(
            (channel, sig, bytes(args), None if content is None else (content.body, dict(content.properties)))
        )

    def close(self):
        self.ours.close()
        self.peer.close()


def expected_methods(wire: bytes):
    """What py-amqp's own reader makes of ``wire``."""
    h = Harness()
    try:
        h.transport._read = TCPTransport._read.__get__(h.transport)  # py-amqp's original reader
        h.peer.sendall(wire)
        frames = 0
        while h.transport._read_buffer or frames < wire.count(b"\xce"):
            try:
                h.transport.sock.settimeout(0.2)
                h.connection.on_inbound_frame(h.transport.read_frame())
                frames += 1
            except TimeoutError:
                break
        return h.methods, h.connection.bytes_recv
    finally:
        h.close()


@pytest.fixture
def harness():
    h = Harness()
    yield h
    h.close()


@pytest.mark.parametrize("step", [1, 2, 3, 7, 8, 13, 100, 4099, 1 << 20])
def test_chunks_split_anywhere_give_the_same_methods(harness, step):
    wire = encode(WIRE_FRAMES)
    want, want_frames = expected_methods(wire)
    assert len(want) == 5  # 4 deliveries and the Basic.Ack; the heartbeat is no method
    for start in range(0, len(wire), step):
        harness.peer.sendall(wire[start : start + step])
        while harness.reader.fill() == 0:
            pass
        harness.reader.dispatch()
        assert not harness.reader.has_frame()
    assert harness.methods == want
    assert harness.connection.bytes_recv == want_frames  # heartbeat_tick counts frames
    assert harness.reader.buffered == 0


def test_drain_events_path_reads_what_dispatch_left(harness):
    """py-amqp's read_frame (used by RPC waits and confirm waits) consumes the same buffer, in order."""
    wire = encode(WIRE_FRAMES)
    want, _ = expected_methods(wire)
    cut = len(wire) // 2 + 3  # the middle of some frame
    harness.peer.sendall(wire[:cut])
    harness.reader.fill()
    harness.reader.dispatch()
    got_by_dispatch = len(harness.methods)
    harness.peer.sendall(wire[cut:])
    harness.ours.settimeout(1.0)  # as having_timeout would
    # read_frame finishes the partial frame from the socket, taking more than it needs
    harness.connection.on_inbound_frame(harness.transport.read_frame())
    harness.ours.settimeout(None)
    harness.reader.dispatch()  # the rest is already buffered: no socket read needed
    assert harness.reader.buffered == 0
    assert harness.methods == want
    assert got_by_dispatch < len(want)


def test_read_frame_timeout_keeps_the_partial_frame(harness):
    wire = encode(WIRE_FRAMES[:1])
    harness.peer.sendall(wire[:10])
    # drain_events(timeout=0.05).  (With timeout 0, py-amqp itself spins on EAGAIN inside a frame.)
    harness.ours.settimeout(0.05)
    with pytest.raises(socket.timeout):
        harness.transport.read_frame()
    harness.ours.settimeout(None)
    assert harness.reader.buffered == 10  # py-amqp pushed the frame's first bytes back
    assert not harness.reader.has_frame()
    harness.peer.sendall(wire[10:])
    harness.reader.fill()
    harness.reader.dispatch()
    assert harness.methods == expected_methods(wire)[0]


def test_initial_read_with_nothing_buffered_times_out(harness):
    harness.ours.settimeout(0)
    with pytest.raises(socket.timeout):
        harness.transport.read_frame()
    assert harness.reader.buffered == 0


def test_fill_without_data_reads_nothing(harness):
    assert harness.reader.fill() == 0  # never blocks, whatever the socket mode
    assert harness.reader.dispatch() == 0


def test_peer_close_raises_like_py_amqp(harness):
    harness.peer.close()
    with pytest.raises(OSError, match="Server unexpectedly closed connection"):
        harness.reader.fill()
    assert harness.transport.connected is False


def test_peer_close_during_read_frame(harness):
    harness.peer.sendall(encode(WIRE_FRAMES[:1])[:5])
    harness.peer.close()
    with pytest.raises(OSError, match="Server unexpectedly closed connection"):
        harness.transport.read_frame()
    assert harness.transport.connected is False


def test_bad_frame_end(harness):
    wire = bytearray(encode([("heartbeat",)]))
    wire[-1] = 0
    harness.peer.sendall(bytes(wire))
    harness.reader.fill()
    with pytest.raises(UnexpectedFrame):
        harness.reader.dispatch()


def test_reentrant_read_from_a_handler(harness):
    """A handler that reads the connection itself (a synchronous wait) moves the buffer on."""
    wire = encode(WIRE_FRAMES)
    want, _ = expected_methods(wire)
    on_frame = harness.connection.on_inbound_frame
    nested = []

    def handler(frame):
        done = on_frame(frame)
        if done and not nested:  # after the first method, read the next frame ourselves
            nested.append(on_frame(harness.transport.read_frame()))
        return done

    harness.reader._on_frame = handler
    harness.peer.sendall(wire)
    while harness.reader.buffered < len(wire):
        harness.reader.fill()
    harness.reader.dispatch()
    assert harness.methods == want


# -- Outbox -------------------------------------------------------------------------------------


class CountingSink(Sink):
    """A transport stand-in that also counts its writes."""

    def __init__(self):
        super().__init__()
        self.writes = 0

    def write(self, data):
        self.writes += 1
        super().write(data)


def ack_frame(tag: int):
    return (1, spec.Basic.Ack, dumps("Lb", (tag, False)), None)


def batched_connection(frame_max=4096):
    sink = CountingSink()
    reads = []
    connection = SimpleNamespace(
        frame_max=frame_max,
        bytes_sent=0,
        transport=sink,
        frame_writer_cls=frame_writer,
        blocking_read=lambda timeout=None: reads.append(sink.writes),  # how many writes came before the read
    )
    connection.reads = reads
    box = outbox(connection)
    assert outbox(connection) is box  # one per connection
    return connection, sink, box


def test_outbox_holds_frames_until_flush_and_sends_them_in_one_write():
    connection, sink, batch = batched_connection()
    frames = [ack_frame(tag) for tag in (1, 2, 3)]
    batch.hold()
    for channel, sig, args, content in frames:
        connection.frame_writer(1, channel, sig, args, content)
    assert sink.writes == 0
    batch.flush()
    assert sink.writes == 1
    assert bytes(sink.data) == encode(frames)  # the very frames py-amqp writes, one per ack
    assert connection.bytes_sent == 3  # counted for heartbeats as before


def test_outbox_writes_through_when_not_holding():
    connection, sink, batch = batched_connection()
    connection.frame_writer(1, *ack_frame(1)[:3], None)
    assert sink.writes == 1
    batch.hold()
    batch.flush()
    batch.flush()
    assert sink.writes == 1  # nothing held: nothing written
    connection.frame_writer(1, *ack_frame(2)[:3], None)
    assert sink.writes == 2
    assert bytes(sink.data) == encode([ack_frame(1), ack_frame(2)])


def test_outbox_copies_py_amqps_reused_buffer():
    # py-amqp hands each frame over as a view of one buffer it reuses: a held frame must be a copy.
    connection, sink, batch = batched_connection()
    frames = [ack_frame(7), deliver(8, b"body")]
    batch.hold()
    for channel, sig, args, content in frames:
        connection.frame_writer(1, channel, sig, args, content)
    batch.flush()
    assert bytes(sink.data) == encode(frames)


@pytest.mark.parametrize("tag", [1, 255, 2**32 + 7, 2**64 - 1])
def test_outbox_settle_writes_py_amqps_ack_and_nack_frames(tag):
    connection, sink, batch = batched_connection()
    batch.hold()
    batch.settle(5, spec.Basic.Ack, tag)
    batch.settle(5, spec.Basic.Nack, tag)
    assert sink.writes == 0
    batch.flush()
    assert sink.writes == 1
    # What Channel.basic_ack(tag, multiple=False) and send_method(Nack, "Lbb", (tag, False, False)) write.
    assert bytes(sink.data) == encode(
        [
            (5, spec.Basic.Ack, dumps("Lb", (tag, False)), None),
            (5, spec.Basic.Nack, dumps("Lbb", (tag, False, False)), None),
        ]
    )
    assert connection.bytes_sent == 2  # counted for heartbeats
    batch.settle(5, spec.Basic.Ack, tag)  # not holding: written at once
    assert sink.writes == 2


def test_outbox_deferred_settles_wait_for_a_flush_or_go_first_with_the_next_frame():
    connection, sink, batch = batched_connection()
    batch.defer_settle(5, spec.Basic.Ack, 1)
    batch.defer_settle(5, spec.Basic.Ack, 2)
    assert sink.writes == 0  # not holding, yet kept
    assert connection.bytes_sent == 2  # counted for heartbeats when made
    batch.flush()
    assert sink.writes == 1
    batch.defer_settle(5, spec.Basic.Nack, 3)
    connection.frame_writer(1, *ack_frame(4)[:3], None)  # another frame: the deferred one goes first, same write
    assert sink.writes == 2
    assert bytes(sink.data) == encode(
        [
            (5, spec.Basic.Ack, dumps("Lb", (1, False)), None),
            (5, spec.Basic.Ack, dumps("Lb", (2, False)), None),
            (5, spec.Basic.Nack, dumps("Lbb", (3, False, False)), None),
            ack_frame(4),
        ]
    )


def test_outbox_keeps_acks_and_publishes_in_the_order_they_were_made():
    connection, sink, box = batched_connection()
    args = dumps("Bssbb", (0, "", "q", True, False))
    message = OutgoingMessage(b"{}", {"message_id": "m"}, {})
    buffer = PublishBuffer(connection, channel_id=2)
    box.defer_settle(5, spec.Basic.Ack, 1)
    buffer.add(method_frame(2, args), message)
    box.defer_settle(5, spec.Basic.Ack, 2)
    assert sink.writes == 0 and len(buffer) > 0
    connection.frame_writer(1, *ack_frame(3)[:3], None)  # py-amqp's own frame: after all of them, one write
    assert sink.writes == 1 and len(buffer) == 0
    publish = PublishBuffer(
        SimpleNamespace(
            frame_max=4096, bytes_sent=0, transport=Sink(), frame_writer_cls=frame_writer, blocking_read=None
        ),
        2,
    )
    publish.add(method_frame(2, args), message)
    expected_publish = b"".join(publish._frames)
    acks = encode([(5, spec.Basic.Ack, dumps("Lb", (1, False)), None)])
    assert bytes(sink.data) == acks + expected_publish + encode(
        [(5, spec.Basic.Ack, dumps("Lb", (2, False)), None), ack_frame(3)]
    )


def test_outbox_sends_what_it_keeps_before_any_blocking_read():
    connection, sink, box = batched_connection()
    box.hold()
    box.settle(5, spec.Basic.Ack, 1)
    connection.frame_writer(1, *ack_frame(2)[:3], None)  # e.g. a synchronous method's request: held too
    assert sink.writes == 0
    connection.blocking_read(1.0)  # its reply: read only after what is kept was sent
    assert connection.reads == [1]
    assert bytes(sink.data) == encode([(5, spec.Basic.Ack, dumps("Lb", (1, False)), None), ack_frame(2)])
