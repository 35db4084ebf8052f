"""Per rate limit key metrics (``ojs_rate_limit_*``, ``ojs-rate-limiting.md`` §11.2), read from the workers' limiters.

:class:`LimitMetrics` is a prometheus_client collector: every
:class:`~ojs_kombu.runtime.limits.Limiter` (one per :class:`~ojs_kombu.Worker`) is watched by the
process-wide ``LIMIT_METRICS``, which reads them at each scrape.  Each process reports its own
share; summed over the processes (``sum by (key)``) they are the key's totals.

==================================  ======================  ===========================================
metric                              labels                  what
==================================  ======================  ===========================================
``ojs_rate_limit_active``           key                     gauge: permits of the key this process's
                                                            jobs hold now (jobs running under it)
``ojs_rate_limit_waiting``          key                     gauge: jobs of this process waiting for a
                                                            permit of the key (parked, ``on_limit``
                                                            ``"wait"``)
``ojs_rate_limit_exceeded_total``   key, strategy           counter: jobs a limit kept from starting
                                                            when they arrived (``strategy``
                                                            ``"concurrency"``)
==================================  ======================  ===========================================
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

_ACTIVE = ("ojs_rate_limit_active", "Permits of the key held by this process's running jobs")
_WAITING = ("ojs_rate_limit_waiting", "Jobs of this process waiting for a permit of the key")
_EXCEEDED = ("ojs_rate_limit_exceeded", "Jobs a rate limit kept from starting when they arrived")


class LimitSource(Protocol):
    """What a :class:`~ojs_kombu.runtime.limits.Limiter` offers the metrics."""

    def snapshot(self) -> Iterable[tuple[str, int, int, Mapping[str, int]]]:
        """``(key, active, waiting, {strategy: exceeded})`` per key."""


class LimitMetrics:
    """The ``ojs_rate_limit_*`` collector (see the module docstring).

    Parameters:
        registry: where the metrics are registered (default: prometheus_client's default registry).

    Raises:
        ValueError: ``registry`` has ``ojs_rate_limit_*`` metrics already.
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY):
        self._sources: weakref.WeakSet[LimitSource] = weakref.WeakSet()
        self._lock = threading.Lock()
        registry.register(self)

    def watch(self, source: LimitSource) -> None:
        """Read ``source`` at each scrape, while it lives.

        Parameters:
            source: a worker's limiter.
        """
        with self._lock:
            self._sources.add(source)

    def describe(self) -> list[Metric]:
        """The families this collector exposes, without samples (the registry reserves their names)."""
        return [
            GaugeMetricFamily(*_ACTIVE, labels=("key",)),
            GaugeMetricFamily(*_WAITING, labels=("key",)),
            CounterMetricFamily(*_EXCEEDED, labels=("key", "strategy")),
        ]

    def collect(self) -> Iterator[Metric]:
        """The metrics as a scrape reads them, summed over this process's limiters.

        Yields:
            ``ojs_rate_limit_active``, ``ojs_rate_limit_waiting`` and ``ojs_rate_limit_exceeded`` (a counter).
        """
        with self._lock:
            sources = list(self._sources)
        totals: dict[str, list[int]] = {}
        exceeded_totals: dict[tuple[str, str], int] = {}
        for source in sources:
            for key, active, waiting, exceeded in source.snapshot():
                row = totals.setdefault(key, [0, 0])
                row[0] += active
                row[1] += waiting
                for strategy, count in exceeded.items():
                    exceeded_totals[(key, strategy)] = exceeded_totals.get((key, strategy), 0) + count
        active_family = GaugeMetricFamily(*_ACTIVE, labels=("key",))
        waiting_family = GaugeMetricFamily(*_WAITING, labels=("key",))
        exceeded_family = CounterMetricFamily(*_EXCEEDED, labels=("key", "strategy"))
        for key in sorted(totals):
            active, waiting = totals[key]
            active_family.add_metric((key,), active)
            waiting_family.add_metric((key,), waiting)
        for (key, strategy), count in sorted(exceeded_totals.items()):
            exceeded_family.add_metric((key, strategy), count)
        yield active_family
        yield waiting_family
        yield exceeded_family


#: The process-wide per key limit metrics, in prometheus_client's default registry.
LIMIT_METRICS = LimitMetrics()

__all__ = ["LIMIT_METRICS", "LimitMetrics", "LimitSource"]
