"""A Worker and a Client whose first URL is a node cut off from the rest of the cluster move on.

With Khepri (the only metadata store of RabbitMQ 4.3; the default for new 4.2 clusters) a
declaration that writes metadata (a new queue, exchange or binding) needs a majority of nodes.
The first node is isolated from the other two at the Erlang distribution level
(:meth:`~ojs_kombu.testing.cluster.Cluster.isolate`): it keeps serving AMQP, while the two
others form the majority and elect the queues' new leaders.

What RabbitMQ 4.3.6 does on the minority node (measured): the connection opens, a passive or
repeated declaration of an existing queue answers at once, but a declaration of a new queue
waits for the metadata store and after 30 s closes the connection with ``541 INTERNAL_ERROR
... the metadata store operation timed out``; ``basic.consume`` and ``basic.get`` on a quorum
queue led across the partition wait 30 s too, then the connection is reset.  Either way the
library sees a connection error: the Worker's reconnect loop and the Client's retry move to the
next URL at once, so both land on the majority within that bound and the jobs run there.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from support import wait_until

from ojs_kombu import Client, Worker, current_job
from ojs_kombu.testing.cluster import Cluster
from ojs_kombu.wire.entities import QueueOptions

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]

QUEUE = "minority"
JOBS = 10
# RabbitMQ answers a metadata write on a minority node after 30 s (Khepri's command timeout);
# everything else is the library's: the reconnect and the declarations on the next node.
MINORITY_ANSWERS_WITHIN = 30.0
MARGIN = 15.0  # a loaded 2-core machine
DISCONNECTED_MS = 5000  # the job queue's x-consumer-disconnected-timeout, where a test sets it


def test_a_worker_and_a_client_whose_first_node_is_in_the_minority_run_jobs_on_the_majority(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    minority, *majority = cluster.nodes
    if not cluster.khepri_enabled(majority[0]):
        pytest.skip("Mnesia metadata store: declarations on a minority node do not wait for a majority")
    prefix = f"t{uuid.uuid4().hex[:8]}"
    urls = [minority.url] + [node.url for node in majority]
    ran: set[str] = set()
    lock = threading.Lock()
    caplog.set_level(logging.WARNING, logger="ojs_kombu")
    cluster.isolate(minority)
    worker = client = None
    try:
        worker = Worker(urls, prefix=prefix, queues=[QUEUE], queue_type="quorum", concurrency=4, grace_period=5)

        @worker.handler("minority.job")
        def job(_: int) -> None:
            with lock:
                ran.add(current_job().id)

        client = Client(urls, prefix=prefix, queue_type="quorum", publish_timeout=MINORITY_ANSWERS_WITHIN + MARGIN)
        started = time.monotonic()
        worker.start()  # its first connection goes to the minority node: it declares the new queues there
        enqueued = [client.enqueue("minority.job", [i], queue=QUEUE).id for i in range(JOBS)]
        first_enqueues = time.monotonic() - started
        assert worker.wait_until_ready(MINORITY_ANSWERS_WITHIN + MARGIN), "the worker never consumed"
        consuming_after = time.monotonic() - started
        wait_until(lambda: ran >= set(enqueued), timeout=30, message="every job to run on the majority")
        print(
            f"\nminority node: the Client's enqueues returned {first_enqueues:.1f}s after the start, the Worker "
            f"consumed on the majority {consuming_after:.1f}s after it ({worker.consumer.reconnections} reconnections)"
        )
        assert worker.error is None
        assert worker.consumer.reconnections >= 1
        assert first_enqueues < MINORITY_ANSWERS_WITHIN + MARGIN
        assert consuming_after < MINORITY_ANSWERS_WITHIN + MARGIN
        # What each met on the minority node: the broker's refusal, as a connection error it moved past.
        minority_port = f":{minority.amqp_port}/"
        met = [r.getMessage() for r in caplog.records if minority_port in r.getMessage() and "541" in r.getMessage()]
        assert any("consumer connection" in message for message in met), met
        assert any("connection to" in message and "retrying on" in message for message in met), met
    finally:
        if worker is not None:
            worker.stop(timeout=10)
        if client is not None:
            client.close()
        cluster.heal(minority)
        cluster.management().delete_by_prefix(prefix + ".")


def test_a_worker_consuming_on_a_node_that_falls_into_the_minority_moves_to_the_majority(cluster: Cluster) -> None:
    """The node goes on answering heartbeats, so the connection looks healthy; but nothing it
    takes is committed: the Worker's beacon sees its presences unconfirmed for ``confirm_timeout``
    (30 s by default) and moves itself and the consumer to the next node, where the jobs enqueued
    on the majority meanwhile run.  Without it the Worker stayed there and ran none of them."""
    minority, *majority = cluster.nodes
    if not cluster.khepri_enabled(majority[0]):
        pytest.skip("Mnesia metadata store: not the partition behaviour measured here")
    prefix = f"t{uuid.uuid4().hex[:8]}"
    ran: set[str] = set()
    lock = threading.Lock()
    # A job enqueued while the majority elects the queue's new leader can still be handed to the
    # consumer on the minority node, which then holds it for the queue's consumer-disconnected
    # timeout (RabbitMQ 4.3: 60 s by default; seen in 3 of 4 runs without the option, one job each).
    options = QueueOptions(queue_type="quorum", consumer_disconnected_timeout=DISCONNECTED_MS)
    worker = Worker(
        [minority.url] + [node.url for node in majority],
        prefix=prefix,
        queues=[QUEUE],
        queue_options=options,
        concurrency=4,
        grace_period=5,
    )

    @worker.handler("minority.job")
    def job(_: int) -> None:
        with lock:
            ran.add(current_job().id)

    client = Client([node.url for node in majority], prefix=prefix, queue_options=options)
    isolated = False
    try:
        worker.start()
        assert worker.wait_until_ready(30)
        first = client.enqueue("minority.job", [0], queue=QUEUE).id
        wait_until(lambda: first in ran, timeout=30, message="a job run before the partition")
        assert worker.consumer.reconnections == 0
        cluster.isolate(minority)
        isolated = True
        isolated_at = time.monotonic()
        enqueued = [client.enqueue("minority.job", [i], queue=QUEUE).id for i in range(1, JOBS + 1)]
        deadline = isolated_at + MINORITY_ANSWERS_WITHIN + MARGIN + 15
        while not ran >= set(enqueued) and time.monotonic() < deadline:
            time.sleep(0.2)
        missing = set(enqueued) - ran
        queues = {
            q["name"]: (q.get("messages"), q.get("messages_ready"), q.get("messages_unacknowledged"), q.get("leader"))
            for q in cluster.management(majority[0]).queues(prefix + ".")
            if q.get("type") == "quorum"
        }
        assert not missing, f"{len(missing)} of {JOBS} jobs did not run; queues {queues}"
        moved_after = time.monotonic() - isolated_at
        print(f"\nminority node: the consuming Worker ran the majority's jobs {moved_after:.1f}s after the partition")
        assert worker.consumer.reconnections >= 1
        assert worker.error is None
    finally:
        worker.stop(timeout=10)
        client.close()
        if isolated:
            cluster.heal(minority)
        cluster.management(majority[0]).delete_by_prefix(prefix + ".")
