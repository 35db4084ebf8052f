"""Fixtures of the Dramatiq adapter's tests: an OjsBroker under the test's prefix, and real workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import dramatiq
import pytest
from frameworks import dramatiq_worker_starter, global_ojs_broker

from ojs_dramatiq import OjsBroker


@pytest.fixture
def ojs_broker(amqp_url: str, prefix: str) -> Iterator[OjsBroker]:
    """An OjsBroker (Dramatiq's default middleware) under the test's prefix, set as the global broker."""
    with global_ojs_broker(amqp_url, prefix) as broker:
        yield broker


@pytest.fixture
def start_worker(ojs_broker: OjsBroker) -> Iterator[Callable[..., dramatiq.Worker]]:
    """``start_worker(broker=ojs_broker, **options)``: a started ``dramatiq.Worker``, stopped after the test."""
    with dramatiq_worker_starter(ojs_broker) as start:
        yield start
