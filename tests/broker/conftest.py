"""Fixtures shared by the broker tests of ``ojs_kombu.Worker`` and of the cron scheduler."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cron_support import FAST_LEASE, Jobs

from ojs_kombu import CronRegistry, CronScheduler, Worker


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


@pytest.fixture
def registry(amqp_url, names):
    with CronRegistry.connect(amqp_url, names=names) as made:
        yield made


@pytest.fixture
def schedulers(amqp_url, names):
    made: list[CronScheduler] = []

    def make(count: int = 1) -> list[CronScheduler]:
        batch = [CronScheduler(amqp_url, names=names, lease_options=FAST_LEASE).start() for _ in range(count)]
        made.extend(batch)
        return batch

    yield make
    for scheduler in made:
        scheduler.stop()


@pytest.fixture
def jobs(amqp_url, names):
    opened: list[Jobs] = []

    def make(queue: str) -> Jobs:
        opened.append(Jobs(amqp_url, names.job_queue(queue)))
        return opened[-1]

    yield make
    for found in opened:
        found.close()


@pytest.fixture
def slow_worker(amqp_url, prefix):
    """A worker of the queue ``slow`` publishing job events, whose ``cron.slow`` jobs run until released."""

    release = threading.Event()
    started: list[str] = []
    worker = Worker(amqp_url, queues=["slow"], prefix=prefix, events=True, concurrency=1)

    def slow() -> None:
        from ojs_kombu import current_job

        started.append(current_job().id)
        while not release.is_set():
            time.sleep(0.01)

    worker.handler("cron.slow", slow)
    worker.start()
    assert worker.wait_until_ready()
    yield release, started
    release.set()
    worker.stop(timeout=10)
