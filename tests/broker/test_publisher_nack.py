"""After a ``Basic.Nack`` a :class:`ConfirmedPublisher` publishes on a fresh channel.

RabbitMQ 3.10 keeps a channel on a quorum queue's dead leader after a node loss, nacking every
later publish of that channel (docs/cluster.md); a new channel reads the current leader.  That
election cannot be provoked on demand, so these tests provoke the nack with a full queue
(``x-overflow=reject-publish``) and check the rule: the nacked channel is closed, the next
publish goes on a new one, and a publish the queue can take again is confirmed there.  The
Client, the consumers' republishes and the ``ojs://`` transport all publish through this class.
"""

from __future__ import annotations

from collections.abc import Iterator

import kombu
import pytest
from support import raw_channel

from ojs_kombu.amqp.publisher import ConfirmedPublisher
from ojs_kombu.errors import PublishNackedError
from ojs_kombu.wire.codec import OutgoingMessage


@pytest.fixture
def full_queue(amqp_url: str, prefix: str) -> str:
    """A queue that takes one message and nacks the next publishes."""
    name = f"{prefix}.full"
    with raw_channel(amqp_url) as channel:
        channel.queue_declare(name, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    return name


@pytest.fixture
def publisher(amqp_url: str) -> Iterator[ConfirmedPublisher]:
    with kombu.Connection(amqp_url) as connection:
        connection.connect()
        confirmed = ConfirmedPublisher(connection.connection)
        yield confirmed
        confirmed.close()


def publish(publisher: ConfirmedPublisher, queue: str, n: int, *, flush: bool = True):
    message = OutgoingMessage(b"{}", {"message_id": f"m{n}", "content_type": "application/json"}, {})
    return publisher.publish(message, exchange="", routing_key=queue, queue=queue, job_id=f"m{n}", flush=flush)


def test_the_publish_after_a_nack_goes_on_a_fresh_channel(publisher, full_queue, amqp_url):
    first = publisher.channel
    publisher.wait([publish(publisher, full_queue, 1)], timeout=10)
    assert publisher.channel is first  # an ack changes nothing
    nacked = publish(publisher, full_queue, 2)
    publisher.wait([nacked], timeout=10)
    assert isinstance(nacked.error, PublishNackedError)

    again = publish(publisher, full_queue, 3)
    assert publisher.channel is not first and not first.is_open
    publisher.wait([again], timeout=10)
    assert isinstance(again.error, PublishNackedError)  # still full: nacked on the new channel too
    renewed = publisher.channel

    with raw_channel(amqp_url) as channel:
        channel.queue_purge(full_queue)
    taken = publish(publisher, full_queue, 4)
    assert publisher.channel is not renewed  # renewed after the second nack as well
    publisher.wait([taken], timeout=10)
    assert taken.error is None  # its tags start afresh and match the new channel's confirms


def test_a_nack_inside_a_pipelined_batch_renews_only_once_the_batch_is_settled(publisher, full_queue):
    first = publisher.channel
    batch = [publish(publisher, full_queue, n, flush=False) for n in range(3)]
    assert publisher.channel is first  # never mid-batch: its confirms come on this channel
    publisher.wait(batch, timeout=10)
    assert [t.error is None for t in batch] == [True, False, False]
    publish(publisher, full_queue, 3)
    assert publisher.channel is not first
