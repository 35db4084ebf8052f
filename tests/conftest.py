"""Shared fixtures: a real RabbitMQ broker, a unique entity prefix per test, cleanup.

The broker is ``$OJS_AMQP_URL`` when set; otherwise a Docker container when a
Docker engine answers; otherwise a private RabbitMQ node started for this test
session (see :mod:`ojs_kombu.testing.broker`) of release ``$OJS_RABBITMQ`` (default
4.3; the ``node`` and ``cluster`` fixtures start that release too).  Every test that declares
entities does so under its own prefix, and everything under that prefix is
deleted after the test.  Tests that need a node of their own (users, virtual
hosts, restarts) use the module-scoped ``node`` fixture.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import support

from ojs_kombu import Client, Names
from ojs_kombu.amqp.management import ManagementClient
from ojs_kombu.testing.broker import BrokerError, BrokerHandle, PrivateNode, provision_broker
from ojs_kombu.testing.cluster import Cluster


def pytest_collection_modifyitems(items):
    for item in items:
        if "broker" in item.fixturenames or any(
            f in item.fixturenames for f in ("amqp_url", "management", "client", "prefix", "node")
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


@pytest.fixture(scope="session")
def rabbitmq_version(management: ManagementClient) -> tuple[int, ...]:
    """The session broker's RabbitMQ version, e.g. ``(4, 3, 6)``: for tests whose expectation depends on it."""
    return support.rabbitmq_version(management)


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


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateNode]:
    """A private RabbitMQ node for one test module (its own users, virtual hosts, restarts).

    A node that cannot be started fails the test: RabbitMQ is installed on every
    machine these tests run on (``make setup``), so it is never a reason to skip.
    """
    try:
        private = PrivateNode(tmp_path_factory.mktemp("rabbitmq"))
    except BrokerError as exc:  # rabbitmq-server is not installed
        pytest.fail(f"could not set up a private RabbitMQ node: {exc}")
    try:
        private.start()
    except BrokerError as exc:
        private.cleanup()  # a half-started VM must not outlive the test session
        pytest.fail(f"could not start a private RabbitMQ node: {exc}")
    try:
        yield private
    finally:
        private.cleanup()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A local 3-node RabbitMQ cluster of private nodes for the session (failover tests).

    Tests that :meth:`~Cluster.kill` a node must :meth:`~Cluster.restart` it before they end.
    A cluster that cannot be started fails the test, like the ``node`` fixture.
    """
    try:
        formed = Cluster(3, tmp_path_factory.mktemp("cluster"))
    except BrokerError as exc:
        pytest.fail(f"could not set up a private RabbitMQ cluster: {exc}")
    try:
        formed.start()
    except BrokerError as exc:
        formed.cleanup()
        pytest.fail(f"could not start a private RabbitMQ cluster: {exc}")
    try:
        yield formed
    finally:
        formed.cleanup()
