"""The job queue consumers of an ``ojs://`` channel, as the runtime's subscriptions see them.

A framework's ``Basic.Consume`` of a job queue becomes a :class:`JobConsumer`, which the channel's
:class:`~ojs_kombu.runtime.subscriptions.Subscriptions` can cancel (a pause, a broker cancel) and
consume again with the framework's own tag (a resume) through :class:`JobSubscriber`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import amqp
from kombu.transport import pyamqp

from ojs_kombu.runtime.subscriptions import Subscription


@dataclass(eq=False, kw_only=True)
class JobConsumer(Subscription):
    """A consumer of a job queue: what it takes to consume it again after a pause.

    Its ``tag`` is the framework's consumer tag: it stays valid across a pause and resume.
    """

    deliver: Callable[[amqp.Message], Any]
    on_cancel: Callable[[str], Any]
    no_local: bool
    no_ack: bool
    exclusive: bool
    nowait: bool
    arguments: dict[str, Any] | None
    argsig: str
    framework_queue: str
    callback: Callable[[Any], Any]


class JobSubscriber:
    """A channel's job queue consumers as a :class:`~ojs_kombu.runtime.subscriptions.Subscriber`."""

    def __init__(self, channel: pyamqp.Channel) -> None:
        self._channel = channel

    def consume(self, consumer: JobConsumer) -> str:
        """``Basic.Consume`` ``ojs.queue.{q}`` with the framework's tag, callback and arguments."""
        tag: str = pyamqp.Channel.basic_consume(
            self._channel,
            consumer.amqp_queue,
            consumer.tag,
            consumer.no_local,
            consumer.no_ack,
            consumer.exclusive,
            consumer.nowait,
            callback=consumer.deliver,
            arguments=consumer.arguments,
            on_cancel=consumer.on_cancel,
            argsig=consumer.argsig,
        )
        return tag

    def cancel(self, consumer: JobConsumer) -> None:
        """``Basic.Cancel`` the consumer (a pause: the framework's tag stays valid)."""
        pyamqp.Channel.basic_cancel(self._channel, consumer.tag)


__all__ = ["JobConsumer", "JobSubscriber"]
