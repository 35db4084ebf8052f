"""Quorum queues end to end on the 3-node cluster (issue 13, "Show"): ``ojs_kombu`` Client and Worker.

The shared node's quorum tests (``tests/broker/test_quorum.py``) run again here, on the
cluster's first node: every entity of a queue that saw a retry, a scheduled job and a
dead letter is a quorum queue with the documented arguments (management API) and has a
member on all three nodes; retries, scheduling and dead-lettering work through them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from quorum_fixtures import amqp_url, assert_replicated, management  # noqa: F401 - fixtures; first: sys.path

# isort: split
import test_quorum as shared

from ojs_kombu import Worker
from ojs_kombu.policy.schedule import LEVELS

pytestmark = pytest.mark.broker

client = shared.client  # a quorum Client, on the cluster
test_terminal_failure_is_a_nack_into_the_dlq = shared.test_terminal_failure_is_a_nack_into_the_dlq
test_exponential_retry_through_retry_queues = shared.test_exponential_retry_through_retry_queues
test_scheduled_job_not_delivered_before_its_time = shared.test_scheduled_job_not_delivered_before_its_time


@pytest.fixture
def worker_factory(amqp_url: str, prefix: str) -> Iterator[Callable[..., Worker]]:  # noqa: F811
    """Quorum Workers on the cluster (as ``tests/broker/conftest.py``'s, which this directory cannot see)."""
    workers: list[Worker] = []

    def make(queues: tuple[str, ...] = ("default",), **options: Any) -> Worker:
        options.setdefault("grace_period", 5)
        worker = Worker(amqp_url, queues=queues, prefix=prefix, queue_type="quorum", **options)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.stop(timeout=5)


def test_every_entity_is_quorum_and_replicated_on_the_three_nodes(cluster, client, worker_factory, management, names):  # noqa: F811
    shared.test_every_entity_a_job_passes_through_is_quorum(client, worker_factory, management, names)
    for name in (
        names.job_queue("default"),
        names.dead_letter_queue("default"),
        names.retry_queue("default", 200),
        *(names.schedule_queue(level) for level in range(LEVELS)),
    ):
        assert_replicated(cluster, management, name)
