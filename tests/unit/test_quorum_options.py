"""Quorum queue options: the arguments of every entity, what is refused, the option paths (no broker)."""

from __future__ import annotations

import pytest

from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import ValidationError
from ojs_kombu.model.naming import Names
from ojs_kombu.policy.schedule import Cascade
from ojs_kombu.transport.settings import Settings
from ojs_kombu.wire.entities import (
    DEAD_LETTER_DELIVERY_LIMIT,
    DEFAULT_DELIVERY_LIMIT,
    QUORUM_ARGUMENTS,
    QueueOptions,
    QueueSpec,
)

QUORUM = QueueOptions(queue_type="quorum")


def test_quorum_job_queue_arguments():
    assert QUORUM.arguments() == {**QUORUM_ARGUMENTS, "x-delivery-limit": DEFAULT_DELIVERY_LIMIT}
    assert QUORUM_ARGUMENTS == {
        "x-queue-type": "quorum",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    assert QueueOptions(queue_type="quorum", delivery_limit=5).arguments()["x-delivery-limit"] == 5
    assert QueueOptions(queue_type="classic").arguments() == {"x-queue-type": "classic"}
    assert QueueOptions().arguments() == {}


@pytest.mark.parametrize(
    "options,field",
    [
        ({"max_priority": 10}, "max_priority"),
        ({"overflow": "drop-head"}, "overflow"),
        ({"overflow": "reject-publish-dlx"}, "overflow"),
        ({"delivery_limit": -1}, "delivery_limit"),
        ({"delay_queue_type": "classic"}, "delay_queue_type"),
    ],
)
def test_quorum_refusals(options, field):
    with pytest.raises(ValidationError) as raised:
        QueueOptions(queue_type="quorum", **options)
    assert raised.value.field == field


def test_delivery_limit_is_for_quorum_only():
    with pytest.raises(ValidationError, match="quorum"):
        QueueOptions(delivery_limit=3)


def test_with_queue_type():
    base = QueueOptions(max_length=10)
    assert base.with_queue_type(None) is base
    assert base.with_queue_type("quorum") == QueueOptions(max_length=10, queue_type="quorum")
    with pytest.raises(ValidationError):
        QueueOptions(max_priority=10).with_queue_type("quorum")


def test_every_entity_of_a_quorum_topology():
    names = Names("p")
    topology = Topology(names, queue_options=QUORUM)
    assert topology.dead_letter_queue_arguments("q") == {
        **QUORUM_ARGUMENTS,
        "x-delivery-limit": DEAD_LETTER_DELIVERY_LIMIT,
    }
    [retry] = [s for s in topology.retry_queue_specs("q", 1500) if isinstance(s, QueueSpec)]
    assert retry.argument_dict == {
        **QUORUM_ARGUMENTS,
        "x-dead-letter-exchange": names.direct_exchange,
        "x-dead-letter-routing-key": "q",
        "x-message-ttl": 1500,
    }
    levels = [s for s in Cascade(names).specs("quorum") if isinstance(s, QueueSpec)]
    assert len(levels) == 35
    for level, spec in enumerate(levels):
        assert spec.argument_dict == {
            **QUORUM_ARGUMENTS,
            "x-dead-letter-exchange": names.schedule_exchange(level - 1) if level else names.schedule_delivery_exchange,
            "x-message-ttl": 2**level,
        }


def test_a_classic_topology_waits_in_quorum_queues():
    """Classic job queue and DLQ; retry queues and cascade levels quorum with at-least-once hops (the default)."""
    names = Names("p")
    topology = Topology(names)
    assert topology.job_queue_arguments("q") == {
        "x-dead-letter-exchange": names.dead_letter_exchange,
        "x-dead-letter-routing-key": "q",
    }
    assert topology.dead_letter_queue_arguments("q") == {}
    [retry] = [s for s in topology.retry_queue_specs("q", 10) if isinstance(s, QueueSpec)]
    assert retry.argument_dict == {
        **QUORUM_ARGUMENTS,
        "x-dead-letter-exchange": names.direct_exchange,
        "x-dead-letter-routing-key": "q",
        "x-message-ttl": 10,
    }
    assert QueueOptions().delay_type == QueueOptions(queue_type="classic").delay_type == "quorum"
    assert QueueOptions(queue_type="quorum", delay_queue_type=None).delay_type == "quorum"
    assert QueueOptions(queue_type="classic", delay_queue_type=None).delay_type == "classic"
    with pytest.raises(ValidationError) as raised:
        QueueOptions(delay_queue_type="mirrored")  # type: ignore[arg-type]
    assert raised.value.field == "delay_queue_type"


def test_delay_queue_type_none_is_the_topology_of_before():
    names = Names("p")
    topology = Topology(names, queue_options=QueueOptions(delay_queue_type=None))
    assert topology.dead_letter_queue_arguments("q") == {}
    [retry] = [s for s in topology.retry_queue_specs("q", 10) if isinstance(s, QueueSpec)]
    assert "x-queue-type" not in retry.argument_dict
    levels = [s for s in Cascade(names).specs() if isinstance(s, QueueSpec)]
    assert all(set(s.argument_dict) == {"x-dead-letter-exchange", "x-message-ttl"} for s in levels)


def test_transport_options():
    assert Settings.from_options({"queue_type": "quorum"}).queue_options == QUORUM
    settings = Settings.from_options({"queue_options": {"max_length": 5}, "queue_type": "quorum"})
    assert settings.queue_options == QueueOptions(max_length=5, queue_type="quorum")
    options = Settings.from_options({}).options_with({"x-queue-type": "quorum", "x-delivery-limit": 7})
    assert options == QueueOptions(queue_type="quorum", delivery_limit=7)
    legacy = Settings.from_options({"queue_options": {"delay_queue_type": None}})
    assert legacy.options_with({"x-max-priority": 10}) == QueueOptions(max_priority=10, delay_queue_type=None)
    with pytest.raises(ValidationError):
        Settings.from_options({"queue_type": "mirrored"})


def test_consumer_timeout_option():
    """x-consumer-timeout (ms), on any queue type; from QueueOptions and from a framework's queue arguments."""
    assert QueueOptions(consumer_timeout=3_600_000).arguments() == {"x-consumer-timeout": 3_600_000}
    assert QueueOptions(queue_type="quorum", consumer_timeout=60_000).arguments()["x-consumer-timeout"] == 60_000
    assert Settings.from_options({}).options_with({"x-consumer-timeout": 90_000}) == QueueOptions(
        consumer_timeout=90_000
    )
    for bad in (-1, 1.5, True, "1h"):
        with pytest.raises(ValidationError):
            QueueOptions(consumer_timeout=bad)  # type: ignore[arg-type]


def test_consumer_disconnected_timeout_option():
    """x-consumer-disconnected-timeout (ms) on quorum job queues; from QueueOptions and a framework's queue arguments."""
    options = QueueOptions(queue_type="quorum", consumer_disconnected_timeout=5_000)
    assert options.arguments()["x-consumer-disconnected-timeout"] == 5_000
    assert "x-consumer-disconnected-timeout" not in QueueOptions(queue_type="quorum").arguments()
    assert Settings.from_options({}).options_with(
        {"x-queue-type": "quorum", "x-consumer-disconnected-timeout": 9_000}
    ) == QueueOptions(queue_type="quorum", consumer_disconnected_timeout=9_000)
    with pytest.raises(ValidationError, match="quorum queues only"):
        QueueOptions(consumer_disconnected_timeout=5_000)
    for bad in (-1, 1.5, True, "10s"):
        with pytest.raises(ValidationError):
            QueueOptions(queue_type="quorum", consumer_disconnected_timeout=bad)  # type: ignore[arg-type]
