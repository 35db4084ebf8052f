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
