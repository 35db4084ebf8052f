"""Binding conformance (seed 001 §13) for topology and publishing, against a real broker.

Each test is named after the requirement it proves.  Declared arguments are read
back through the management API; message properties are read off the wire
with an independent pika consumer.
"""

from __future__ import annotations

import json
import uuid

import pytest
from support import get_messages, message_count, raw_channel, wait_until

from ojs_kombu import (
    Client,
    Job,
    Names,
    PublishNackedError,
    QueueOptions,
    UnroutableError,
)
from ojs_kombu.wire.codec import CONTENT_TYPE
from ojs_kombu.wire.entities import normalise_arguments
from ojs_kombu.wire.headers import Header
from tools.schema import validate_job


def _enqueue_one(client: Client, queue: str = "email", **options) -> Job:
    return client.enqueue("email.send", ["user@example.com", "welcome"], queue=queue, **options)


def test_amqp_001_direct_exchange_durable_direct(client, management, names):
    _enqueue_one(client)
    exchange = management.exchange(names.direct_exchange)
    assert exchange["type"] == "direct"
    assert exchange["durable"] is True
    assert exchange["auto_delete"] is False


def test_amqp_002_dead_letter_exchange_durable_direct(client, management, names):
    _enqueue_one(client)
    exchange = management.exchange(names.dead_letter_exchange)
    assert exchange["type"] == "direct"
    assert exchange["durable"] is True
    assert exchange["auto_delete"] is False


def test_amqp_003_job_queue_properties(client, management, names):
    client.declare_queue("email")
    queue = management.queue(names.job_queue("email"))
    assert queue["durable"] is True
    assert queue["exclusive"] is False
    assert queue["auto_delete"] is False


def test_amqp_004_dead_letter_arguments_and_dlq(client, management, names):
    client.declare_queue("email")
    queue = management.queue(names.job_queue("email"))
    assert queue["type"] == "classic"
    # Exactly these arguments; RabbitMQ 4.x lists the queue's type among them too.
    assert normalise_arguments(queue["arguments"]) == normalise_arguments(
        {"x-dead-letter-exchange": names.dead_letter_exchange, "x-dead-letter-routing-key": "email"}
    )
    dlq = management.queue(names.dead_letter_queue("email"))
    assert dlq["durable"] is True and dlq["exclusive"] is False and dlq["auto_delete"] is False
    bindings = management.bindings(source=names.dead_letter_exchange, destination=names.dead_letter_queue("email"))
    assert [b["routing_key"] for b in bindings] == ["email"]
    # And a Nack really lands there: the DLQ is wired, not only declared.
    _enqueue_one(client)
    with raw_channel(client.url) as channel:
        method, _, _ = channel.basic_get(names.job_queue("email"))
        channel.basic_nack(method.delivery_tag, requeue=False)
    assert len(get_messages(client.url, names.dead_letter_queue("email"), 1)) == 1


def test_amqp_005_push_publishes_to_direct_exchange_with_queue_key(client, names):
    job = _enqueue_one(client, queue="reports.daily")
    [(method, properties, body)] = get_messages(client.url, names.job_queue("reports.daily"), 1)
    assert method.exchange == names.direct_exchange
    assert method.routing_key == "reports.daily"
    assert properties.message_id == job.id


def test_amqp_010_to_013_message_properties_and_body(client, names):
    job = _enqueue_one(client, priority=3, kwargs={"lang": "fr"}, tags=["a", "b"])
    [(_, properties, body)] = get_messages(client.url, names.job_queue("email"), 1)
    assert properties.content_type == CONTENT_TYPE == "application/openjobspec+json"  # AMQP-010
    assert properties.content_encoding == "utf-8"
    assert properties.delivery_mode == 2  # AMQP-011
    assert properties.message_id == job.id  # AMQP-012
    assert properties.type == "email.send"
    assert properties.app_id == "ojs"
    assert properties.priority == 3
    assert isinstance(properties.timestamp, int) and properties.timestamp > 0
    headers = properties.headers
    assert headers[Header.QUEUE] == "email"
    assert headers[Header.ATTEMPT] == 1
    assert headers[Header.MAX_ATTEMPTS] == 3
    assert headers[Header.CREATED_AT] == job.created_at
    assert headers[Header.ENQUEUED_AT] == job.enqueued_at
    assert headers[Header.TAGS] == "a,b"
    envelope = json.loads(body.decode("utf-8"))  # AMQP-013
    validate_job(envelope)
    assert envelope["specversion"] == "1.0"
    assert envelope["id"] == job.id
    assert envelope["args"] == ["user@example.com", "welcome"]
    assert envelope["meta"]["kwargs"] == {"lang": "fr"}
    assert envelope["attempt"] == 0
    assert Job.from_json(body) == job


def test_amqp_014_publisher_confirms_reject_publish_nack(client, names):
    # Only a channel in confirm mode hears Basic.Nack: a full reject-publish queue proves it.
    client.declare_queue("tiny", max_length=2, overflow="reject-publish")
    _enqueue_one(client, queue="tiny")
    _enqueue_one(client, queue="tiny")
    with pytest.raises(PublishNackedError) as info:
        _enqueue_one(client, queue="tiny")
    assert info.value.job_id
    assert message_count(client.url, names.job_queue("tiny")) == 2


def test_amqp_014_confirm_mode_visible_on_the_broker(amqp_url, prefix, management):
    name = f"{prefix} confirms"
    with Client(amqp_url, prefix=prefix, connection_name=name) as client:
        _enqueue_one(client)

        def our_confirm_channels():
            connections = {
                c["name"]
                for c in management.connections()
                if c.get("client_properties", {}).get("connection_name") == name
            }

            def connection_of(channel):  # the API gives {} or [] when it has no details yet
                details = channel.get("connection_details")
                return details.get("name") if isinstance(details, dict) else None

            return [c for c in management.channels() if connection_of(c) in connections and c.get("confirm")]

        assert wait_until(our_confirm_channels, timeout=15, message="our channel in confirm mode")


def test_amqp_015_016_unroutable_job_raises_for_that_job_only(amqp_url, prefix, names):
    with Client(amqp_url, prefix=prefix, declare=False) as client:
        client.declare_queue("known")
        jobs = [
            Job.create("a.b", [1], queue="known"),
            Job.create("a.b", [2], queue="nowhere"),
            Job.create("a.b", [3], queue="known"),
        ]
        results = client.enqueue_many(jobs)
        assert [r.ok for r in results] == [True, False, True]
        assert isinstance(results[1].error, UnroutableError)
        assert results[1].error.job_id == jobs[1].id
        assert results[1].error.routing_key == "nowhere"
        # No stray error on the next publish on the same channel.
        assert client.enqueue("a.b", [4], queue="known").queue == "known"
        with pytest.raises(UnroutableError):
            client.enqueue("a.b", [5], queue="nowhere")
    assert message_count(amqp_url, names.job_queue("known")) == 3


def test_amqp_029_backpressure_arguments(client, management, names):
    client.declare_queue("bounded", max_length=1000, max_length_bytes=10_000_000, overflow="reject-publish")
    args = management.queue(names.job_queue("bounded"))["arguments"]
    assert args["x-max-length"] == 1000
    assert args["x-max-length-bytes"] == 10_000_000
    assert args["x-overflow"] == "reject-publish"
    assert args["x-dead-letter-exchange"] == names.dead_letter_exchange


def test_amqp_030_priority_queue(client, management, names):
    client.declare_queue("prio", max_priority=10)
    assert management.queue(names.job_queue("prio"))["arguments"]["x-max-priority"] == 10
    for priority in (-5, 0, 4, 50):
        _enqueue_one(client, queue="prio", priority=priority)
    received = get_messages(client.url, names.job_queue("prio"), 4)
    # Highest first; OJS priority is clamped to AMQP 0..9.
    assert [p.priority for _, p, _ in received] == [9, 4, 0, 0]


def test_amqp_031_entity_names(client, management, prefix):
    client.declare_queue("email")
    _enqueue_one(client)
    names = Names(prefix)
    assert names.job_queue("email") == f"{prefix}.ojs.queue.email"
    assert names.dead_letter_queue("email") == f"{prefix}.ojs.queue.dlx.email"
    assert names.retry_queue("email", 5000) == f"{prefix}.ojs.queue.retry.email.5000"
    assert names.control_queue("email") == f"{prefix}.ojs.queue.control.email"
    declared = {q["name"] for q in management.queues(prefix=prefix + ".")}
    # The control stream is declared with its job queue (DESIGN §14).
    assert declared == {
        f"{prefix}.ojs.queue.email",
        f"{prefix}.ojs.queue.dlx.email",
        f"{prefix}.ojs.queue.control.email",
    }
    exchanges = {e["name"] for e in management.exchanges(prefix=prefix + ".")}
    assert exchanges == {f"{prefix}.ojs.exchange.direct", f"{prefix}.ojs.exchange.dlx", f"{prefix}.ojs.exchange.retry"}


def test_amqp_031_unprefixed_names_are_the_spec_names(amqp_url, management):
    queue = f"conf-{uuid.uuid4().hex[:12]}"
    with Client(amqp_url) as client:
        try:
            _enqueue_one(client, queue=queue)
            assert management.queue(f"ojs.queue.{queue}") is not None
            assert management.queue(f"ojs.queue.dlx.{queue}") is not None
            assert management.exchange("ojs.exchange.direct")["type"] == "direct"
        finally:
            management.delete_queue(f"ojs.queue.{queue}")
            management.delete_queue(f"ojs.queue.dlx.{queue}")
            management.delete_queue(f"ojs.queue.control.{queue}")


def test_amqp_032_quorum_queues(client, management, names):
    client.declare_queue("durable", queue_type="quorum")
    assert management.queue(names.job_queue("durable"))["type"] == "quorum"
    assert management.queue(names.dead_letter_queue("durable"))["type"] == "quorum"
    job = _enqueue_one(client, queue="durable")
    [(_, properties, _)] = get_messages(client.url, names.job_queue("durable"), 1)
    assert properties.message_id == job.id


def test_foreign_queue_with_max_priority_still_receives_jobs(amqp_url, prefix, names, caplog):
    """Seed 001 §15.1 declares ojs.queue.email with x-max-priority 10 before we start."""
    with raw_channel(amqp_url) as channel:
        channel.exchange_declare(names.direct_exchange, exchange_type="direct", durable=True)
        channel.exchange_declare(names.dead_letter_exchange, exchange_type="direct", durable=True)
        channel.queue_declare(
            names.job_queue("email"),
            durable=True,
            arguments={
                "x-dead-letter-exchange": names.dead_letter_exchange,
                "x-dead-letter-routing-key": "email",
                "x-max-priority": 10,
            },
        )
        channel.queue_bind(names.job_queue("email"), names.direct_exchange, routing_key="email")
    with Client(amqp_url, prefix=prefix) as client:
        job = _enqueue_one(client)
        [conflict] = client.topology.conflicts
        assert conflict.entity == names.job_queue("email")
        assert [d.argument for d in conflict.differences] == ["x-max-priority"]
        assert "x-max-priority" in caplog.text
        again = _enqueue_one(client)  # cached: no second conflict
        assert len(client.topology.conflicts) == 1
    received = get_messages(amqp_url, names.job_queue("email"), 2)
    assert [p.message_id for _, p, _ in received] == [job.id, again.id]


def test_conflict_raises_when_asked(amqp_url, prefix, names):
    from ojs_kombu import TopologyConflictError

    with Client(amqp_url, prefix=prefix, queue_options=QueueOptions(max_priority=5)) as client:
        client.declare_queue("email")
    with Client(amqp_url, prefix=prefix, on_conflict="raise") as client:
        with pytest.raises(TopologyConflictError) as info:
            client.declare_queue("email")
        assert info.value.differences[0].argument == "x-max-priority"
        assert "x-max-priority" in str(info.value)
