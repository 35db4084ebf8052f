"""Jobs the ``ojs://`` channel settles itself (through the runtime's Settler) and never hands to the framework."""

from __future__ import annotations

import uuid

import kombu
import pika
from support import get_messages, raw_channel, wait_until

from ojs_kombu import Client


def _ojs_url(amqp_url: str) -> str:
    return "ojs" + amqp_url[amqp_url.index("://") :]


def _drain(conn: kombu.Connection, seconds: float) -> None:
    """Read the connection for ``seconds`` (the confirms of the channel's republishes arrive this way)."""
    try:
        conn.drain_events(timeout=seconds)
    except TimeoutError:
        pass


def test_an_invalid_envelope_goes_to_the_dead_letter_queue_with_its_error_code(amqp_url, prefix, names):
    queue_name = f"inv{uuid.uuid4().hex[:8]}"
    received: list = []
    with kombu.Connection(_ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
        queue = kombu.Queue(queue_name, durable=True)
        with kombu.Consumer(conn.channel(), [queue], callbacks=[lambda body, m: received.append(m)]):
            with raw_channel(amqp_url) as channel:
                channel.basic_publish(
                    names.direct_exchange,
                    queue_name,
                    b'{"id": "not a job"}',
                    pika.BasicProperties(content_type="application/openjobspec+json", message_id="bad-1"),
                )
            dead = []

            def dead_lettered() -> bool:
                _drain(conn, 0.05)
                dead.extend(get_messages(amqp_url, names.dead_letter_queue(queue_name), 1, timeout=0.05))
                return bool(dead)

            wait_until(dead_lettered, timeout=10, interval=0, message="the invalid envelope in the DLQ")
    assert received == []
    _, properties, body = dead[0]
    assert body == b'{"id": "not a job"}'
    assert properties.headers["x-ojs-error-code"]
    assert properties.message_id == "bad-1"


def test_a_redelivered_job_counts_a_lost_worker_and_is_not_run_again(amqp_url, prefix, names):
    """The first consumer dies holding the job; the broker redelivers it (``redelivered``): with one
    attempt allowed, the Settler dead-letters it instead of handing it to the framework again."""
    queue_name = f"rd{uuid.uuid4().hex[:8]}"
    with Client(amqp_url, prefix=prefix) as client:
        job = client.enqueue("lost.worker", [1], queue=queue_name, retry={"max_attempts": 1})
    queue = kombu.Queue(queue_name, durable=True)
    first: list = []
    with kombu.Connection(_ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
        with kombu.Consumer(conn.channel(), [queue], callbacks=[lambda body, m: first.append(m)]):
            wait_until(lambda: _drain(conn, 0.05) or first, timeout=10, interval=0, message="the first delivery")
    # closed without an ack: the broker requeues it, flagged redelivered
    second: list = []
    with kombu.Connection(_ojs_url(amqp_url), transport_options={"prefix": prefix}) as conn:
        with kombu.Consumer(conn.channel(), [queue], callbacks=[lambda body, m: second.append(m)]):
            dead = []

            def dead_lettered() -> bool:
                _drain(conn, 0.05)
                dead.extend(get_messages(amqp_url, names.dead_letter_queue(queue_name), 1, timeout=0.05))
                return bool(dead)

            wait_until(dead_lettered, timeout=10, interval=0, message="the redelivered job in the DLQ")
    assert second == []
    _, properties, _ = dead[0]
    assert properties.message_id == job.id
