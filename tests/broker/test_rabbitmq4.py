"""The rows of docs/rabbitmq-4.md, measured on RabbitMQ 4.3, 4.0 and 3.10 (one private node each).

Each test states what the broker does on each release (a raw declaration or policy, not the
library) and what the library does about it; the table in the docs quotes these outcomes.  The
delivery limit, consumer timeouts and argument comparison have their own modules
(``test_quorum.py``, ``test_topology.py``); Khepri's majority is in ``tests/cluster``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from support import raw_channel

from ojs_kombu import Client, Names, Worker
from ojs_kombu.testing import ManagementError, PrivateNode
from ojs_kombu.wire.entities import QueueOptions


@pytest.fixture(scope="module", params=["4.3", "4.0", "3.10"])
def release_node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateNode]:
    """A private node of each release, for the whole module."""
    node = PrivateNode(tmp_path_factory.mktemp(f"rabbitmq-{request.param}"), rabbitmq=request.param)
    try:
        node.start()
    except BaseException:
        node.cleanup()
        raise
    try:
        yield node
    finally:
        node.cleanup()


@pytest.fixture
def name() -> str:
    return f"r4{uuid.uuid4().hex[:10]}"


def _refusal(url: str, declare: dict) -> int | None:
    """The reply code with which the broker refuses ``queue_declare(**declare)``, or None if it accepts."""
    try:
        with raw_channel(url) as channel:
            channel.queue_declare(**declare)
            channel.queue_delete(declare["queue"])
    except (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker) as exc:
        return exc.reply_code
    return None


def _ran_a_job(node: PrivateNode, prefix: str, queue_type: str) -> list[dict]:
    """Declare a deployment, run one job through a Worker; the declared queues' (name, durable, exclusive, args)."""
    done = threading.Event()
    options = QueueOptions(queue_type=queue_type)
    worker = Worker(node.url, prefix=prefix, queues=["q"], concurrency=2, queue_options=options)
    worker.handler("r4.job", lambda: done.set())
    worker.start()
    try:
        with Client(node.url, prefix=prefix, queue_options=options) as client:
            client.declare_queue("q", scheduling=True)
            client.enqueue("r4.job", queue="q")
        assert done.wait(30), "the job did not run"
    finally:
        worker.stop()
    return node.management().queues(prefix)


def test_transient_non_exclusive_queues(release_node: PrivateNode, name: str) -> None:
    """Announced as denied by default in 4.3 (`transient_nonexcl_queues`); 4.3.6 as Debian builds it still
    accepts one.  Either way the library declares none: every queue of a deployment is durable or exclusive."""
    assert _refusal(release_node.url, {"queue": name, "durable": False, "exclusive": False}) is None
    for queue in _ran_a_job(release_node, name, "classic"):
        assert queue["durable"] or queue["exclusive"], queue["name"]


@pytest.mark.parametrize(
    "argument, value, refused_on_4_3",
    [
        ("x-queue-version", 1, 406),  # CQv1 storage removed
        ("x-queue-master-locator", "min-masters", 541),  # deprecated feature, denied: closes the connection
        ("x-queue-mode", "lazy", None),  # accepted and ignored
    ],
)
def test_classic_queue_arguments_removed_in_4_3(
    release_node: PrivateNode, name: str, argument: str, value: object, refused_on_4_3: int | None
) -> None:
    """What 4.3 refuses is accepted by 4.0 and 3.10; the library sends none of these arguments."""
    expected = refused_on_4_3 if release_node.release == "4.3" else None
    declare = {"queue": name, "durable": True, "arguments": {argument: value}}
    assert _refusal(release_node.url, declare) == expected
    for queue in _ran_a_job(release_node, name, "classic"):
        assert argument not in queue["arguments"], queue["name"]


def test_global_qos_on_quorum_queues(release_node: PrivateNode, name: str) -> None:
    """``basic.qos(global=true)`` then a consumer on a quorum queue: refused (540) on 3.10 and 4.0, accepted
    by 4.3.6.  The library only ever asks for per-consumer QoS, so a Worker consumes quorum queues everywhere."""
    refused = None
    try:
        with raw_channel(release_node.url) as channel:
            channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
            channel.basic_qos(prefetch_count=5, global_qos=True)
            channel.basic_consume(name, lambda *_: None)
    except (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker) as exc:
        refused = exc.reply_code
    finally:
        with raw_channel(release_node.url) as channel:
            channel.queue_delete(name)
    assert refused == (None if release_node.release == "4.3" else 540)
    queues = _ran_a_job(release_node, name, "quorum")
    types = {q["name"]: q["type"] for q in queues if not q["exclusive"]}
    assert types[Names(name).job_queue("q")] == "quorum"
    assert set(types.values()) == {"quorum", "stream"}  # the control and events streams are streams


def test_classic_mirroring_policies(release_node: PrivateNode, name: str) -> None:
    """``ha-*`` policies are refused from 4.0 on (classic queues are single-replica); replication is quorum queues."""
    management = release_node.management()
    path = f"/api/policies/%2F/{name}"
    body = {"pattern": f"^{name}\\.", "definition": {"ha-mode": "all"}, "apply-to": "queues"}
    try:
        management.request("PUT", path, body=body)
        status = 201
    except ManagementError as exc:
        status = exc.status
    finally:
        try:
            management.request("DELETE", path)
        except ManagementError:
            pass
    assert status == (201 if release_node.release == "3.10" else 400)


def test_quorum_queue_priorities(release_node: PrivateNode, name: str) -> None:
    """4.x quorum queues honour the message priority without ``x-max-priority`` (4.0: two levels, above 4 is
    high); 3.10's deliver in order.  The library sends the job's priority as the message priority."""
    prefix = name
    options = QueueOptions(queue_type="quorum")
    with Client(release_node.url, prefix=prefix, queue_options=options) as client:
        client.declare_queue("q")
        low = [client.enqueue("r4.job", [i], queue="q", priority=1).id for i in range(3)]
        high = client.enqueue("r4.job", ["urgent"], queue="q", priority=9).id
    order = []
    with raw_channel(release_node.url) as channel:
        while len(order) < 4:
            method, properties, _ = channel.basic_get(Names(prefix).job_queue("q"), auto_ack=True)
            if method is not None:
                order.append(properties.message_id)
    assert order == ([high, *low] if release_node.release != "3.10" else [*low, high])


@pytest.fixture(autouse=True)
def _clean(release_node: PrivateNode, name: str) -> Iterator[None]:
    yield
    release_node.management().delete_by_prefix(name + ".")


def test_node_directories_are_per_release(release_node: PrivateNode) -> None:
    """Each release's node answers with its own version (what the rows above were measured on)."""
    version = release_node.management().overview()["rabbitmq_version"]
    assert version.startswith(release_node.release + ".")
    assert Path(release_node.dir).is_dir()
