"""The recording methods of the ``ojs_amqp_*`` metrics, on a registry of their own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from ojs_kombu.observability.metrics import Metrics


def test_gauges_of_the_consumer_window_and_channels() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)

    metrics.channels_opened(2)
    metrics.channels_opened(2)
    metrics.channels_closed(2)
    metrics.unacked("worker a", 3)
    metrics.unacked("worker a", 1)
    metrics.utilization("email", 0.75)

    assert registry.get_sample_value("ojs_amqp_channels_active") == 2
    assert registry.get_sample_value("ojs_amqp_messages_unacked", {"consumer": "worker a"}) == 1
    assert registry.get_sample_value("ojs_amqp_consumer_utilization", {"queue": "email"}) == 0.75
