"""Shared fixtures: a real RabbitMQ broker, a unique entity prefix per test, cleanup.

The broker is ``$OJS_AMQP_URL`` when set; otherwise a Docker container when a
Docker engine answers; otherwise a private RabbitMQ node started for this test
session (see :mod:`ojs_kombu.testing.broker`).  Every test that declares
entities does so under its own prefix, and everything under that prefix is
deleted after the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ojs_kombu import Client, Names
from ojs_kombu.testing.broker import BrokerHandle, provision_broker
from ojs_kombu.testing.management import ManagementClient


def pytest_collection_modifyitems(items):
    for item in items:
        if "broker" in item.fixturenames or any(
            f in item.fixturenames for f in ("amqp_url", "management", "client", "prefix")
        ):
            item.add_marker(pytest.mark.broker)


@pytest.fixture(scope="session")
def broker() -> Iterator[BrokerHandle]:
    """The broker for this test session."""
    with provision_broker() as handle:
        yield handle


@pytest.fixture(scope="session")
def amqp_url(broker: BrokerHandle) -> str:
    """The AMQP URL of the session's broker."""
    return broker.url


@pytest.fixture(scope="session")
def management(broker: BrokerHandle) -> ManagementClient:
    """A client of the broker's management HTTP API."""
    if not broker.management_url:
        pytest.fail("the broker has no management API; set OJS_MANAGEMENT_URL")
    return ManagementClient(broker.management_url, broker.management_user, broker.management_password)


@pytest.fixture
def prefix(management: ManagementClient) -> Iterator[str]:
    """A unique entity prefix for one test; everything under it is deleted afterwards."""
    value = f"t{uuid.uuid4().hex[:12]}"
    yield value
    management.delete_by_prefix(value + ".")


@pytest.fixture
def names(prefix: str) -> Names:
    """The entity names under the test's prefix."""
    return Names(prefix)


@pytest.fixture
def client(amqp_url: str, prefix: str) -> Iterator[Client]:
    """A Client on the session's broker, under the test's prefix."""
    with Client(amqp_url, prefix=prefix) as c:
        yield c
