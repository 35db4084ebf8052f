"""The ``ojs://`` transport's own read path under kombu's event loop (the one Celery's worker runs)."""

from __future__ import annotations

import contextlib
import select
import struct
import time
import uuid

import kombu
from amqp import spec
from kombu.asynchronous import Hub
from kombu.transport import pyamqp
from support import ojs_url, wait_until

import ojs_celery  # noqa: F401  registers the Celery codec: the jobs below reach kombu as Celery task messages
from ojs_kombu.amqp.delivery import RawDelivery
from ojs_kombu.amqp.outbox import outbox
from ojs_kombu.model.job import Job
from ojs_kombu.transport.subscriber import JobConsumer


def test_event_loop_reads_many_frames_per_recv(amqp_url, prefix):
    """``Transport.on_readable`` cuts every buffered frame out of one ``recv``
    (framing.FrameReader) instead of draining one frame per call; every message
    still arrives, in order."""
    count = 200
    url = ojs_url(amqp_url)
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


# -- job deliveries under the event loop ---------------------------------------------------------

_FRAME_HEADER = struct.Struct(">BHI")  # frame type, channel, payload size
_METHOD = struct.Struct(">HH")  # class, method
_TAG_AND_FLAGS = struct.Struct(">QB")  # a Basic.Ack's delivery tag and flags octet


def _job_loop(amqp_url: str, prefix: str, queue_name: str, prefetch: int):
    """An ``ojs://`` connection consuming job queue ``queue_name`` in a kombu event loop whose
    callback acks through the loop (``hub.call_soon``), as Celery's worker does."""
    conn = kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": prefix})
    conn.connect()
    hub = Hub()
    conn.register_with_event_loop(hub)
    channel = conn.channel()
    channel.basic_qos(0, prefetch, False)
    return conn, hub, channel, kombu.Queue(queue_name, durable=True)


def test_acks_of_one_loop_pass_leave_in_one_write_each_its_own_frame(amqp_url, prefix, client, management):
    """The acks the loop's callbacks make in one pass are written together when the tick flushes
    them, one ``Basic.Ack`` frame per delivery with ``multiple=false`` (binding §5.3)."""
    count, queue_name = 60, f"acks{uuid.uuid4().hex[:8]}"
    client.enqueue_many([Job.create("t.ack", [i], queue=queue_name) for i in range(count)])
    conn, hub, channel, queue = _job_loop(amqp_url, prefix, queue_name, prefetch=count)
    writes: list[bytes] = []
    batch = outbox(conn.connection)  # the event loop's acks are batched in the connection's outbox
    write = batch._write
    batch._write = lambda data: (writes.append(bytes(data)), write(data))[1]
    received: list[int] = []

    def on_message(message):
        received.append(message.delivery_tag)
        hub.call_soon(message.ack)

    consumer = kombu.Consumer(channel, [queue], on_message=on_message)
    consumer.consume()
    loop = hub.create_loop()
    try:
        wait_until(
            lambda: next(loop) or len(_acks(writes)) >= count, timeout=30, interval=0, message=f"{count} acks written"
        )
        wait_until(
            lambda: (management.queue(f"{prefix}.ojs.queue.{queue_name}") or {}).get("messages") == 0,
            timeout=15,
            message="the queue empty (every ack taken)",
        )
    finally:
        consumer.cancel()
        hub.close()
        conn.release()
    acks = _acks(writes)
    assert sorted(tag for tag, _ in acks) == sorted(received)  # one frame per delivery, each tag once
    assert all(flags == 0 for _, flags in acks)  # multiple=false
    assert len([w for w in writes if _acks([w])]) < count  # several acks per write


def _acks(writes: list[bytes]) -> list[tuple[int, int]]:
    """The ``(delivery tag, flags)`` of every ``Basic.Ack`` frame in ``writes``."""
    found = []
    for data in writes:
        pos = 0
        while pos + 7 <= len(data):
            frame_type, _, size = _FRAME_HEADER.unpack_from(data, pos)
            if frame_type == 1 and size == 13 and _METHOD.unpack_from(data, pos + 7) == spec.Basic.Ack:
                found.append(_TAG_AND_FLAGS.unpack_from(data, pos + 11))
            pos += 8 + size
    return found


def test_work_a_read_ahead_delivery_schedules_does_not_wait_for_the_poll(amqp_url, prefix, client):
    """Deliveries left in the frame reader's buffer by a synchronous read are dispatched by the
    loop's tick, after the loop computed its poll timeout: what their callbacks schedule
    (Celery acks through ``call_soon``) must run at once, not when the poll times out (~1 s)."""
    queue_name = f"wake{uuid.uuid4().hex[:8]}"
    client.enqueue_many([Job.create("t.wake", [i], queue=queue_name) for i in range(3)])
    conn, hub, channel, queue = _job_loop(amqp_url, prefix, queue_name, prefetch=3)
    delays: list[float] = []

    def on_message(message):
        dispatched = time.monotonic()
        hub.call_soon(lambda: (delays.append(time.monotonic() - dispatched), message.ack()))

    consumer = kombu.Consumer(channel, [queue], on_message=on_message)
    consumer.consume()
    reader = conn.connection.frame_reader
    sock = conn.connection.sock
    # Read one frame the synchronous way (as a reply wait does): the reader takes all the
    # socket holds, so the deliveries' other frames stay in its buffer.
    select.select([sock], [], [], 10)
    with contextlib.suppress(TimeoutError):
        conn.drain_events(timeout=1)
    assert reader is not None and reader.has_frame(), "nothing was read ahead"
    loop = hub.create_loop()
    try:
        wait_until(lambda: next(loop) or len(delays) == 3, timeout=10, interval=0, message="three callbacks run")
    finally:
        consumer.cancel()
        hub.close()
        conn.release()
    assert max(delays) < 0.3, delays


def test_the_frame_reader_and_py_amqp_convert_a_job_delivery_alike(amqp_url, prefix, client):
    """A job delivery decoded by the frame reader (the event loop's path) becomes the same
    framework message as one py-amqp assembled (every other read)."""
    queue_name = f"same{uuid.uuid4().hex[:8]}"
    job = Job.create("t.same", [1, {"k": "v"}], queue=queue_name, meta={"trace": "x"}, priority=3)
    client.enqueue_job(job)
    with kombu.Connection(ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
        channel = conn.channel()
        kombu.Queue(queue_name, durable=True)(channel).declare()
        amqp_queue = channel.ojs.names.job_queue(queue_name)
        raw = wait_until(lambda: pyamqp.Channel.basic_get(channel, amqp_queue, no_ack=True), message="the job")
        delivery = RawDelivery(
            "ctag",
            raw.delivery_tag,
            False,
            raw.delivery_info["exchange"],
            raw.delivery_info["routing_key"],
            raw.properties,
            raw.body.encode() if isinstance(raw.body, str) else raw.body,
        )
        raw.delivery_info = {  # as Basic.Deliver carries it
            "consumer_tag": "ctag",
            "delivery_tag": raw.delivery_tag,
            "redelivered": False,
            "exchange": raw.delivery_info["exchange"],
            "routing_key": raw.delivery_info["routing_key"],
        }
        got: list = []
        consumer = JobConsumer(
            amqp_queue,
            queue_name,
            tag="ctag",
            deliver=got.append,
            on_cancel=lambda tag: None,
            no_local=False,
            no_ack=True,
            exclusive=False,
            nowait=False,
            arguments=None,
            argsig="BssbbbbF",
            framework_queue=queue_name,
            callback=got.append,
            consuming=True,
        )
        channel.subscriptions.by_tag["ctag"] = consumer  # as if consumed with that tag
        assert channel._on_raw_delivery(delivery) is True
        channel._unsettled.clear()
        channel._deliver(raw, queue_name, got.append)
        channel._unsettled.clear()
    direct, assembled = got
    assert direct.body == assembled.body
    assert direct.headers == assembled.headers
    assert direct.properties == assembled.properties
    assert direct.delivery_info == assembled.delivery_info
    assert direct.payload == assembled.payload == [[1, {"k": "v"}], {}, direct.payload[2]]


def test_acks_the_closing_event_loop_runs_are_written_before_it_returns(amqp_url, prefix, client):
    """kombu's ``Hub.close`` runs the callbacks still due (Celery's last acks) and no tick follows:
    those acks are written then, not held for a flush that never comes."""
    queue_name = f"close{uuid.uuid4().hex[:8]}"
    client.enqueue_many([Job.create("t.close", [i], queue=queue_name) for i in range(3)])
    conn, hub, channel, queue = _job_loop(amqp_url, prefix, queue_name, prefetch=3)
    writes: list[bytes] = []
    batch = outbox(conn.connection)
    write = batch._write
    batch._write = lambda data: (writes.append(bytes(data)), write(data))[1]
    received: list[int] = []

    def on_message(message):
        received.append(message.delivery_tag)
        hub.call_soon(message.ack)  # due at the loop's next pass, which never comes

    consumer = kombu.Consumer(channel, [queue], on_message=on_message)
    consumer.consume()
    loop = hub.create_loop()
    try:
        wait_until(lambda: next(loop) or len(received) == 3, timeout=10, interval=0, message="three deliveries")
        unwritten = set(received) - {tag for tag, _ in _acks(writes)}
        assert unwritten  # the last pass's acks are still due
        hub.close()
        assert {tag for tag, _ in _acks(writes)} == set(received)
    finally:
        consumer.cancel()
        conn.release()
