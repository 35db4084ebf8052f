"""Queues that already exist with other arguments (DESIGN §4), against a real broker.

A job queue whose dead-letter arguments differ from the binding's (another exchange,
another routing key, or none at all) would drop every dead letter: it is refused with
``TopologyConflictError`` even with ``on_conflict="use-existing"``, also when RabbitMQ's
reply names another differing argument first.  Other differences keep the passive
fallback, and each conflicting entity is recorded once however often it is re-declared.
"""

from __future__ import annotations

import logging
from typing import Any

import kombu
import pytest
from support import get_messages, message_count, raw_channel

from ojs_kombu import (
    Client,
    EventsOptions,
    Names,
    QueueArgumentRefusedError,
    QueueOptions,
    TopologyConflictError,
    WorkerError,
)
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


def test_a_conflicting_queue_is_declared_once_warned_once_and_recorded_once(amqp_url, prefix, names, caplog):
    _existing_job_queue(amqp_url, names, "email", {**_dead_letter_arguments(names, "email"), "x-max-priority": 10})
    caplog.set_level(logging.DEBUG, logger="ojs_kombu.amqp.topology")
    with Client(amqp_url, prefix=prefix) as client:
        for _ in range(2):  # the second use finds it cached, like any declared entity: no declaration
            client.enqueue("email.send", ["a@example.com"], queue="email")
        for _ in range(3):  # forced re-declarations (as after a reconnect) find the same conflict again
            client.declare_queue("email")
        [conflict] = client.topology.conflicts
        assert conflict.entity == names.job_queue("email")
        assert [d.argument for d in conflict.differences] == ["x-max-priority"]
    logged = [r for r in caplog.records if r.name == "ojs_kombu.amqp.topology" and str(conflict) in r.getMessage()]
    assert [r.levelno for r in logged] == [logging.WARNING] + [logging.DEBUG] * 3
    assert message_count(amqp_url, names.job_queue("email")) == 2


def test_consumer_disconnected_timeout_is_declared_on_the_quorum_job_queue(amqp_url, prefix, names, management):
    """``consumer_disconnected_timeout`` reaches the broker as ``x-consumer-disconnected-timeout``
    (RabbitMQ 4.3 applies it; older brokers keep it and ignore it), on the job queue only."""
    with Client(amqp_url, prefix=prefix, queue_type="quorum") as client:
        client.declare_queue("crashy", queue_type="quorum", consumer_disconnected_timeout=5_000)
        try:
            declared = management.queue(names.job_queue("crashy"))
            assert declared["arguments"]["x-consumer-disconnected-timeout"] == 5_000
            dead_letters = management.queue(names.dead_letter_queue("crashy"))
            assert "x-consumer-disconnected-timeout" not in dead_letters["arguments"]
        finally:
            client.teardown()


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


def _consumer_timeout_refused(rabbitmq_version: tuple[int, ...], queue_type: str | None) -> bool:
    """Whether RabbitMQ refuses ``x-consumer-timeout`` on the job queue: 4.3.2+ on classic queues
    (rabbitmq-server#16557, #17144; 4.3.0 and 4.3.1 accepted and ignored it), which is also the
    type of a queue declared without one on this test broker."""
    return (4, 3, 2) <= rabbitmq_version < (4, 4) and queue_type != "quorum"


@pytest.mark.parametrize("queue_type", ["classic", "quorum", None])
def test_consumer_timeout_is_declared_on_the_job_queue_or_refused_with_what_to_do(
    amqp_url, prefix, names, management, rabbitmq_version, queue_type
):
    """``consumer_timeout`` reaches the broker as ``x-consumer-timeout`` (RabbitMQ 3.12 to 4.2 enforce it on
    every queue; 3.10 keeps it; 4.3 on quorum queues only).  RabbitMQ 4.3 refuses it on classic queues and has
    no consumer timeout for them: the Client says so with a typed error, before anything is sent when the
    declaration names the type."""
    with Client(amqp_url, prefix=prefix) as client:
        try:
            if _consumer_timeout_refused(rabbitmq_version, queue_type):
                with pytest.raises(QueueArgumentRefusedError) as refused:
                    client.declare_queue("long", queue_type=queue_type, consumer_timeout=7_200_000)
                error = refused.value
                assert (error.entity, error.argument, error.queue_type) == (
                    names.job_queue("long"),
                    "x-consumer-timeout",
                    "classic",
                )
                assert "queue_type='quorum'" in str(error)  # what to do instead
                assert management.queue(names.job_queue("long")) is None
                if queue_type == "classic":  # refused before any I/O: not even the exchanges were declared
                    assert error.reply_code == 0
                    assert management.exchanges(prefix + ".") == []
                else:  # the vhost's default type: the broker's own refusal, with the same error
                    assert error.reply_code == 406
                return
            client.declare_queue("long", queue_type=queue_type, consumer_timeout=7_200_000)
            declared = management.queue(names.job_queue("long"))
            assert declared["arguments"]["x-consumer-timeout"] == 7_200_000
            assert declared["type"] == (queue_type or "classic")
        finally:
            client.teardown()


def test_consumer_timeout_from_a_framework_queue_argument(amqp_url, prefix, names, management, rabbitmq_version):
    """Celery's ``queue_arguments={"x-consumer-timeout": ms}`` through the ``ojs://`` transport: the same
    declaration as ``QueueOptions.consumer_timeout``, and on RabbitMQ 4.3 the same typed error."""
    url = "ojs" + amqp_url[amqp_url.index("://") :]
    queue = kombu.Queue("long", durable=True, queue_arguments={"x-consumer-timeout": 7_200_000})
    with kombu.Connection(url, transport_options={"prefix": prefix}) as conn:
        if _consumer_timeout_refused(rabbitmq_version, None):
            with pytest.raises(QueueArgumentRefusedError) as refused:
                queue(conn.channel()).declare()
            assert refused.value.argument == "x-consumer-timeout" and refused.value.queue_type == "classic"
            assert management.queue(names.job_queue("long")) is None
            return
        queue(conn.channel()).declare()
    assert management.queue(names.job_queue("long"))["arguments"]["x-consumer-timeout"] == 7_200_000


def test_a_worker_with_a_consumer_timeout_on_a_classic_queue_of_rabbitmq_4_3_stops_with_the_typed_error(
    worker_factory, management, names, rabbitmq_version
):
    """Retrying cannot help (the error is a ``BrokerRefusedError``): the worker stops at once, not in a reconnect loop."""
    worker = worker_factory(
        queues=("long",), queue_options=QueueOptions(queue_type="classic", consumer_timeout=7_200_000)
    )
    worker.handler("x", lambda: None)
    worker.start()
    if not _consumer_timeout_refused(rabbitmq_version, "classic"):
        assert worker.wait_until_ready()
        assert management.queue(names.job_queue("long"))["arguments"]["x-consumer-timeout"] == 7_200_000
        return
    assert not worker.wait_until_ready(timeout=10)
    worker.stop(timeout=5)
    assert isinstance(worker.error, WorkerError)
    assert isinstance(worker.error.__cause__, QueueArgumentRefusedError)
    assert management.queue(names.job_queue("long")) is None
