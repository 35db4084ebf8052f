"""The RabbitMQ version of a connection's broker, from its server properties (pure logic)."""

from __future__ import annotations

import pytest

from ojs_kombu.amqp.version import parse_version, rabbitmq_version


class _Connection:
    def __init__(self, properties):
        self.server_properties = properties


@pytest.mark.parametrize(
    "properties,version",
    [
        ({"product": "RabbitMQ", "version": "4.3.6"}, (4, 3, 6)),
        ({"product": b"RabbitMQ", "version": b"3.10.8"}, (3, 10, 8)),
        ({"product": "RabbitMQ", "version": "4.0.0-rc.1"}, (4, 0, 0)),
        ({"product": "RabbitMQ", "version": "4.2"}, (4, 2, 0)),
        ({"product": "RabbitMQ", "version": "unknown"}, None),
        ({"product": "LavinMQ", "version": "2.1.0"}, None),  # not RabbitMQ: its numbers mean something else
        ({}, None),
    ],
)
def test_rabbitmq_version_reads_the_server_properties(properties, version):
    assert rabbitmq_version(_Connection(properties)) == version


def test_parse_version():
    assert parse_version("4.3.6") == (4, 3, 6) >= (4, 3)
    assert parse_version(None) is None
