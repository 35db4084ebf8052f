"""The leader lease queue on one py-amqp channel (DESIGN §20): declare, seed, consume, renew.

The lease is a quorum queue (``Names.cron_leader_queue``) declared with
``x-single-active-consumer=true``: of all the consumers subscribed to it, the broker
delivers to one only, and to the next one when that consumer's channel or connection
goes away.  The queue holds a *token*, a message never acknowledged: the consumer it is
delivered to is the active one, hence the leader.  :mod:`ojs_kombu.runtime.leader` runs the
state machine; this module holds the AMQP operations it needs.

Queue arguments, and why:

* ``x-queue-type=quorum``: the lease survives the loss of a minority of cluster nodes.
* ``x-single-active-consumer=true``: at most one consumer receives the token, whatever the
  number of tokens.  ``basic.get`` is refused on such a queue (405 RESOURCE_LOCKED).
* ``x-consumer-timeout`` (:data:`LEASE_CONSUMER_TIMEOUT_MS`, about 24.8 days): the token is
  never acknowledged, and RabbitMQ's default consumer timeout (30 minutes) would take it
  back.  RabbitMQ 4.3 cancels a quorum consumer past its timeout (``Basic.Cancel``) and
  hands the token on; 3.10 and 3.11 ignore the argument and close the channel after the
  node's ``consumer_timeout`` (30 min by default), which the lease sees as a lost channel.
* ``x-delivery-limit`` = 2**31-1: every failover returns the token to the queue, and a
  quorum queue drops a message returned ``x-delivery-limit`` times (20 by default on 4.x).
* ``x-max-length=1`` with ``x-overflow=reject-publish``: bounds the tokens that concurrent
  seeders can add.  On quorum queues it is *not* exact: 8 connections publishing at the same
  instant into an empty queue got 2 acks on RabbitMQ 4.3.6, with ``x-max-length`` 0 or 1
  (a classic queue acked exactly 1).  So a surplus token is removed by the leader instead:
  the active consumer receives every token, keeps one and acknowledges the others
  (:meth:`LeaseChannel.on_delivery`).  The count converges to one, and never reaches zero:
  the token kept is unacknowledged, and goes back to the queue if its holder dies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from amqp import Channel, spec
from amqp import Message as WireMessage
from amqp.exceptions import MessageNacked, PreconditionFailed

from ojs_kombu.amqp.refusals import parse_precondition_failed

LEASE_CONSUMER_TIMEOUT_MS = 2**31 - 1
"""``x-consumer-timeout`` of the lease queue: 2**31-1 ms, about 24.8 days."""

LEASE_DELIVERY_LIMIT = 2**31 - 1
"""``x-delivery-limit`` of the lease queue: in effect none (each failover counts one delivery)."""

LEASE_PREFETCH = 2
"""The leader holds its token and may receive one surplus token at a time, which it acknowledges."""

TOKEN_BODY = b'{"lease":"ojs.cron.leader"}'


def lease_queue_arguments() -> dict[str, Any]:
    """The arguments of the lease queue (see the module).

    Returns:
        A new dict.
    """
    return {
        "x-queue-type": "quorum",
        "x-single-active-consumer": True,
        "x-consumer-timeout": LEASE_CONSUMER_TIMEOUT_MS,
        "x-delivery-limit": LEASE_DELIVERY_LIMIT,
        "x-max-length": 1,
        "x-overflow": "reject-publish",
    }


class LeaseChannel:
    """The lease operations on one channel of a connection owned by one thread.

    Parameters:
        channel: an open py-amqp channel, used by this object alone.
        queue: the lease queue's AMQP name.
        on_token: called (in the thread that drains the connection) when this consumer is
            handed its token: it is the leader from then on.
        on_cancel: called when the broker cancels the consumer (consumer timeout, queue
            deleted): the token is gone.
    """

    def __init__(
        self, channel: Channel, queue: str, *, on_token: Callable[[], None], on_cancel: Callable[[], None]
    ) -> None:
        self.channel = channel
        self.queue = queue
        self._on_token = on_token
        self._on_cancel = on_cancel
        self._held: int | None = None
        self.surplus_acked = 0
        self.cancelled = False

    @property
    def holds_token(self) -> bool:
        """Whether a token was delivered to this channel (and is held unacknowledged)."""
        return self._held is not None

    def declare(self) -> tuple[int, int]:
        """Declare the lease queue.

        Returns:
            ``(ready tokens, consumers)`` as the broker counts them.

        Raises:
            TopologyConflictError: the queue exists with other arguments (406), e.g. as a classic queue.
            amqp exceptions: as py-amqp raises them.
        """
        try:
            ok = self.channel.queue_declare(
                self.queue, durable=True, auto_delete=False, exclusive=False, arguments=lease_queue_arguments()
            )
        except PreconditionFailed as exc:
            raise parse_precondition_failed(self.queue, str(exc.reply_text or exc)) from exc
        return int(ok.message_count), int(ok.consumer_count)

    def seed(self) -> bool:
        """Publish a token unless one waits in the queue (the broker may still refuse it: queue full).

        A token held by the current leader is not counted by the broker's ``message_count``, so a
        seed while a leader exists adds a surplus token, which that leader acknowledges at once.

        Returns:
            Whether the broker accepted a token.
        """
        ready, _ = self.declare()
        if ready:
            return False
        self.channel.confirm_select()
        try:
            self.channel.basic_publish_confirm(
                WireMessage(TOKEN_BODY, content_type="application/json", delivery_mode=2),
                exchange="",
                routing_key=self.queue,
                mandatory=True,
            )
        except MessageNacked:
            return False  # the queue holds a token already (x-max-length, reject-publish)
        return True

    def consume(self) -> None:
        """Subscribe: the broker delivers the token to this channel when it makes it the active consumer."""
        self.channel.basic_qos(0, LEASE_PREFETCH, False)
        self.channel.basic_consume(
            self.queue, callback=self.on_delivery, no_ack=False, on_cancel=self._cancelled, consumer_tag=""
        )

    def on_delivery(self, message: WireMessage) -> None:
        """Keep the first token; acknowledge (remove) any surplus one."""
        tag = message.delivery_info["delivery_tag"]
        if self._held is not None:
            self.channel.basic_ack(tag)
            self.surplus_acked += 1
            return
        self._held = tag
        self._on_token()

    def _cancelled(self, consumer_tag: str) -> None:
        self._held = None
        self.cancelled = True
        self._on_cancel()

    def renew(self, timeout: float) -> None:
        """One round trip to the broker (``Basic.Qos``, unchanged), bounded by ``timeout``.

        Parameters:
            timeout: seconds to wait for the answer.

        Raises:
            TimeoutError: no answer in time (the connection may be dead: the caller drops it).
            amqp exceptions: the channel or connection is closed.
        """
        self.channel.send_method(spec.Basic.Qos, "lBb", (0, LEASE_PREFETCH, False))
        self.channel.wait(spec.Basic.QosOk, timeout=timeout)


__all__ = [
    "LEASE_CONSUMER_TIMEOUT_MS",
    "LEASE_DELIVERY_LIMIT",
    "LEASE_PREFETCH",
    "TOKEN_BODY",
    "LeaseChannel",
    "lease_queue_arguments",
]
