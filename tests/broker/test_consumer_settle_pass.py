"""The consumer loop's settle pass: the acks of one pass leave in one socket write, each its own frame.

Binding §5.3: every ``Basic.Ack`` has ``multiple=false``; coalescing across jobs is not
allowed, batching the frames into one ``sendall`` is.  A request made while the loop is
busy (here: inside a delivery callback) does not touch the wake-up pipe: the loop
executes it before it waits again; one made while it waits in ``select`` wakes it
through the pipe at once.
"""

from __future__ import annotations

import struct
import threading

from amqp import spec
from support import wait_until

from ojs_kombu import Client, Job
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.model.naming import Names
from ojs_kombu.runtime.consumer import Consumer, Delivery

COUNT = 5
ACK_CLASS_METHOD = struct.pack(">HH", *spec.Basic.Ack)


def ack_frames(data: bytes) -> list[int]:
    """The delivery tags of the ``Basic.Ack`` frames in ``data`` (whole frames)."""
    tags, pos = [], 0
    while pos + 7 <= len(data):
        frame_type, _channel, size = struct.unpack_from(">BHI", data, pos)
        payload = data[pos + 7 : pos + 7 + size]
        if frame_type == 1 and payload[:4] == ACK_CLASS_METHOD:
            tag, bits = struct.unpack_from(">QB", payload, 4)
            assert bits == 0  # multiple=false
            tags.append(tag)
        pos += 8 + size
    return tags


def test_the_acks_of_one_pass_go_in_one_write_without_waking_the_loop(amqp_url, prefix):
    names = Names(prefix)
    with Client(amqp_url, prefix=prefix) as client:
        client.declare_queue("settle")
        for result in client.enqueue_many([Job.create("a.b", [i], queue="settle") for i in range(COUNT + 1)]):
            assert result.ok
    deliveries: list[Delivery] = []
    writes: list[bytes] = []
    all_requested = threading.Event()

    def on_delivery(delivery: Delivery) -> None:
        deliveries.append(delivery)
        if len(deliveries) != COUNT:
            return
        # The loop thread, busy: record what it writes from now on, then let the test thread
        # ack all five before this pass over the frames ends.
        transport = consumer._kombu.connection.transport
        write = transport._write
        transport._write = lambda data: (writes.append(bytes(data)), write(data))[1]
        assert all_requested.wait(10)

    consumer = Consumer(
        amqp_url,
        {names.job_queue("settle"): "settle"},
        COUNT,
        on_delivery,
        topology=Topology(names),
        heartbeat=0,
    )
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(deliveries) == COUNT, message="five deliveries")
        wakes: list[int] = []
        wake = consumer.wakeup.wake
        consumer.wakeup.wake = lambda: (wakes.append(1), wake())[1]  # type: ignore[method-assign]
        for delivery in deliveries[:COUNT]:
            consumer.ack(delivery)
        assert wakes == []  # the busy loop is not woken through the pipe
        all_requested.set()
        wait_until(lambda: sum(len(ack_frames(w)) for w in writes) == COUNT, message="five acks written")
        with_acks = [w for w in writes if ack_frames(w)]
        assert len(with_acks) == 1, f"{len(with_acks)} writes for {COUNT} acks"
        assert sorted(ack_frames(with_acks[0])) == sorted(d.delivery_tag for d in deliveries[:COUNT])
        # One more delivery (the window has room again); the loop then waits in select() and
        # only the pipe can wake it for the ack (heartbeat=0: nothing else arrives for 1 s).
        wait_until(lambda: len(deliveries) == COUNT + 1 and consumer.wakeup.idle, message="the loop waiting")
        consumer.ack(deliveries[-1])
        assert wakes == [1]
        wait_until(lambda: sum(len(ack_frames(w)) for w in writes) == COUNT + 1, timeout=0.9, message="ack written")
    finally:
        consumer.stop()
        thread.join(10)
        consumer.close()
    assert not thread.is_alive()
