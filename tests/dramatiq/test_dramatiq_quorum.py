"""The Dramatiq adapter with quorum queues: ``OjsBroker(queue_type="quorum")`` (docs/cluster.md).

The retry, dead-letter and delay tests of ``test_dramatiq_worker`` run again here on a
quorum broker (the module overrides ``ojs_broker``); on the 3-node cluster:
``tests/cluster/test_quorum.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import dramatiq
import pytest
import test_dramatiq_worker as worker_tests
from frameworks import global_ojs_broker
from support import wait_until

from ojs_dramatiq import OjsBroker
from ojs_kombu.errors import ValidationError
from ojs_kombu.wire.entities import QUORUM_ARGUMENTS

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ojs_broker(amqp_url: str, prefix: str) -> Iterator[OjsBroker]:
    """The worker tests' broker, with quorum queues."""
    with global_ojs_broker(amqp_url, prefix, queue_type="quorum") as broker:
        yield broker


test_retries_back_off_through_retry_queues = worker_tests.test_retries_back_off_through_retry_queues
test_exhausted_retries_end_in_the_dead_letter_queue = worker_tests.test_exhausted_retries_end_in_the_dead_letter_queue
test_delayed_message_is_never_early_and_never_held_unacked = (
    worker_tests.test_delayed_message_is_never_early_and_never_held_unacked
)


def test_every_entity_of_a_quorum_broker_is_quorum(ojs_broker, start_worker, management, names):
    ran = []

    @dramatiq.actor(queue_name="qq", max_retries=1, min_backoff=100, max_backoff=100)
    def flaky(n):
        ran.append(n)
        raise RuntimeError("always")

    start_worker()
    flaky.send_with_options(args=(1,), delay=500)
    wait_until(lambda: len(ran) == 2, 20, message="two attempts")
    wait_until(lambda: ojs_broker.get_queue_message_counts("qq") == (0, 0, 1), 20, message="the dead letter")
    retry_queues = management.queues(names.retry_queue("qq", 0)[:-1])
    assert retry_queues
    for queue in [
        management.queue(names.job_queue("qq")),
        management.queue(names.dead_letter_queue("qq")),
        management.queue(names.schedule_queue(0)),
        *retry_queues,
    ]:
        assert queue["type"] == "quorum", queue["name"]
        assert {k: queue["arguments"].get(k) for k in QUORUM_ARGUMENTS} == QUORUM_ARGUMENTS, queue["name"]


def test_max_priority_with_quorum_is_refused(amqp_url, prefix):
    with pytest.raises(ValidationError, match="x-max-priority"):
        OjsBroker(amqp_url, prefix=prefix, queue_type="quorum", max_priority=10)
