"""OjsBroker(deduplicate=True): a Dramatiq message delivered twice runs once (execution de-duplication, DESIGN §19)."""

from __future__ import annotations

import threading

import dramatiq
import pytest
from frameworks import dramatiq_worker, global_ojs_broker
from support import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("deduplicate", [True, False])
def test_a_message_sent_twice_runs_once_with_deduplicate(amqp_url, prefix, deduplicate):
    runs: list[str] = []
    lock = threading.Lock()
    with global_ojs_broker(amqp_url, prefix, deduplicate=deduplicate) as broker:

        @dramatiq.actor(queue_name="dedupe", max_retries=0)
        def work(n):
            with lock:
                runs.append(n)

        with dramatiq_worker(broker):
            message = work.send(1)
            wait_until(lambda: len(runs) == 1, timeout=20, message="the first delivery to run")
            broker.enqueue(message)  # the same message (same job id) again
            if deduplicate:
                wait_until(
                    lambda: broker.get_queue_message_counts("dedupe") == (0, 0, 0) and broker.in_flight("dedupe") == 0,
                    timeout=20,
                    message="the duplicate to be acked",
                )
                (consumer,) = broker._consumers["dedupe"]
                wait_until(lambda: consumer.settler.deduplicated == 1, timeout=10, message="counted")
                assert runs == [1]
            else:
                wait_until(lambda: len(runs) == 2, timeout=20, message="the duplicate to run")
