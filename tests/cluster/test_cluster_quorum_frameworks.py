"""A Celery worker and a Dramatiq worker on the 3-node cluster with quorum queues (issue 13, "Show").

Their quorum tests of the shared node (``tests/celery/test_celery_quorum.py``,
``tests/dramatiq/test_dramatiq_quorum.py``: retries, countdown / delay and the dead-letter
path, Celery's native delayed delivery left off) run again here on the cluster's first node.
The Celery tests ask for ``worker_factory`` (an in-thread Celery worker) and the Dramatiq
tests for ``start_worker``, so both live in one module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import dramatiq
import pytest
from frameworks import dramatiq_worker_starter, global_ojs_broker, running_worker
from quorum_fixtures import amqp_url, assert_replicated, management  # noqa: F401 - fixtures; first: sys.path

# isort: split
import test_celery_quorum as celery_quorum
import test_dramatiq_quorum as dramatiq_quorum

from ojs_dramatiq import OjsBroker

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]

celery_app = celery_quorum.celery_app  # task_queues with x-queue-type=quorum, on the cluster


@pytest.fixture
def worker_factory():
    """``with worker_factory(app): ...``: an in-thread Celery worker (as ``tests/celery/conftest.py``'s)."""
    return running_worker


@pytest.fixture
def ojs_broker(amqp_url: str, prefix: str) -> Iterator[OjsBroker]:  # noqa: F811
    """``OjsBroker(queue_type="quorum")`` on the cluster, the global broker."""
    with global_ojs_broker(amqp_url, prefix, queue_type="quorum") as broker:
        yield broker


@pytest.fixture
def start_worker(ojs_broker: OjsBroker) -> Iterator[Callable[..., dramatiq.Worker]]:
    """Started ``dramatiq.Worker``s (as ``tests/dramatiq/conftest.py``'s), stopped after the test."""
    with dramatiq_worker_starter(ojs_broker) as start:
        yield start


test_celery_self_retry_countdown = celery_quorum.test_self_retry_countdown_goes_through_the_retry_queue
test_celery_exhausted_retries_dead_letter = celery_quorum.test_exhausted_retries_go_to_the_dead_letter_queue
test_celery_countdown_through_the_cascade = celery_quorum.test_countdown_is_never_early_and_nothing_waits_unacked
test_dramatiq_retries = dramatiq_quorum.test_retries_back_off_through_retry_queues
test_dramatiq_exhausted_retries_dead_letter = dramatiq_quorum.test_exhausted_retries_end_in_the_dead_letter_queue
test_dramatiq_delay_through_the_cascade = dramatiq_quorum.test_delayed_message_is_never_early_and_never_held_unacked


def test_celery_without_native_delayed_delivery(cluster, celery_app, worker_factory, management, names):  # noqa: F811
    celery_quorum.test_quorum_task_queue_without_celery_native_delayed_delivery(
        celery_app, worker_factory, management, names
    )
    for name in (names.job_queue("celery"), names.dead_letter_queue("celery"), names.schedule_queue(0)):
        assert_replicated(cluster, management, name)


def test_dramatiq_every_entity_is_quorum_and_replicated(cluster, ojs_broker, start_worker, management, names):  # noqa: F811
    dramatiq_quorum.test_every_entity_of_a_quorum_broker_is_quorum(ojs_broker, start_worker, management, names)
    for name in (names.job_queue("qq"), names.dead_letter_queue("qq"), names.schedule_queue(0)):
        assert_replicated(cluster, management, name)
