"""The job queues one channel consumes: pause, resume and the broker's ``Basic.Cancel``.

Shared by the :class:`~ojs_kombu.runtime.consumer.Consumer` (the Worker's and Dramatiq's
loop) and the ``ojs://`` transport's channel (Celery), which differ only in how they
consume and cancel (a :class:`Subscriber`) and in what follows a broker cancel: the
consumer consumes again after a delay (:meth:`Subscriptions.broker_cancelled` with a
``retry_delay``, then :meth:`Subscriptions.due`), the transport lets kombu restart its
consumer.

Pause and resume (``ControlReader.paused``): :meth:`Subscriptions.apply` compares the paused
set with each subscription's state; a paused queue's consumer is cancelled (``Basic.Cancel``;
its unsettled deliveries are still settled on the channel) and a resumed queue is consumed
again.  A queue paused when it is added is not consumed at all.  A broker cancel is logged and
counted in ``ojs_amqp_consumer_cancellations_total{queue}``, labelled with the OJS queue name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Container, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ojs_kombu.observability.metrics import METRICS

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Subscription:
    """One job queue consumed on a channel.

    ``tag`` is the consumer tag it is (or was last) consumed with; ``consuming`` whether the
    broker delivers it now; ``retry_at`` when to consume again after a broker cancel.
    """

    amqp_queue: str
    ojs_queue: str
    tag: str = ""
    paused: bool = False
    consuming: bool = False
    retry_at: float | None = None


S = TypeVar("S", bound=Subscription)
S_contra = TypeVar("S_contra", bound=Subscription, contravariant=True)


class Subscriber(Protocol[S_contra]):
    """How a channel consumes and cancels (``Basic.Consume`` / ``Basic.Cancel``)."""

    def consume(self, subscription: S_contra) -> str:
        """Consume ``subscription``'s queue; return its consumer tag."""

    def cancel(self, subscription: S_contra) -> None:
        """Cancel ``subscription``'s consumer (``subscription.tag``)."""


class Subscriptions(Generic[S]):
    """The subscriptions of one channel.

    Parameters:
        subscriber: consumes and cancels on the channel.
    """

    def __init__(self, subscriber: Subscriber[S]) -> None:
        self._subscriber = subscriber
        self._all: list[S] = []
        self._retrying: list[S] = []  # those with a retry_at
        #: Consumer tag -> the subscription the broker delivers with it now.
        self.by_tag: dict[str, S] = {}

    def __iter__(self) -> Iterator[S]:
        """The subscriptions (a copy: safe to change them meanwhile)."""
        return iter(list(self._all))

    def clear(self) -> None:
        """Forget every subscription (the channel is gone; nothing is cancelled)."""
        self._all.clear()
        self._retrying.clear()
        self.by_tag.clear()

    @property
    def consuming(self) -> bool:
        """Whether the broker delivers for any subscription now."""
        return bool(self.by_tag)

    def add(self, subscription: S, paused: Container[str], *, consume: bool = True) -> S:
        """Register ``subscription``; consume it unless its queue is in ``paused`` (or ``consume`` is False).

        Parameters:
            subscription: the queue to consume.
            paused: the OJS queues paused now.
            consume: False registers it without consuming (consumed by a later :meth:`apply`).

        Returns:
            ``subscription``.
        """
        self._all.append(subscription)
        if subscription.ojs_queue in paused:
            subscription.paused = True
            logger.info("queue %s is paused: not consuming %s", subscription.ojs_queue, subscription.amqp_queue)
        elif consume:
            self.start(subscription)
        return subscription

    def start(self, subscription: S) -> None:
        """Consume ``subscription`` now."""
        self._no_retry(subscription)
        tag = self._subscriber.consume(subscription)
        subscription.tag = tag
        subscription.consuming = True
        self.by_tag[tag] = subscription

    def _stop(self, subscription: S) -> None:
        # Cancel first: what the broker delivers until its Basic.CancelOk (read while the cancel
        # waits for it) still belongs to the subscription's queue.
        self._subscriber.cancel(subscription)
        subscription.consuming = False
        self.by_tag.pop(subscription.tag, None)

    def find(self, tag: str) -> S | None:
        """The subscription last consumed with ``tag`` (consuming, paused or cancelled by the broker)."""
        for subscription in self._all:
            if subscription.tag == tag:
                return subscription
        return None

    def remove(self, tag: str) -> S | None:
        """Forget the subscription of ``tag`` (its consumer is cancelled by the caller, if it consumes)."""
        subscription = self.find(tag)
        if subscription is not None:
            self._no_retry(subscription)
            self._all.remove(subscription)
            if self.by_tag.get(tag) is subscription:
                del self.by_tag[tag]
        return subscription

    def apply(self, paused: Container[str], *, resume: bool = True) -> None:
        """Cancel the consumers of the queues in ``paused``; consume the resumed ones again.

        Parameters:
            paused: the OJS queues paused now.
            resume: False leaves resumed queues unconsumed (the consumer is stopping).
        """
        for subscription in list(self._all):
            pause = subscription.ojs_queue in paused
            if pause == subscription.paused:
                continue
            subscription.paused = pause
            if pause:
                self._no_retry(subscription)  # a broker cancel is consumed again on resume instead
                if subscription.consuming:
                    self._stop(subscription)
                    logger.info(
                        "queue %s paused: stopped consuming %s", subscription.ojs_queue, subscription.amqp_queue
                    )
                else:
                    logger.info("queue %s is paused: not consuming %s", subscription.ojs_queue, subscription.amqp_queue)
            elif resume and not subscription.consuming and subscription.retry_at is None:
                self.start(subscription)
                logger.info("queue %s resumed: consuming %s again", subscription.ojs_queue, subscription.amqp_queue)

    def cancel_all(self) -> None:
        """Cancel every consumer (no new deliveries); nothing is consumed again after a broker cancel."""
        for subscription in list(self._all):
            self._no_retry(subscription)
            if subscription.consuming:
                self._stop(subscription)

    def broker_cancelled(self, tag: str, retry_delay: float | None, then: str) -> S | None:
        """The broker cancelled the consumer of ``tag`` (``Basic.Cancel``: e.g. its queue was deleted).

        Logged and counted (``ojs_amqp_consumer_cancellations_total{queue}``, the OJS queue name).

        Parameters:
            tag: the cancelled consumer's tag.
            retry_delay: seconds after which :meth:`due` returns it, to consume again; None: never.
            then: what follows, for the log.

        Returns:
            The subscription, or None for a tag that is not consuming.
        """
        subscription = self.by_tag.pop(tag, None)
        if subscription is None:
            return None
        subscription.consuming = False
        METRICS.consumer_cancellations.labels(subscription.ojs_queue).inc()
        logger.warning("the broker cancelled the consumer of %s (Basic.Cancel); %s", subscription.amqp_queue, then)
        if retry_delay is not None:
            self._no_retry(subscription)
            subscription.retry_at = time.monotonic() + retry_delay
            self._retrying.append(subscription)
        return subscription

    @property
    def retrying(self) -> bool:
        """Whether a subscription waits to be consumed again after a broker cancel."""
        return bool(self._retrying)

    def due(self) -> list[S]:
        """The subscriptions whose re-consume after a broker cancel is due now (their ``retry_at`` cleared)."""
        now = time.monotonic()
        found = [s for s in self._retrying if s.retry_at is not None and s.retry_at <= now]
        for subscription in found:
            self._no_retry(subscription)
        return found

    def _no_retry(self, subscription: S) -> None:
        if subscription.retry_at is not None:
            subscription.retry_at = None
            self._retrying.remove(subscription)


__all__ = ["Subscriber", "Subscription", "Subscriptions"]
