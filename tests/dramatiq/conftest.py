"""Fixtures of the Dramatiq adapter's tests: an OjsBroker under the test's prefix, and real workers."""

from __future__ import annotations

from typing import Callable, Iterator

import dramatiq
import pytest

from ojs_dramatiq import OjsBroker


@pytest.fixture
def ojs_broker(amqp_url: str, prefix: str) -> Iterator[OjsBroker]:
    """An OjsBroker (Dramatiq's default middleware) under the test's prefix, set as the global broker."""
    broker = OjsBroker(amqp_url, prefix=prefix)
    previous = dramatiq.get_broker() if dramatiq.broker.global_broker is not None else None
    dramatiq.set_broker(broker)
    broker.emit_after("process_boot")  # what the dramatiq CLI does (starts TimeLimit's timer thread)
    yield broker
    broker.close()
    dramatiq.broker.global_broker = previous


@pytest.fixture
def start_worker(ojs_broker: OjsBroker) -> Iterator[Callable[..., dramatiq.Worker]]:
    """``start_worker(broker=ojs_broker, **options)``: a started ``dramatiq.Worker``, stopped after the test."""
    workers: list[dramatiq.Worker] = []

    def start(broker: OjsBroker | None = None, **options) -> dramatiq.Worker:
        options.setdefault("worker_timeout", 100)
        options.setdefault("worker_threads", 4)
        worker = dramatiq.Worker(broker or ojs_broker, **options)
        worker.start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop(timeout=10_000)
