"""Queues that already exist with other arguments (DESIGN §4), against a real broker.

A job queue whose dead-letter arguments differ from the binding's (another exchange,
another routing key, or none at all) would drop every dead letter: it is refused with
``TopologyConflictError`` even with ``on_conflict="use-existing"``, also when RabbitMQ's
reply names another differing argument first.  Other differences keep the passive
fallback, and each conflicting entity is recorded once however often it is re-declared.
"""

from __future__ import annotations

from typing import Any

import pytest
from support import get_messages, message_count, raw_channel

from ojs_kombu import Client, EventsOptions, Names, TopologyConflictError
from ojs_kombu.wire.control import ControlOptions
from ojs_kombu.wire.entities import normalise_arguments


def _existing_job_queue(amqp_url: str, names: Names, queue: str, arguments: dict[str, Any]) -> None:
    """``ojs.queue.{queue}`` as another producer declared it, bound as the binding says."""
    with raw_channel(amqp_url) as channel:
        channel.exchange_declare(names.direct_exchange, exchange_type="direct", durable=True)
        channel.queue_declare(names.job_queue(queue), durable=True, arguments=arguments)
        channel.queue_bind(names.job_queue(queue), names.direct_exchange, routing_key=queue)


def _dead_letter_arguments(names: Names, queue: str) -> dict[str, Any]:
    return {"x-dead-letter-exchange": names.dead_letter_exchange, "x-dead-letter-routing-key": queue}


@pytest.mark.parametrize(
    "arguments,named",
    [
        pytest.param(
            {"x-dead-letter-exchange": "elsewhere", "x-dead-letter-routing-key": "email"},
            ["x-dead-letter-exchange"],
            id="other-exchange",
        ),
        pytest.param(None, ["x-dead-letter-routing-key"], id="other-routing-key"),
        pytest.param({}, ["x-dead-letter-exchange", "x-dead-letter-routing-key"], id="no-dead-letter-arguments"),
        pytest.param(
            {"x-message-ttl": 60000},
            ["x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key"],
            id="hidden-behind-a-ttl",
        ),
    ],
)
def test_differing_dead_letter_arguments_are_refused_even_with_use_existing(amqp_url, prefix, names, arguments, named):
    if arguments is None:
        arguments = {"x-dead-letter-exchange": names.dead_letter_exchange, "x-dead-letter-routing-key": "other"}
    _existing_job_queue(amqp_url, names, "email", arguments)
    with Client(amqp_url, prefix=prefix, on_conflict="use-existing") as client:
        with pytest.raises(TopologyConflictError) as info:
            client.enqueue("email.send", ["a@example.com"], queue="email")
        assert info.value.entity == names.job_queue("email")
        assert [d.argument for d in info.value.differences] == named
        assert "dead letters" in str(info.value)
        with pytest.raises(TopologyConflictError):  # not cached as declared: refused again
            client.declare_queue("email")
        assert len(client.topology.conflicts) == 1
    assert message_count(amqp_url, names.job_queue("email")) == 0  # nothing was published into it


def test_other_differing_arguments_keep_the_passive_fallback(amqp_url, prefix, names, management):
    # RabbitMQ names x-message-ttl first; the probe finds x-max-priority too, and no dead-letter difference.
    arguments = {**_dead_letter_arguments(names, "email"), "x-message-ttl": 60000, "x-max-priority": 10}
    _existing_job_queue(amqp_url, names, "email", arguments)
    with Client(amqp_url, prefix=prefix) as client:
        job = client.enqueue("email.send", ["a@example.com"], queue="email")
        [conflict] = client.topology.conflicts
        assert sorted(d.argument for d in conflict.differences) == ["x-max-priority", "x-message-ttl"]
    [(_, properties, _)] = get_messages(amqp_url, names.job_queue("email"), 1)
    assert properties.message_id == job.id
    # Probing declared only what exists: the queue kept its arguments (RabbitMQ 4.x lists its type too).
    assert normalise_arguments(management.queue(names.job_queue("email"))["arguments"]) == normalise_arguments(
        arguments
    )


def test_redeclaring_a_conflicting_queue_keeps_one_record(amqp_url, prefix, names):
    _existing_job_queue(amqp_url, names, "email", {**_dead_letter_arguments(names, "email"), "x-max-priority": 10})
    with Client(amqp_url, prefix=prefix) as client:
        for _ in range(5):
            client.declare_queue("email")
        [conflict] = client.topology.conflicts
        assert conflict.entity == names.job_queue("email")
        assert [d.argument for d in conflict.differences] == ["x-max-priority"]


@pytest.mark.parametrize(
    "stream,arguments",
    [
        pytest.param("events", {**EventsOptions().arguments(), "x-max-age": "60m"}, id="events-60m-for-1h"),
        pytest.param("control", {**ControlOptions().arguments(), "x-max-age": "9600h"}, id="control-9600h-for-400D"),
    ],
)
def test_a_stream_that_differs_only_in_form_is_used_without_a_conflict(
    amqp_url, prefix, names, management, stream, arguments
):
    """RabbitMQ 4.3 accepts an ``x-max-age`` of the same length in another unit; 3.10 and 4.0 refuse it
    (406), and the topology finds that it means the same: no conflict, no degraded plane, on every version."""
    name = names.events_stream if stream == "events" else names.control_queue("default")
    with raw_channel(amqp_url) as channel:
        channel.queue_declare(name, durable=True, arguments=arguments)
    with Client(amqp_url, prefix=prefix, on_conflict="raise") as client:
        if stream == "events":
            assert client.workers() == []
            assert client.topology.events_is_stream()
        else:
            client.declare_queue("default")
            assert client.topology.control_is_stream("default")
        assert client.topology.conflicts == []
    assert management.queue(name)["arguments"]["x-max-age"] == arguments["x-max-age"]  # never re-declared


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_consumer_timeout_is_declared_on_the_job_queue(amqp_url, prefix, names, management, queue_type):
    """``consumer_timeout`` reaches the broker as ``x-consumer-timeout`` (RabbitMQ 3.12+ enforces it; 3.10 keeps it)."""
    with Client(amqp_url, prefix=prefix) as client:
        client.declare_queue("long", queue_type=queue_type, consumer_timeout=7_200_000)
        try:
            declared = management.queue(names.job_queue("long"))
            assert declared["arguments"]["x-consumer-timeout"] == 7_200_000
            assert declared["type"] == queue_type
        finally:
            client.teardown()
