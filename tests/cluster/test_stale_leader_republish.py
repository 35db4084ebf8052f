"""A Worker's retries after the node leading their retry queue is lost (RabbitMQ 3.10's stale leader).

On 3.10 a channel that first publishes to a quorum queue whose leader died is registered with
the dead leader, and every later publish of that channel to the queue is nacked
(docs/cluster.md, Failover).  A retry whose republish is nacked goes to the dead letter queue
(never lost); the consumer's publisher then moves to a fresh channel
(:class:`~ojs_kombu.amqp.publisher.ConfirmedPublisher`), so only the retries republished while
the new leader is being elected are dead-lettered, not every retry from then on.

The retry queue is led by the node killed; the first jobs fail right after the kill.  Measured
on 3.10.8: without the fresh channel, 40 of 40 retries dead-lettered (3 runs); with it, 8 then
none (the jobs failing more than ~1 s after the kill).  Whether the first retries meet the stale
leader depends on the election's timing (without the held jobs, 2 of 3 runs saw no nack);
the assertion holds either way with the fix, and fails whenever it happens without it.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import kombu
import pytest
from support import wait_until

from ojs_kombu import Client, RetryPolicy, Worker, current_job
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.model.naming import Names
from ojs_kombu.testing.cluster import Cluster
from ojs_kombu.wire.entities import QueueOptions

pytestmark = pytest.mark.broker

QUEUE = "stale"
RETRY_AFTER = timedelta(seconds=60)  # the retries stay in their queue while the test counts them
LATE_JOBS = 12  # jobs enqueued once a new leader must answer: without the fix, each is dead-lettered
HELD = 4  # jobs running at the kill, failing just after it
SPACING = 0.15  # seconds between two failing jobs: the stream spans the election and after it
RECOVERED_AFTER = 4.0  # seconds after the kill by which a new leader answers (loaded machine)


def test_retries_after_the_retry_queue_leader_is_lost_are_nacked_only_during_the_election(cluster: Cluster) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    names = Names(prefix)
    delay_ms = int(RETRY_AFTER.total_seconds() * 1000)
    retry_queue, dead_letter_queue = names.retry_queue(QUEUE, delay_ms), names.dead_letter_queue(QUEUE)
    first, second, third = cluster.nodes
    # Placement is client-local: the retry queue is led by the first node, the job queue (and its
    # DLQ) by the second, and the Worker and the Client use the second and third only.
    topology = Topology(names, queue_options=QueueOptions(queue_type="quorum"))
    with kombu.Connection(first.url) as conn:
        topology.ensure_retry_queue(conn.connection, QUEUE, delay_ms)
    management = cluster.management(second)
    assert cluster.node(wait_until(lambda: (management.queue(retry_queue) or {}).get("leader"))) is first
    urls = [second.url, third.url]
    client = Client(urls, prefix=prefix, queue_type="quorum", confirm_timeout=10, publish_timeout=10)
    client.declare_queue(QUEUE)
    assert cluster.node(wait_until(lambda: (management.queue(names.job_queue(QUEUE)) or {}).get("leader"))) is second

    failed: dict[str, float] = {}  # job id -> when its first attempt failed
    running = threading.Semaphore(0)
    kill_done = threading.Event()
    worker = Worker(urls, prefix=prefix, queues=[QUEUE], queue_type="quorum", concurrency=HELD, grace_period=5)

    @worker.handler("flaky")
    def flaky() -> None:
        running.release()
        kill_done.wait(30)  # the first jobs fail right after the kill: their retries meet the stale leader
        failed[current_job().id] = time.monotonic()
        raise RuntimeError("the first attempt fails")

    policy = RetryPolicy(max_attempts=2, initial_interval=f"PT{RETRY_AFTER.seconds}S", jitter=False)
    worker.start()
    killed = False
    try:
        assert worker.wait_until_ready(30)
        for _ in range(HELD):
            client.enqueue("flaky", queue=QUEUE, retry=policy)
        for _ in range(HELD):
            assert running.acquire(timeout=30), "the held jobs did not start"
        cluster.kill(first)
        killed = True
        killed_at = time.monotonic()
        kill_done.set()
        # The stream's length is set by the clock, not a count: it runs until LATE_JOBS have been
        # enqueued after RECOVERED_AFTER (a fixed count ended too soon on a fast machine).
        jobs, late_enqueued = HELD, 0
        while late_enqueued < LATE_JOBS:
            client.enqueue("flaky", queue=QUEUE, retry=policy)
            jobs += 1
            late_enqueued += time.monotonic() > killed_at + RECOVERED_AFTER
            time.sleep(SPACING)  # pacing the stream over the election, not a synchronisation
        wait_until(lambda: len(failed) == jobs, timeout=30, message="every first attempt")

        def counts() -> tuple[int, int]:
            found = client.queue_counts([retry_queue, dead_letter_queue])
            retried, dead = found[retry_queue], found[dead_letter_queue]
            return (retried.ready if retried else 0), (dead.ready if dead else 0)

        def settled() -> tuple[int, int] | None:
            found = counts()
            return found if sum(found) == jobs else None  # each retried or dead-lettered, none lost

        retried, dead = wait_until(settled, timeout=30, message="every failed job retried or dead-lettered")
        late = sum(1 for at in failed.values() if at > killed_at + RECOVERED_AFTER)
        print(f"\nstale leader: {jobs} failed first attempts, {retried} retried, {dead} dead-lettered, {late} late")
        assert late >= LATE_JOBS, "a job enqueued after RECOVERED_AFTER failed before it"
        # Without the fresh channel every retry after the first nack was nacked too.
        assert retried >= late
    finally:
        worker.stop(timeout=10)
        try:
            if killed:
                cluster.restart(first)
        finally:
            worker.teardown()
            client.close()
