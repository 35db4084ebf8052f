"""The AMQP metrics of binding §12.1, exported through ``prometheus_client``.

All metrics live in one :class:`Metrics` object (``METRICS``) registered with
prometheus_client's default registry, so ``prometheus_client.start_http_server``
or any exporter the application already runs picks them up.  Code elsewhere in
the library calls the small recording methods, never the Prometheus objects.
The per job type ``ojs_job_*`` metrics are in :mod:`ojs_kombu.observability.job_metrics`,
and :func:`~ojs_kombu.observability.server.serve_metrics` serves them all over HTTP.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram


def _bucket_values(histogram: Histogram) -> tuple[tuple[float, ...], list[Any], Any] | None:
    """A histogram's upper bounds, per-bucket values and sum value (prometheus_client's own
    attributes, which ``observe`` increments), or None when this prometheus_client has other ones."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if not isinstance(bounds, list | tuple) or not isinstance(buckets, list) or len(bounds) != len(buckets):
        return None
    if not all(hasattr(value, "inc") for value in (*buckets, total)):
        return None
    return tuple(bounds), buckets, total


class Metrics:
    """The ``ojs_amqp_*`` metrics, with one recording method per event."""

    def __init__(self, registry: CollectorRegistry = REGISTRY):
        self.connections_active = Gauge(
            "ojs_amqp_connections_active", "Number of active AMQP connections", registry=registry
        )
        self.channels_active = Gauge("ojs_amqp_channels_active", "Number of active AMQP channels", registry=registry)
        self.messages_published = Counter(
            "ojs_amqp_messages_published_total", "Total messages published", ["queue"], registry=registry
        )
        self.messages_consumed = Counter(
            "ojs_amqp_messages_consumed_total", "Total messages consumed", ["queue"], registry=registry
        )
        self.messages_acked = Counter(
            "ojs_amqp_messages_acked_total", "Total messages acknowledged", ["queue"], registry=registry
        )
        self.messages_nacked = Counter(
            "ojs_amqp_messages_nacked_total", "Total messages negatively acknowledged", ["queue"], registry=registry
        )
        self.messages_returned = Counter(
            "ojs_amqp_messages_returned_total", "Total messages returned via Basic.Return", ["queue"], registry=registry
        )
        self.publish_nacked = Counter(
            "ojs_amqp_publish_nacked_total",
            "Publishes the broker answered with Basic.Nack",
            ["queue"],
            registry=registry,
        )
        self.messages_unacked = Gauge(
            "ojs_amqp_messages_unacked", "Current unacknowledged message count", ["consumer"], registry=registry
        )
        self.consumer_utilization = Gauge(
            "ojs_amqp_consumer_utilization",
            "Consumer utilization ratio (0.0-1.0): share of the consumer's prefetch window holding unsettled jobs",
            ["queue"],
            registry=registry,
        )
        self.confirm_latency = Histogram(
            "ojs_amqp_publish_confirm_latency_seconds",
            "Publisher confirm latency",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self._confirm_buckets = _bucket_values(self.confirm_latency)
        self._published: dict[str, Any] = {}
        self._unacked: dict[str, Any] = {}
        self._utilization: dict[str, Any] = {}
        self.reconnections = Counter("ojs_amqp_reconnections_total", "Total reconnection attempts", registry=registry)
        self.consumer_cancellations = Counter(
            "ojs_amqp_consumer_cancellations_total",
            "Broker-initiated consumer cancellations (Basic.Cancel)",
            ["queue"],
            registry=registry,
        )
        self.jobs_deduplicated = Counter(
            "ojs_amqp_jobs_deduplicated_total",
            "Deliveries acked without running: their job id had completed already (Worker(deduplicate=True))",
            ["queue"],
            registry=registry,
        )
        self.jobs_cancelled = Counter(
            "ojs_amqp_jobs_cancelled_total",
            "Jobs cancelled (Client.cancel): dropped on delivery (state=pending) or while running (state=running)",
            ["queue", "state"],
            registry=registry,
        )

    def published(self, queue: str, count: int = 1) -> None:
        """``count`` job messages were published to ``queue`` (a pipelined batch counts once)."""
        counter = self._published.get(queue)
        if counter is None:  # labels() costs more than the increment: keep the children
            counter = self._published[queue] = self.messages_published.labels(queue)
        counter.inc(count)

    def confirmed(self, latency: float) -> None:
        """A publish was confirmed ``latency`` seconds after it was sent."""
        self.confirm_latency.observe(latency)

    def confirmed_many(self, latencies: Sequence[float]) -> None:
        """Publishes were confirmed these many seconds after they were sent (one ``Basic.Ack``).

        What ``confirmed`` for each records, counted per bucket first: a multiple ack settles
        hundreds of publishes, and ``Histogram.observe`` takes two locks and walks the buckets
        per call (~9k instructions).  Without the histogram's bucket and sum values (another
        ``prometheus_client``), each latency is observed.
        """
        if self._confirm_buckets is None:
            for latency in latencies:
                self.confirm_latency.observe(latency)
            return
        bounds, buckets, total = self._confirm_buckets
        counts = [0] * len(bounds)
        for latency in latencies:
            counts[bisect_left(bounds, latency)] += 1  # the first bucket whose bound is >= it, as observe
        total.inc(sum(latencies))
        for bucket, count in zip(buckets, counts, strict=True):
            if count:
                bucket.inc(count)

    def returned(self, queue: str) -> None:
        """A publish to ``queue`` came back with Basic.Return."""
        self.messages_returned.labels(queue).inc()

    def nacked_publish(self, queue: str) -> None:
        """The broker refused a publish to ``queue`` with Basic.Nack."""
        self.publish_nacked.labels(queue).inc()

    def cancelled(self, queue: str, state: str) -> None:
        """A cancelled job of ``queue`` was acked without running (``pending``) or while running (``running``)."""
        self.jobs_cancelled.labels(queue, state).inc()

    def deduplicated(self, queue: str) -> None:
        """A delivery of ``queue`` whose job had completed already was acked without running."""
        self.jobs_deduplicated.labels(queue).inc()

    def reconnected(self) -> None:
        """A reconnection attempt was made."""
        self.reconnections.inc()

    def channels_opened(self, count: int = 1) -> None:
        """``count`` long-lived AMQP channels (consuming, publishing) were opened."""
        self.channels_active.inc(count)

    def channels_closed(self, count: int = 1) -> None:
        """``count`` channels counted by :meth:`channels_opened` were closed or lost."""
        self.channels_active.dec(count)

    def unacked(self, consumer: str, count: int) -> None:
        """Consumer ``consumer`` (its connection name) holds ``count`` deliveries unsettled."""
        gauge = self._unacked.get(consumer)
        if gauge is None:  # labels() costs more than the set: keep the children
            gauge = self._unacked[consumer] = self.messages_unacked.labels(consumer)
        gauge.set(count)

    def utilization(self, queue: str, ratio: float) -> None:
        """The share (0.0-1.0) of the prefetch window on ``queue`` that holds unsettled deliveries:
        1.0 means the consumer takes no more jobs from ``queue`` until it settles one."""
        gauge = self._utilization.get(queue)
        if gauge is None:
            gauge = self._utilization[queue] = self.consumer_utilization.labels(queue)
        gauge.set(ratio)


#: The process-wide metrics.
METRICS = Metrics()

__all__ = ["METRICS", "Metrics"]
