"""The consumer's per-queue counters and its delivery window gauges.

``ojs_amqp_messages_consumed`` / ``_acked`` / ``_nacked{queue}`` are counted per message
through :class:`QueueCounters` (``labels()`` costs more than the increment, so the
children are cached).  ``ojs_amqp_messages_unacked{consumer}`` (label: the connection
name) and ``ojs_amqp_consumer_utilization{queue}`` (unsettled deliveries of the queue over
the prefetch count) are recorded by :meth:`Window.record`, once per loop pass, not per
message, and drop to 0 when the connection is lost (the broker takes those deliveries back).
"""

from __future__ import annotations

from typing import Any

from ojs_kombu.observability.metrics import METRICS


class QueueCounters:
    """``family.labels(queue)`` for a per-queue counter family, cached."""

    def __init__(self) -> None:
        self._children: dict[tuple[Any, str], Any] = {}

    def __call__(self, family: Any, queue: str) -> Any:  # prometheus_client children are untyped
        """The child of ``family`` for ``queue``."""
        child = self._children.get((family, queue))
        if child is None:
            child = self._children[(family, queue)] = family.labels(queue)
        return child


class Window:
    """The deliveries of one consumer connection not settled yet, per OJS queue.

    Parameters:
        connection_name: the ``consumer`` label of the unacked gauge.
        prefetch: the prefetch count per consumer (utilization's denominator).
        queues: the OJS queues consumed.
    """

    def __init__(self, connection_name: str, prefetch: int, queues: list[str]) -> None:
        self.connection_name = connection_name
        self.prefetch = prefetch
        self.counter = QueueCounters()
        self._unacked: dict[str, int] = dict.fromkeys(queues, 0)
        self._consumed: dict[str, Any] = {}  # queue -> its child of messages_consumed (per delivery: no call)
        #: A delivery or a settle since the last :meth:`record`.
        self.changed = True

    @property
    def unsettled(self) -> int:
        """Deliveries not settled yet, every queue together."""
        return sum(self._unacked.values())

    def delivered(self, queue: str) -> None:
        """One delivery of ``queue``: counted, and in the window until settled."""
        child = self._consumed.get(queue)
        if child is None:
            child = self._consumed[queue] = self.counter(METRICS.messages_consumed, queue)
        child.inc()
        self._unacked[queue] = self._unacked.get(queue, 0) + 1
        self.changed = True

    def settled(self, queue: str, family: Any) -> None:
        """One delivery of ``queue`` acked or nacked: counted in ``family``, out of the window."""
        self.counter(family, queue).inc()
        self._unacked[queue] = max(0, self._unacked.get(queue, 0) - 1)
        self.changed = True

    def forget(self) -> None:
        """The connection is lost: the broker takes the unsettled deliveries back."""
        for queue in self._unacked:
            self._unacked[queue] = 0
        self.record()

    def record(self) -> None:
        """Publish the unacked and utilization gauges."""
        self.changed = False
        METRICS.unacked(self.connection_name, sum(self._unacked.values()))
        for queue, count in self._unacked.items():
            METRICS.utilization(queue, min(1.0, count / self.prefetch) if self.prefetch > 0 else 0.0)


__all__ = ["QueueCounters", "Window"]
