"""The local 3-node RabbitMQ cluster (``ojs_kombu.testing.cluster``): the base of failover tests.

The session's ``cluster`` fixture must be one cluster of three running nodes, replicate a
quorum queue on all of them, route a message published on one node to a consumer on
another, and keep the queue available when its leader's VM is killed.  The command line
must leave no process and no file behind.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import amqp
import pytest
from support import wait_until

from ojs_kombu.testing.broker import GUEST, BrokerError, PrivateNode
from ojs_kombu.testing.cluster import Cluster

pytestmark = pytest.mark.broker

QUORUM = {"x-queue-type": "quorum"}
# A Raft election after a leader's crash takes a few seconds; the brief allows ~10 s.
NEW_LEADER_WITHIN = 10.0


@contextmanager
def channel(node: PrivateNode) -> Iterator[amqp.Channel]:
    """A py-amqp channel on ``node``, in publisher-confirm mode."""
    connection = amqp.Connection(host=f"127.0.0.1:{node.amqp_port}", userid=GUEST, password=GUEST, virtual_host="/")
    connection.connect()
    try:
        ch = connection.channel()
        ch.confirm_select()
        yield ch
    finally:
        connection.close()


def publish(node: PrivateNode, queue: str, body: bytes) -> None:
    with channel(node) as ch:
        ch.basic_publish(amqp.Message(body, delivery_mode=2), exchange="", routing_key=queue)  # waits for the confirm


def get_one(node: PrivateNode, queue: str, timeout: float = 10.0) -> bytes:
    """The body of the next message of ``queue``, consumed (and acked) on ``node``."""
    with channel(node) as ch:
        message = wait_until(
            lambda: ch.basic_get(queue, no_ack=False), timeout=timeout, message=f"a message on {queue}"
        )
        ch.basic_ack(message.delivery_tag)
        return bytes(message.body)


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line or environment contains ``text``.

    A RabbitMQ VM carries its node name only in its environment (``RABBITMQ_NODENAME``), so
    ``pgrep -f <node name>`` alone would find nothing even while the node runs; the epmd a
    VM launched inherits that environment too.
    """
    found = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes() or needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


@pytest.fixture
def quorum_queue(cluster: Cluster) -> Iterator[str]:
    """A quorum queue declared through node 1; deleted afterwards."""
    name = f"t{uuid.uuid4().hex[:12]}.cluster"
    with channel(cluster.nodes[0]) as ch:
        ch.queue_declare(name, durable=True, auto_delete=False, arguments=QUORUM)
    yield name
    cluster.management().delete_queue(name)


def test_the_nodes_form_one_cluster_of_three_running_nodes(cluster: Cluster) -> None:
    names = sorted(node.name for node in cluster.nodes)
    assert len(set(names)) == 3
    assert len({node.amqp_port for node in cluster.nodes}) == 3
    for node in cluster.nodes:  # every node sees the same cluster
        listed = cluster.management(node).request("GET", "/api/nodes?columns=name,running")
        assert sorted(entry["name"] for entry in listed if entry["running"]) == names
    assert cluster.urls == [node.url for node in cluster.nodes]
    assert cluster.management_url == cluster.nodes[0].management_url


def test_rabbitmqctl_cluster_status_of_every_node_lists_the_three_running_nodes(cluster: Cluster) -> None:
    # rabbitmqctl reaches the nodes only with the cluster's own cookie (not ~/.erlang.cookie).
    names = sorted(node.name for node in cluster.nodes)
    for node in cluster.nodes:
        done = node.ctl("cluster_status", "--formatter", "json")
        assert done is not None and done.returncode == 0, done and done.stderr
        status = json.loads(done.stdout)
        assert sorted(status["running_nodes"]) == names
        assert sorted(status["disk_nodes"]) == names


def test_a_quorum_queue_declared_on_node_1_has_members_on_all_three_nodes(cluster: Cluster, quorum_queue: str) -> None:
    names = sorted(node.name for node in cluster.nodes)
    info = wait_until(
        lambda: (q := cluster.management().queue(quorum_queue)) and q.get("members") and q,
        message="the quorum queue's members",
    )
    assert info["type"] == "quorum"
    assert sorted(info["members"]) == names


def test_a_message_published_on_node_1_is_consumed_from_node_3(cluster: Cluster, quorum_queue: str) -> None:
    publish(cluster.nodes[0], quorum_queue, b"from node 1")
    assert get_one(cluster.nodes[2], quorum_queue) == b"from node 1"


def test_the_queue_stays_available_when_its_leader_is_killed(cluster: Cluster, quorum_queue: str) -> None:
    publish(cluster.nodes[0], quorum_queue, b"before the crash")
    leader = cluster.node(wait_until(lambda: (cluster.management().queue(quorum_queue) or {}).get("leader")))
    survivors = [node for node in cluster.nodes if node is not leader]
    cluster.kill(leader)
    try:
        assert not leader.is_running()
        killed_at = time.monotonic()
        new_leader = wait_until(
            lambda: (
                (q := cluster.management(survivors[0]).queue(quorum_queue))
                and q.get("leader") in {node.name for node in survivors}
                and q["leader"]
            ),
            timeout=NEW_LEADER_WITHIN,
            interval=0.2,
            message="a new leader on a surviving node",
        )
        print(f"new leader {new_leader} {time.monotonic() - killed_at:.1f}s after the kill")
        assert get_one(survivors[-1], quorum_queue) == b"before the crash"
        publish(survivors[0], quorum_queue, b"after the crash")
        assert get_one(survivors[-1], quorum_queue) == b"after the crash"
    finally:
        cluster.restart(leader)
    assert leader.is_running()
    assert sorted(cluster.management().queue(quorum_queue)["members"]) == sorted(n.name for n in cluster.nodes)


def test_cluster_rejects_fewer_than_one_node() -> None:
    with pytest.raises(BrokerError, match="at least one node"):
        Cluster(0)


def test_the_command_line_starts_prints_urls_and_stop_leaves_nothing_behind(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ojs_kombu.testing.cluster", *args, "--dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=180,
        )

    started = cli("start", "--nodes", "2")
    assert started.returncode == 0, started.stderr
    recorded = Cluster.from_dict(json.loads((tmp_path / "cluster.json").read_text()))
    try:
        lines = cli("urls").stdout.splitlines()
        assert lines == [*recorded.urls, recorded.management_url] == started.stdout.splitlines()
        assert all(line.startswith("amqp://") for line in lines[:2]) and lines[2].startswith("http://")
        listed = recorded.management().request("GET", "/api/nodes?columns=name,running")
        assert sorted(e["name"] for e in listed if e["running"]) == sorted(n.name for n in recorded.nodes)
        assert len(processes_mentioning(f"ojs-{recorded.cluster_id}-")) >= 2  # the check below can fail
        dirs = [node.dir for node in recorded.nodes]
        assert all(d.is_dir() for d in dirs)
    finally:
        stopped = cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert processes_mentioning(f"ojs-{recorded.cluster_id}-") == []
    assert not port_open(recorded.epmd_port)
    assert not any(d.exists() for d in dirs)
    assert not (tmp_path / "cluster.json").exists()
    assert cli("urls").returncode == 1
