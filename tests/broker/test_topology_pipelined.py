"""``Topology.declare`` sends a batch of declarations before it reads their replies (one round
trip, not one per entity); a conflict in the middle of the batch is still found on its entity.

RabbitMQ closes the channel on the 406 and discards what was sent after it, so the topology
handles the conflict as one at a time would (raise, or use the existing entity) and declares
the rest of the batch on a fresh channel.
"""

from __future__ import annotations

import kombu
import pytest
from support import raw_channel

from ojs_kombu import TopologyConflictError
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.model.naming import Names
from ojs_kombu.policy.schedule import Cascade
from ojs_kombu.wire.entities import QueueOptions


def _existing_level(amqp_url: str, names: Names, level: int) -> None:
    """A scheduling level's queue that exists with another TTL (same type and dead-letter exchange)."""
    cascade = Cascade(names)
    with raw_channel(amqp_url) as channel:
        arguments = dict(cascade.level_arguments(level, QueueOptions().delay_type))
        channel.queue_declare(cascade.queue(level), durable=True, arguments={**arguments, "x-message-ttl": 7})


def test_a_conflict_mid_batch_is_used_as_it_is_and_the_rest_is_declared(amqp_url, names, management):
    _existing_level(amqp_url, names, 5)
    topology = Topology(names)
    cascade = Cascade(names)
    with kombu.Connection(amqp_url) as conn:
        topology.ensure_scheduling(conn.connection, "default", cascade)
        channels_open = [number for number, c in conn.connection.channels.items() if number and c.is_open]
    [conflict] = topology.conflicts
    assert conflict.entity == cascade.queue(5)
    assert [d.argument for d in conflict.differences] == ["x-message-ttl"]
    for level in (4, 6, cascade.levels - 1):  # before and after the conflicting one
        assert management.queue(cascade.queue(level))["arguments"]["x-message-ttl"] == 2**level
    bindings = management.bindings(source=cascade.exchange(cascade.levels - 1), destination=cascade.queue(34))
    assert [b["routing_key"] for b in bindings] == ["bit:34"]
    assert management.bindings(source=cascade.delivery_exchange, destination=names.job_queue("default"))
    assert management.queue(cascade.queue(5))["arguments"]["x-message-ttl"] == 7  # used as it is
    assert channels_open == []  # the channel py-amqp reopened after the 406 was closed, not leaked


def test_a_conflict_mid_batch_raises_naming_its_entity_and_declares_nothing_after_it(amqp_url, names, management):
    _existing_level(amqp_url, names, 5)
    topology = Topology(names, on_conflict="raise")
    cascade = Cascade(names)
    with kombu.Connection(amqp_url) as conn:
        with pytest.raises(TopologyConflictError) as raised:
            topology.ensure_scheduling(conn.connection, "default", cascade)
    assert raised.value.entity == cascade.queue(5)
    assert management.queue(cascade.queue(4)) is not None
    assert management.queue(cascade.queue(6)) is None  # sent after the 406: discarded by the broker
    assert cascade.queue(6) not in topology.declared_queues()
