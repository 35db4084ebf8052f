"""The recording methods of the ``ojs_amqp_*`` metrics, on a registry of their own."""

from __future__ import annotations

import pytest
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


def confirm_samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in registry.collect()
        if metric.name == "ojs_amqp_publish_confirm_latency_seconds"
        for sample in metric.samples
        if not sample.name.endswith("_created")
    }


def test_confirmed_many_records_what_confirmed_records_for_each() -> None:
    # Bounds exactly, between them, beyond the last, zero and negative (a clock step back).
    latencies = [0.0005, 0.0004, 0.001, 0.003, 0.05, 0.0501, 0.3, 10, 11.5, 0.0, -0.001, 0.025, 0.025]
    one_by_one, together = CollectorRegistry(), CollectorRegistry()
    each, many = Metrics(one_by_one), Metrics(together)
    for latency in latencies:
        each.confirmed(latency)
    many.confirmed_many(latencies[:5])
    many.confirmed_many([])
    many.confirmed_many(latencies[5:])
    expected, got = confirm_samples(one_by_one), confirm_samples(together)
    total = ("ojs_amqp_publish_confirm_latency_seconds_sum", ())
    assert got.pop(total) == pytest.approx(expected.pop(total), rel=1e-12)  # added in another order
    assert got == expected  # every bucket and the count
    assert together.get_sample_value("ojs_amqp_publish_confirm_latency_seconds_count") == len(latencies)


def test_confirmed_many_observes_each_without_the_histograms_values() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics._confirm_buckets = None  # another prometheus_client: no bucket values to add to
    metrics.confirmed_many([0.001, 0.2])
    assert metrics.confirm_latency._sum.get() == pytest.approx(0.201)  # type: ignore[attr-defined]
