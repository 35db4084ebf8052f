"""Fixtures shared by the broker tests of ``ojs_kombu.Worker``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ojs_kombu import Worker


@pytest.fixture
def worker_factory(amqp_url: str, prefix: str) -> Iterator[Callable[..., Worker]]:
    """``make(queues=("default",), **options)``: a Worker on the session broker under the test's prefix.

    ``grace_period`` defaults to 5 s; every worker made is stopped after the test.
    """
    workers: list[Worker] = []

    def make(queues: tuple[str, ...] = ("default",), **options: Any) -> Worker:
        options.setdefault("grace_period", 5)
        worker = Worker(amqp_url, queues=queues, prefix=prefix, **options)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.stop(timeout=5)
