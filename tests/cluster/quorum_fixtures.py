"""Fixtures that run the shared node's quorum tests again on the session's 3-node cluster.

A cluster test module imports ``amqp_url`` and ``management`` from here: the tests'
``prefix`` (and its cleanup), ``client`` and the framework apps then live on the
cluster, reached through its first node.  The test modules of ``tests/broker``,
``tests/celery`` and ``tests/dramatiq`` become importable, so that their test
functions are collected again here instead of being copied.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from ojs_kombu.testing.cluster import Cluster

TESTS = Path(__file__).resolve().parent.parent
for _directory in ("broker", "celery", "dramatiq"):
    if str(TESTS / _directory) not in sys.path:
        sys.path.append(str(TESTS / _directory))


@pytest.fixture
def amqp_url(cluster: Cluster) -> str:
    """The cluster's first node (quorum queues have members on all three)."""
    return cluster.nodes[0].url


@pytest.fixture
def management(cluster: Cluster) -> Any:
    """The cluster's management API."""
    return cluster.management()


def assert_replicated(cluster: Cluster, management: Any, name: str) -> None:
    """``name`` is a quorum queue with a member on every node of the cluster."""
    queue = management.queue(name)
    assert queue is not None and queue["type"] == "quorum", name
    assert sorted(queue["members"]) == sorted(node.name for node in cluster.nodes), name
