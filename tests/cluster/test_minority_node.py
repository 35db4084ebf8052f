"""A Worker and a Client whose first URL is a node cut off from the rest of the cluster move on.

With Khepri (the only metadata store of RabbitMQ 4.3; the default for new 4.2 clusters) a
declaration that writes metadata (a new queue, exchange or binding) needs a majority of nodes.
The first node is isolated from the other two at the Erlang distribution level (its cookie for
them is changed and its connections to them are closed): it keeps serving AMQP, while the two
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
from ojs_kombu.testing.broker import PrivateNode
from ojs_kombu.testing.cluster import Cluster

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]

QUEUE = "minority"
JOBS = 10
# RabbitMQ answers a metadata write on a minority node after 30 s (Khepri's command timeout);
# everything else is the library's: the reconnect and the declarations on the next node.
MINORITY_ANSWERS_WITHIN = 30.0
MARGIN = 15.0  # a loaded 2-core machine
ISOLATION_COOKIE = "ojs_isolated"


def khepri_enabled(cluster: Cluster, node: PrivateNode) -> bool:
    """Whether the cluster keeps its metadata in Khepri (feature flag ``khepri_db`` enabled)."""
    flags = cluster.management(node).request("GET", "/api/feature-flags") or []
    return any(flag.get("name") == "khepri_db" and flag.get("state") == "enabled" for flag in flags)


def _others(cluster: Cluster, node: PrivateNode) -> str:
    return ", ".join(f"'{other.name}'" for other in cluster.nodes if other is not node)


def _running_seen_by(cluster: Cluster, node: PrivateNode) -> set[str]:
    listed = cluster.management(node).request("GET", "/api/nodes?columns=name,running") or []
    return {entry["name"] for entry in listed if entry.get("running")}


def isolate(cluster: Cluster, node: PrivateNode) -> None:
    """Cut ``node`` off from the other nodes (a partition); it keeps serving clients.

    Its cookie for each other node becomes a wrong one, so neither side can reconnect, and its
    distribution connections to them are closed.  :func:`heal` undoes it.
    """
    others = _others(cluster, node)
    done = node.ctl(
        "eval",
        f"[erlang:set_cookie(N, {ISOLATION_COOKIE}) || N <- [{others}]], "
        f"[erlang:disconnect_node(N) || N <- [{others}]], ok.",
    )
    assert done is not None and done.returncode == 0, done and done.stderr
    majority = next(other for other in cluster.nodes if other is not node)
    wait_until(
        lambda: node.name not in _running_seen_by(cluster, majority),
        timeout=30,
        message=f"the majority to see {node.name} down",
    )


def heal(cluster: Cluster, node: PrivateNode) -> None:
    """Undo :func:`isolate`: ``node`` reconnects, and every node sees all three running again."""
    others = _others(cluster, node)
    done = node.ctl(
        "eval",
        f"[erlang:set_cookie(N, erlang:get_cookie()) || N <- [{others}]], [net_adm:ping(N) || N <- [{others}]].",
    )
    assert done is not None and done.returncode == 0, done and done.stderr
    names = {each.name for each in cluster.nodes}
    wait_until(
        lambda: all(_running_seen_by(cluster, each) == names for each in cluster.nodes),
        timeout=60,
        message="the cluster whole again",
    )


def test_a_worker_and_a_client_whose_first_node_is_in_the_minority_run_jobs_on_the_majority(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    minority, *majority = cluster.nodes
    if not khepri_enabled(cluster, majority[0]):
        pytest.skip("Mnesia metadata store: declarations on a minority node do not wait for a majority")
    prefix = f"t{uuid.uuid4().hex[:8]}"
    urls = [minority.url] + [node.url for node in majority]
    ran: set[str] = set()
    lock = threading.Lock()
    caplog.set_level(logging.WARNING, logger="ojs_kombu")
    isolate(cluster, minority)
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
        heal(cluster, minority)
        cluster.management().delete_by_prefix(prefix + ".")
