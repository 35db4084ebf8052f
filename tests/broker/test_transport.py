"""The ``ojs://`` transport's own read path under kombu's event loop (the one Celery's worker runs)."""

from __future__ import annotations

import kombu
from kombu.asynchronous import Hub
from support import wait_until


def test_event_loop_reads_many_frames_per_recv(amqp_url, prefix):
    """``Transport.on_readable`` cuts every buffered frame out of one ``recv``
    (framing.FrameReader) instead of draining one frame per call; every message
    still arrives, in order."""
    count = 200
    url = "ojs" + amqp_url[amqp_url.index("://") :]
    received: list[int] = []
    with kombu.Connection(url, transport_options={"prefix": prefix}) as conn:
        conn.connect()
        reader = conn.connection.frame_reader
        assert reader is not None  # plain TCP: the buffered reader is attached
        fills: list[int] = []
        fill = reader.fill
        reader.fill = lambda: fills.append(fill()) or fills[-1]  # count recv()s, change nothing
        # Not a job queue (auto-delete): plain kombu traffic, passed through untouched.
        queue = kombu.Queue(f"{prefix}-plain", durable=False, auto_delete=True)
        queue(conn.channel()).declare()

        def on_message(body, message):
            received.append(body["i"])
            message.ack()

        hub = Hub()
        consumer = kombu.Consumer(conn.channel(), [queue], callbacks=[on_message], prefetch_count=count)
        consumer.consume()
        conn.register_with_event_loop(hub)
        loop = hub.create_loop()
        # Published from another connection once the consumer waits in the loop, so that no
        # synchronous reply on this connection (which reads through the same buffer) takes them.
        with kombu.Connection(amqp_url) as publisher, kombu.Producer(publisher.channel()) as producer:
            for i in range(count):
                producer.publish({"i": i}, routing_key=queue.name, serializer="json")
        try:
            wait_until(
                lambda: next(loop) or len(received) == count,
                timeout=30,
                interval=0,
                message=f"{count} messages through the event loop ({len(received)} so far)",
            )
        finally:
            consumer.cancel()
            hub.close()
    assert received == list(range(count))
    # Three frames per message: one recv per frame would be 600 (and py-amqp's own path 1,800).
    assert 0 < len([n for n in fills if n]) < count


def _consume_in_loop(amqp_url, prefix, count, name):
    """An ``ojs://`` connection consuming ``count`` messages (not acked) through kombu's event loop."""
    url = "ojs" + amqp_url[amqp_url.index("://") :]
    conn = kombu.Connection(url, transport_options={"prefix": prefix})
    conn.connect()
    queue = kombu.Queue(f"{prefix}-{name}", durable=False, auto_delete=False)
    queue(conn.channel()).declare()
    with kombu.Connection(amqp_url) as publisher, kombu.Producer(publisher.channel()) as producer:
        for i in range(count):
            producer.publish({"i": i}, routing_key=queue.name, serializer="json")
    received: list[kombu.Message] = []
    hub = Hub()
    consumer = kombu.Consumer(
        conn.channel(), [queue], callbacks=[lambda body, message: received.append(message)], prefetch_count=count
    )
    consumer.consume()
    conn.register_with_event_loop(hub)
    loop = hub.create_loop()
    wait_until(lambda: next(loop) or len(received) == count, timeout=30, interval=0, message=f"{count} deliveries")
    return conn, hub, loop, consumer, queue, received


def _left_in(amqp_url, queue) -> int:
    """How many messages ``queue`` holds, once every consumer is gone (unacked ones are back)."""
    with kombu.Connection(amqp_url) as conn:
        return int(conn.default_channel.queue_declare(queue.name, passive=True).message_count)


def test_acks_of_one_loop_tick_are_one_socket_write(amqp_url, prefix):
    """The acks the loop's thread makes during one tick (Celery acks there) leave with one
    ``sendall`` on the loop's next tick, each its own ``Basic.Ack`` (multiple=false, binding §5.3)."""
    count = 50
    conn, hub, loop, consumer, queue, received = _consume_in_loop(amqp_url, prefix, count, "acks")
    try:
        transport = conn.connection.transport
        writes: list[bytes] = []
        write = transport.write
        transport.write = lambda data: writes.append(bytes(data)) or write(data)  # count, change nothing
        hub.call_soon(lambda: [message.ack() for message in received])  # run by the loop's thread
        next(loop)  # this tick runs the acks, then writes them
        assert len(writes) == 1
        frames = [writes[0][i : i + 21] for i in range(0, len(writes[0]), 21)]
        assert len(frames) == count
        assert all(frame[7:11] == b"\x00\x3c\x00\x50" and frame[19] == 0 for frame in frames)  # Basic.Ack, single
        consumer.cancel()
    finally:
        hub.close()
        conn.release()
    assert _left_in(amqp_url, queue) == 0


def test_held_acks_precede_a_channel_close(amqp_url, prefix):
    """Acks held for the next tick are written before any other frame: closing the channel
    right after acking (no tick in between) still settles every message."""
    count = 20
    conn, hub, loop, consumer, queue, received = _consume_in_loop(amqp_url, prefix, count, "close")
    try:
        transport = conn.connection.transport
        writes: list[bytes] = []
        write = transport.write
        transport.write = lambda data: writes.append(bytes(data)) or write(data)  # count, change nothing
        for message in received:
            message.ack()  # the loop's thread: held for the next tick
        assert writes == []
        consumer.channel.close()  # Channel.Close: the held acks go first
        assert len(writes[0]) == 21 * count
    finally:
        hub.close()
        conn.release()
    assert _left_in(amqp_url, queue) == 0
