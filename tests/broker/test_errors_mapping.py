"""Permanent refusals against a real broker: typed errors at the boundary, never retried forever.

A wrong password (403 ACCESS_REFUSED), a virtual host that does not exist or that the
user may not use (530 NOT_ALLOWED), a missing permission (403 on a declaration or a
``Basic.Consume``) and a missing dead letter queue (404) each raise their
:class:`~ojs_kombu.errors.BrokerRefusedError` at once: from ``Client`` even with an
unlimited retry budget, and out of ``Consumer.run``'s reconnect loop.  The permission
cases run on a private node, where users and virtual hosts may be created.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from ojs_kombu import AccessRefusedError, Client, Names, NotFoundError
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.runtime.consumer import Consumer
from ojs_kombu.testing import PrivateNode

SECRET = "not-the-password-4711"


def _with_credentials(url: str, user: str, password: str, vhost: str = "/") -> str:
    """``url``'s host and port with other credentials and virtual host (kombu form: ``//`` is ``/``)."""
    parts = urlsplit(url)
    return f"amqp://{user}:{password}@{parts.hostname}:{parts.port}/{'/' if vhost == '/' else vhost}"


def _enqueue_fails_at_once(url: str, prefix: str, error: type[Exception]) -> BaseException:
    """Enqueue with no retry limit at all: only an error raised at once ends it."""
    with Client(url, prefix=prefix, publish_timeout=None, connect_retries=None) as client:
        started = time.monotonic()
        with pytest.raises(error) as info:
            client.enqueue("a.b", [1])
        assert time.monotonic() - started < 3.0  # no back-off sleep (the first is ~1 s)
    assert SECRET not in str(info.value)
    return info.value


def _run_consumer(consumer: Consumer, timeout: float = 15.0) -> BaseException | None:
    """Run ``consumer`` in a thread; return what ``run()`` raised, or fail when it is still running."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            consumer.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    try:
        assert not thread.is_alive(), "Consumer.run kept retrying a permanent refusal"
    finally:
        consumer.stop()
        thread.join(10)
        consumer.close()
    return raised[0] if raised else None


def _consumer(url: str, names: Names, queue: str | None = None, *, declare: bool = True) -> Consumer:
    topology = Topology(names)
    amqp_queues = {names.job_queue(queue): queue} if queue else {}
    return Consumer(
        url,
        amqp_queues,
        1,
        lambda delivery: None,
        topology=topology,
        declare=(lambda connection: topology.declare_queue(connection, queue)) if queue and declare else None,
        connect_retries=None,  # a worker reconnects forever: only a permanent refusal ends it
    )


# -- the shared broker: wrong password, unknown vhost, missing dead letter queue ----------------


def test_wrong_password_raises_access_refused_without_retrying(amqp_url, prefix):
    error = _enqueue_fails_at_once(_with_credentials(amqp_url, "guest", SECRET), prefix, AccessRefusedError)
    assert error.reply_code == 403 and "ACCESS_REFUSED" in error.reply_text


def test_unknown_vhost_raises_access_refused_without_retrying(amqp_url, prefix):
    vhost = f"no-such-vhost-{uuid.uuid4().hex[:8]}"
    error = _enqueue_fails_at_once(_with_credentials(amqp_url, "guest", "guest", vhost), prefix, AccessRefusedError)
    assert error.reply_code == 530 and vhost in error.reply_text
    assert error.method == "Connection.open"


def test_consumer_run_stops_on_a_wrong_password(amqp_url, names):
    consumer = _consumer(_with_credentials(amqp_url, "guest", SECRET), names)
    raised = _run_consumer(consumer)
    assert isinstance(raised, AccessRefusedError), raised
    assert SECRET not in str(raised)
    assert consumer.reconnections == 0


def test_missing_dead_letter_queue_is_not_found(client):
    for read in (
        lambda: client.dead_letters("never-declared"),
        lambda: client.replay_dead_letters("never-declared"),
        lambda: client.purge_dead_letters("never-declared"),
    ):
        with pytest.raises(NotFoundError) as info:
            read()
        assert info.value.reply_code == 404 and "never-declared" in info.value.reply_text
    # The refusal did not break the client.
    assert client.enqueue("a.b", [1], queue="still-works").queue == "still-works"


# -- a private node: users and virtual hosts of our own (the ``node`` fixture of tests/conftest.py)


@pytest.fixture
def limited_user(node: PrivateNode) -> Iterator[str]:
    """A user with no permissions anywhere (tests grant what they need on ``/``)."""
    management = node.management()
    user = f"limited-{uuid.uuid4().hex[:8]}"
    management.create_user(user, SECRET)
    yield user
    management.delete_user(user)


@pytest.mark.broker
def test_vhost_the_user_may_not_use_raises_access_refused(node, limited_user):
    management = node.management()
    vhost = f"locked-{uuid.uuid4().hex[:8]}"
    management.create_vhost(vhost)
    try:
        url = _with_credentials(node.url, limited_user, SECRET, vhost)
        error = _enqueue_fails_at_once(url, "p", AccessRefusedError)
        assert vhost in error.reply_text and limited_user in error.reply_text
    finally:
        management.delete_vhost(vhost)


@pytest.mark.broker
def test_declaring_without_configure_permission_raises_access_refused(node, limited_user):
    node.management().set_permissions(limited_user, configure="^$", write=".*", read=".*")
    url = _with_credentials(node.url, limited_user, SECRET)
    error = _enqueue_fails_at_once(url, f"t{uuid.uuid4().hex[:8]}", AccessRefusedError)
    assert error.reply_code == 403 and error.method == "Exchange.declare"


@pytest.mark.broker
def test_consumer_run_stops_when_it_may_not_declare_its_queue(node, limited_user):
    # Declaring a queue with a dead letter exchange needs read permission on it: none here.
    node.management().set_permissions(limited_user, configure=".*", write=".*", read=r".*\.exchange\..*")
    names = Names(f"t{uuid.uuid4().hex[:8]}")
    consumer = _consumer(_with_credentials(node.url, limited_user, SECRET), names, "jobs")
    raised = _run_consumer(consumer)
    assert isinstance(raised, AccessRefusedError), raised
    assert raised.reply_code == 403 and raised.method == "Queue.declare"
    assert names.job_queue("jobs") in raised.reply_text
    assert consumer.reconnections == 0


@pytest.mark.broker
def test_consumer_run_stops_when_it_may_not_read_its_queue(node, limited_user):
    # The queue exists (declared by an administrator); the consumer declares nothing and may read nothing.
    names = Names(f"t{uuid.uuid4().hex[:8]}")
    with Client(node.url, prefix=names.prefix) as admin:
        admin.declare_queue("jobs")
    node.management().set_permissions(limited_user, configure=".*", write=".*", read="^$")
    consumer = _consumer(_with_credentials(node.url, limited_user, SECRET), names, "jobs", declare=False)
    raised = _run_consumer(consumer)
    assert isinstance(raised, AccessRefusedError), raised
    assert raised.reply_code == 403 and raised.method == "Basic.consume"
    assert consumer.reconnections == 0
