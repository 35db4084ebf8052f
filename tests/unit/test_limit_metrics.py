"""``ojs_rate_limit_*`` (ojs-rate-limiting.md §11.2): per key, summed over a process's limiters, gone with them."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry, generate_latest

from ojs_kombu.observability.limit_metrics import LimitMetrics


class _Source:
    def __init__(self, rows: list[tuple[str, int, int, dict[str, int]]]) -> None:
        self.rows = rows

    def snapshot(self) -> list[tuple[str, int, int, dict[str, int]]]:
        return self.rows


def test_limit_metrics_sum_the_limiters_per_key_and_forget_a_dropped_one() -> None:
    registry = CollectorRegistry()
    metrics = LimitMetrics(registry)
    one, two = (
        _Source([("api", 2, 1, {"concurrency": 5, "rate": 1}), ("tenant:a", 0, 0, {"concurrency": 1})]),
        _Source([("api", 1, 3, {"concurrency": 2})]),
    )
    metrics.watch(one)
    metrics.watch(two)
    text = generate_latest(registry).decode()
    assert 'ojs_rate_limit_active{key="api"} 3.0' in text
    assert 'ojs_rate_limit_waiting{key="api"} 4.0' in text
    assert 'ojs_rate_limit_exceeded_total{key="api",strategy="concurrency"} 7.0' in text
    assert 'ojs_rate_limit_exceeded_total{key="api",strategy="rate"} 1.0' in text
    assert 'ojs_rate_limit_active{key="tenant:a"} 0.0' in text
    assert "# TYPE ojs_rate_limit_active gauge" in text and "# TYPE ojs_rate_limit_exceeded_total counter" in text
    del two
    gc.collect()
    text = generate_latest(registry).decode()
    assert 'ojs_rate_limit_active{key="api"} 2.0' in text  # a stopped worker's limiter is no longer read
