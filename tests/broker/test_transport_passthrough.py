"""``ojs://`` is transparent to everything that is not a task: plain kombu code behaves as on ``pyamqp://``.

Every test runs the same kombu code on both schemes; ``pyamqp`` shows what the
test expects of a plain AMQP transport, ``ojs`` that the OJS transport does the same.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import kombu
import pytest
from kombu.asynchronous import Hub
from support import wait_until

SCHEMES = ["pyamqp", "ojs"]


def _url(amqp_url: str, scheme: str) -> str:
    return scheme + amqp_url[amqp_url.index("://") :]


@pytest.fixture(params=SCHEMES)
def conn(request: pytest.FixtureRequest, amqp_url: str, prefix: str) -> Iterator[kombu.Connection]:
    """A connected kombu connection on the scheme under test (the test's prefix for ``ojs://``)."""
    with kombu.Connection(_url(amqp_url, request.param), transport_options={"prefix": prefix}) as connection:
        connection.connect()
        yield connection


def _drain(conn: kombu.Connection, queue: kombu.Queue, count: int) -> list:
    """``count`` message bodies from ``queue`` (Basic.Get, acked), then check that nothing more is there."""
    bound = queue(conn.channel())
    bodies: list = []

    def take() -> bool:
        message = bound.get(no_ack=False)
        if message is not None:
            bodies.append(message.payload)
            message.ack()
        return len(bodies) >= count

    wait_until(take, timeout=10, interval=0.01, message=f"{count} messages on {queue.name} ({bodies} so far)")
    assert bound.get(no_ack=True) is None  # exactly count: nothing routed twice
    return bodies


def test_fanout_exchange_reaches_every_bound_queue(conn, prefix):
    """(a) Both durable queues bound to a fanout exchange get every message.

    ``a`` is declared the kombu way (exchange, queue, binding in one ``Queue.declare``);
    ``b`` is declared on its own first and bound to the fanout exchange afterwards.
    """
    exchange = kombu.Exchange(f"{prefix}.fan", type="fanout", durable=True)
    queue_a = kombu.Queue(f"{prefix}.fan-a", exchange, durable=True)
    queue_b = kombu.Queue(f"{prefix}.fan-b", durable=True)
    channel = conn.channel()
    queue_a(channel).declare()
    queue_b(channel).declare()
    channel.queue_bind(queue_b.name, exchange.name, "")
    producer = kombu.Producer(conn.channel(), exchange=exchange)
    for i in range(3):
        producer.publish({"i": i}, serializer="json")
    assert _drain(conn, queue_a, 3) == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert _drain(conn, queue_b, 3) == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_topic_exchange_routes_by_pattern(conn, prefix):
    """(b) A topic exchange delivers each message to every queue whose pattern matches, only those."""
    exchange = kombu.Exchange(f"{prefix}.topic", type="topic", durable=True)
    stocks = kombu.Queue(f"{prefix}.stocks", exchange, routing_key="stock.*", durable=True)
    everything = kombu.Queue(f"{prefix}.everything", exchange, routing_key="#", durable=True)
    producer = kombu.Producer(conn.channel(), exchange=exchange)
    producer.publish({"k": "stock.usd"}, routing_key="stock.usd", serializer="json", declare=[stocks, everything])
    producer.publish({"k": "news.eu"}, routing_key="news.eu", serializer="json")
    assert _drain(conn, stocks, 1) == [{"k": "stock.usd"}]
    assert _drain(conn, everything, 2) == [{"k": "stock.usd"}, {"k": "news.eu"}]


def test_headers_exchange_matches_on_headers(conn, prefix):
    """A headers exchange routes by the message headers (``x-match: all``)."""
    exchange = kombu.Exchange(f"{prefix}.headers", type="headers", durable=True)
    queue = kombu.Queue(f"{prefix}.pdf", exchange, binding_arguments={"x-match": "all", "format": "pdf"}, durable=True)
    producer = kombu.Producer(conn.channel(), exchange=exchange)
    producer.publish({"f": "pdf"}, headers={"format": "pdf"}, serializer="json", declare=[queue])
    producer.publish({"f": "zip"}, headers={"format": "zip"}, serializer="json")
    assert _drain(conn, queue, 1) == [{"f": "pdf"}]


@pytest.mark.parametrize("bound_to_fanout", [False, True], ids=["default-exchange", "fanout"])
def test_requeue_of_a_plain_message_requeues_it(conn, prefix, bound_to_fanout):
    """``requeue=True`` on a message that is not a task puts it back, flagged redelivered.

    On the default exchange the durable queue is a job queue under ``ojs://``: its
    non-task messages are still plain messages.
    """
    if bound_to_fanout:
        queue = kombu.Queue(f"{prefix}.rq", kombu.Exchange(f"{prefix}.rq-fan", type="fanout"), durable=True)
    else:
        queue = kombu.Queue(f"{prefix}.rq", durable=True)
    producer = kombu.Producer(conn.channel(), exchange=queue.exchange)
    producer.publish({"n": 1}, routing_key=queue.name, serializer="json", declare=[queue])
    bound = queue(conn.channel())
    first = wait_until(lambda: bound.get(no_ack=False), timeout=10, message="the message")
    assert not first.delivery_info["redelivered"]
    first.requeue()
    again = wait_until(lambda: bound.get(no_ack=False), timeout=10, message="the requeued message")
    assert again.payload == {"n": 1}
    assert again.delivery_info["redelivered"]
    again.ack()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_event_loop_consumer_acking_from_another_thread_is_not_stalled(amqp_url, prefix, scheme):
    """(c) kombu's event loop, ``prefetch_count=1``, each ack made from a timer thread via ``hub.call_soon``.

    Every message follows the previous ack within ~0.1 s.  A frame the transport read
    ahead (e.g. with ``Basic.ConsumeOk``) must not wait in its buffer while the loop
    sleeps in ``poll`` until the next heartbeat (30 s at the default 60 s heartbeat).
    """
    count = 3
    arrivals: list[float] = []
    with kombu.Connection(_url(amqp_url, scheme), transport_options={"prefix": prefix}) as conn:
        conn.connect()
        queue = kombu.Queue(f"{prefix}.loop", durable=True)
        hub = Hub()
        conn.register_with_event_loop(hub)

        def on_message(body, message):
            arrivals.append(time.monotonic())
            threading.Timer(0.05, lambda: hub.call_soon(message.ack)).start()

        consumer = kombu.Consumer(conn.channel(), [queue], callbacks=[on_message], prefetch_count=1)
        consumer.declare()
        with kombu.Connection(_url(amqp_url, scheme), transport_options={"prefix": prefix}) as publisher:
            producer = kombu.Producer(publisher.channel())
            for i in range(count):
                producer.publish({"i": i}, routing_key=queue.name, serializer="json", declare=[queue])
        consumer.consume()
        loop = hub.create_loop()
        started = time.monotonic()
        try:
            wait_until(
                lambda: next(loop) or len(arrivals) == count,
                timeout=10,
                interval=0,
                message=f"{count} messages through the event loop ({len(arrivals)} so far)",
            )
        finally:
            consumer.cancel()
            hub.close()
    gaps = [b - a for a, b in zip([started, *arrivals], arrivals, strict=False)]
    assert max(gaps) < 5, gaps


CLOSED_CHANNEL_CALLS = {
    "basic_publish": lambda ch, q: ch.basic_publish(ch.prepare_message(b"{}"), exchange="", routing_key=q),
    "queue_declare": lambda ch, q: ch.queue_declare(q, durable=True, auto_delete=False),
    "exchange_declare": lambda ch, q: ch.exchange_declare(q, "fanout", durable=True, auto_delete=False),
    "basic_get": lambda ch, q: ch.basic_get(q),
}


@pytest.mark.parametrize("call", sorted(CLOSED_CHANNEL_CALLS))
def test_a_closed_channel_raises_a_recoverable_error(conn, prefix, call):
    """A call on a closed channel raises py-amqp's recoverable error, the one kombu's ``ensure`` retries
    on a new channel (a Celery worker's reply to a control command is published that way).

    On ``ojs://`` these once raised ``AttributeError`` (a closed channel has no connection), which
    nothing recovers from: a worker lost its reply with a "Control command error".
    """
    channel = conn.channel()
    channel.close()
    with pytest.raises(conn.recoverable_connection_errors):
        CLOSED_CHANNEL_CALLS[call](channel, f"{prefix}.closed")


class _Holder:
    """What kombu's ``Connection.ensure`` revives after a recoverable error (as it revives a Producer)."""

    def __init__(self, channel):
        self.channel = channel

    def revive(self, channel):
        self.channel = channel


def test_ensure_publishes_on_a_new_channel_after_the_old_one_closed(conn, prefix):
    """``Connection.ensure`` over a closed channel: the publish fails, kombu revives, the retry lands."""
    queue = kombu.Queue(f"{prefix}.revived", durable=True)
    queue(conn.channel()).declare()
    closed = conn.channel()
    closed.close()
    holder = _Holder(closed)
    message = closed.prepare_message(b'{"i": 1}', content_type="application/json")
    publish = conn.ensure(holder, lambda: holder.channel.basic_publish(message, "", queue.name), max_retries=2)
    publish()
    assert holder.channel is not closed
    assert _drain(conn, queue, 1) == [{"i": 1}]
