"""The ``ojs://`` transport's ack batching (:mod:`ojs_kombu.transport.acks`): frames and order, no broker."""

from __future__ import annotations

import threading

import pytest
from amqp import spec
from amqp.method_framing import frame_writer
from amqp.serialization import dumps

from ojs_kombu.transport.acks import AckBatch, ack_frame


class _Sink:
    """Collects what would go to the socket."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))


class _Conn:
    frame_max = 131072
    bytes_sent = 0


def _amqp_writer(sink: _Sink):
    return frame_writer(_Conn(), sink)


@pytest.mark.parametrize(
    ("channel_id", "tag", "multiple"), [(1, 1, False), (7, 2**40 + 3, False), (65535, 2**64 - 1, True)]
)
def test_ack_frame_is_what_py_amqp_writes(channel_id, tag, multiple):
    sink = _Sink()
    _amqp_writer(sink)(1, channel_id, spec.Basic.Ack, dumps("Lb", (tag, multiple)), None)
    assert ack_frame(channel_id, tag, multiple) == sink.writes[0]


def test_acks_of_a_tick_are_one_write_of_separate_frames():
    sink = _Sink()
    batch = AckBatch(sink.write)
    batch.tick()  # this thread runs the loop
    assert all(batch.defer(1, tag) for tag in (1, 2, 3))
    assert sink.writes == []
    batch.tick()
    assert sink.writes == [ack_frame(1, 1) + ack_frame(1, 2) + ack_frame(1, 3)]
    batch.tick()  # nothing held: no write
    assert len(sink.writes) == 1


def test_acks_are_written_by_the_caller_outside_the_loop_thread():
    batch = AckBatch(_Sink().write)
    assert not batch.defer(1, 1)  # no loop ticks yet
    batch.tick()
    held: list[bool] = []
    thread = threading.Thread(target=lambda: held.append(batch.defer(1, 2)))
    thread.start()
    thread.join()
    assert held == [False]
    batch.stop()
    assert not batch.defer(1, 3)  # the loop closed


def test_another_frame_writes_the_held_acks_first():
    sink = _Sink()
    batch = AckBatch(sink.write)
    writer = batch.wrap(_amqp_writer(sink))
    batch.tick()
    batch.defer(1, 5)
    writer(1, 1, spec.Channel.Close, dumps("BsBB", (200, "bye", 0, 0)), None)
    assert sink.writes[0] == ack_frame(1, 5)
    assert sink.writes[1].startswith(b"\x01\x00\x01")  # then the Channel.Close method frame
    batch.tick()
    assert len(sink.writes) == 2  # the acks were written once


def test_stop_writes_what_is_held():
    sink = _Sink()
    batch = AckBatch(sink.write)
    batch.tick()
    batch.defer(2, 9)
    batch.stop()
    assert sink.writes == [ack_frame(2, 9)]
