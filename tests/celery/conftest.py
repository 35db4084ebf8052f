"""Fixtures for the Celery adapter's tests: an ``ojs_celery.Celery`` app per test and a real worker.

Every app lives under the test's entity prefix (transport option ``prefix``), so
its queues (``{prefix}.ojs.queue.celery`` & co.) are deleted after the test.
The in-thread worker uses the ``threads`` pool: Celery's in-thread ``solo``
worker stalls with ``worker_prefetch_multiplier=1`` and ``acks_late`` (stock
Celery 5.7 too: the ack is queued on the hub and not run until the next event).
Time limits and lost workers need a process pool: see :func:`celery_subprocess_worker`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from celery.contrib.testing.worker import start_worker
from celery.worker import state as worker_state

from ojs_celery import Celery

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


@pytest.fixture
def celery_app(amqp_url: str, prefix: str) -> Iterator[Celery]:
    """An ``ojs_celery.Celery`` app on the session broker under the test's prefix, results via ``rpc://``."""
    app = Celery("ojs_tests", broker=amqp_url, broker_backend="ojs", backend="rpc://",
                 broker_transport_options={"prefix": prefix},
                 broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    app.set_current()
    yield app
    app.close()


@contextmanager
def running_worker(app: Celery, concurrency: int = 2, **kwargs) -> Iterator[object]:
    """A Celery worker in this process (``threads`` pool) consuming the app's default queue."""
    with start_worker(app, pool="threads", concurrency=concurrency, perform_ping_check=False,
                      loglevel="WARNING", shutdown_timeout=30, **kwargs) as worker:
        try:
            yield worker
        finally:
            # The hub may sleep up to 10 s in poll(): ask it to stop, then wake it.
            worker_state.should_terminate = 0
            if getattr(worker, "hub", None) is not None:
                worker.hub.call_soon(lambda: None)


@pytest.fixture
def worker_factory():
    """``with worker_factory(app): ...`` runs an in-thread worker."""
    return running_worker


@contextmanager
def subprocess_worker(amqp_url: str, prefix: str, *, concurrency: int = 1,
                      extra_env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """``celery worker`` (prefork pool) in a subprocess on ``tests/celery/worker_app.py``."""
    env = {**os.environ, "OJS_AMQP_URL": amqp_url, "OJS_TEST_PREFIX": prefix,
           "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}", **(extra_env or {})}
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"celery-worker-{prefix}.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "worker_app", "worker", "--pool=prefork",
         f"--concurrency={concurrency}", "--loglevel=INFO", "--without-gossip", "--without-mingle",
         "--without-heartbeat", "-n", f"w-{prefix}@%h"],
        cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture
def celery_subprocess_worker(amqp_url: str, prefix: str):
    """``with celery_subprocess_worker(): ...`` runs ``celery worker`` on ``worker_app`` in a subprocess."""
    def start(**kwargs):
        return subprocess_worker(amqp_url, prefix, **kwargs)
    return start
