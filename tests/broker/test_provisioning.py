"""The broker provisioning helpers, checked against real private RabbitMQ nodes.

Two nodes are started in all: one for the module (restarted once) and one
that is stopped to show the first is unaffected.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import amqp
import kombu
import pytest

import ojs_kombu.testing
from ojs_kombu.testing import ManagementError, PrivateNode, mask_url, provision_broker


def _name(kind: str) -> str:
    return f"ojs-test-{kind}-{uuid.uuid4().hex[:8]}"


def _connect(node: PrivateNode) -> amqp.Connection:
    conn = amqp.Connection(host=f"127.0.0.1:{node.amqp_port}", userid="guest", password="guest", confirm_publish=True)
    conn.connect()
    return conn


def _answers(node: PrivateNode) -> bool:
    try:
        with kombu.Connection(node.url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
            return bool(conn.connected)
    except Exception:  # noqa: BLE001 - any failure means not reachable
        return False


# -- no broker needed ----------------------------------------------------------


def test_mask_url_hides_only_the_password() -> None:
    assert mask_url("amqp://guest:s3cret@127.0.0.1:5672//") == "amqp://guest:***@127.0.0.1:5672//"
    assert mask_url("amqp://127.0.0.1:5672//") == "amqp://127.0.0.1:5672//"


def test_external_broker_is_used_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OJS_AMQP_URL", "amqp://app:p%40ss@mq.example:5673/jobs")
    monkeypatch.delenv("OJS_MANAGEMENT_URL", raising=False)
    monkeypatch.delenv("OJS_MANAGEMENT_USER", raising=False)
    monkeypatch.delenv("OJS_MANAGEMENT_PASSWORD", raising=False)
    with provision_broker() as handle:
        assert handle.url == "amqp://app:p%40ss@mq.example:5673/jobs"
        assert handle.management_url == "http://mq.example:15672"
        assert (handle.management_user, handle.management_password) == ("app", "p@ss")
        assert handle.node is None


# -- real nodes ----------------------------------------------------------------


@pytest.mark.broker
def test_node_serves_amqp_on_its_own_ports(node: PrivateNode) -> None:
    assert node.is_running()
    assert node.url == f"amqp://guest:guest@127.0.0.1:{node.amqp_port}//"
    assert len({node.amqp_port, node.dist_port, node.management_port, node.epmd_port}) == 4
    assert node.node_name.startswith("ojs-") and node.node_name.endswith("@localhost")
    with kombu.Connection(node.url) as conn:
        conn.ensure_connection(max_retries=1)
        assert conn.connected
    assert node.management().overview()["node"] == node.node_name


@pytest.mark.broker
def test_management_client_sees_declared_topology(node: PrivateNode) -> None:
    client = node.management()
    prefix = _name("mgmt")
    queue, exchange = f"{prefix}.q", f"{prefix}.x"
    arguments = {"x-max-priority": 5, "x-dead-letter-exchange": f"{prefix}.dlx"}
    conn = _connect(node)
    try:
        channel = conn.channel()
        channel.exchange_declare(exchange, "direct", durable=True, auto_delete=False)
        channel.queue_declare(queue, durable=True, auto_delete=False, arguments=arguments)
        channel.queue_bind(queue, exchange, routing_key="rk")
        for i in range(2):
            channel.basic_publish(amqp.Message(f"m{i}", delivery_mode=2), exchange=exchange, routing_key="rk")
    finally:
        conn.close()

    info = client.wait_for_queue(queue, lambda q: q is not None and q.get("messages") == 2)
    assert info is not None
    shown = dict(info["arguments"])
    assert shown.pop("x-queue-type", "classic") == "classic"  # 4.x lists a classic queue's type too
    assert shown == arguments
    assert (info["durable"], info["exclusive"], info["auto_delete"]) == (True, False, False)
    assert (info["messages_ready"], info["messages_unacknowledged"], info["consumers"]) == (2, 0, 0)
    assert [q["name"] for q in client.queues(prefix)] == [queue]
    assert client.exchange(exchange)["type"] == "direct"
    assert [(b["destination"], b["routing_key"]) for b in client.bindings(source=exchange)] == [(queue, "rk")]

    assert client.queue(f"{prefix}.missing") is None
    with pytest.raises(ManagementError) as excinfo:
        client.request("GET", f"/api/queues/%2F/{prefix}.missing")
    assert excinfo.value.status == 404

    assert client.delete_by_prefix(prefix) == 2
    assert client.queue(queue) is None and client.exchange(exchange) is None


@pytest.mark.broker
def test_close_connection_drops_the_client(node: PrivateNode) -> None:
    client = node.management()
    conn = _connect(node)
    try:
        local_port = conn.sock.getsockname()[1]
        deadline = time.monotonic() + 15  # the connection list comes from lagging statistics
        while not (mine := [c for c in client.connections() if c.get("peer_port") == local_port]):
            assert time.monotonic() < deadline, "connection never listed by the management API"
            time.sleep(0.25)
        assert client.close_connection(mine[0]["name"])
        with pytest.raises(amqp.exceptions.ConnectionForced):
            conn.drain_events(timeout=10)
    finally:
        conn.collect()


@pytest.mark.broker
def test_restart_keeps_durable_queue_and_persistent_message(node: PrivateNode) -> None:
    durable, transient = _name("durable"), _name("transient")
    conn = _connect(node)
    try:
        channel = conn.channel()
        channel.queue_declare(durable, durable=True, auto_delete=False)
        channel.queue_declare(transient, durable=False, auto_delete=False)
        channel.basic_publish(amqp.Message(b"survives", delivery_mode=2), exchange="", routing_key=durable)
    finally:
        conn.close()
    ports = (node.amqp_port, node.management_port)

    node.restart()

    assert (node.amqp_port, node.management_port) == ports
    client = node.management()
    assert client.queue(transient) is None  # proves the node really restarted
    assert client.queue(durable)["durable"] is True
    conn = _connect(node)
    try:
        channel = conn.channel()
        message = channel.basic_get(durable, no_ack=True)
        assert message is not None and message.body == b"survives"
        channel.queue_delete(durable)
    finally:
        conn.close()


@pytest.mark.broker
def test_stopping_a_node_leaves_another_node_running(node: PrivateNode, tmp_path: Path) -> None:
    with PrivateNode(tmp_path) as other:
        assert other.node_name != node.node_name
        assert {other.amqp_port, other.management_port}.isdisjoint({node.amqp_port, node.management_port})
        assert _answers(other)

        other.stop()
        other.stop()  # idempotent

        assert not other.is_running()
        assert not _answers(other)
        assert node.is_running()
        assert _answers(node)
        assert node.management().overview()["node"] == node.node_name
    assert not other.dir.exists()


@pytest.mark.broker
def test_run_exports_the_broker_and_returns_the_exit_code(node: PrivateNode) -> None:
    package_root = Path(ojs_kombu.testing.__file__).resolve().parents[2]
    env = {
        **os.environ,
        "OJS_AMQP_URL": node.url,
        "OJS_MANAGEMENT_URL": node.management_url,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(package_root), os.environ.get("PYTHONPATH")])),
    }
    script = "import os, sys; print(os.environ['OJS_AMQP_URL'], os.environ['OJS_MANAGEMENT_URL']); sys.exit(3)"
    done = subprocess.run(
        [sys.executable, "-m", "ojs_kombu.testing.broker", "run", "--", sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout.split() == [node.url, node.management_url]
    assert "guest:guest" not in done.stderr  # log lines mask the password
    assert node.is_running()  # an external broker is never stopped
