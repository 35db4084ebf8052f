"""Fixtures for the Celery adapter's tests: an ``ojs_celery.Celery`` app per test and a real worker.

Every app lives under the test's entity prefix (transport option ``prefix``), so
its queues (``{prefix}.ojs.queue.celery`` & co.) are deleted after the test.
The in-thread worker uses the ``threads`` pool (see :func:`frameworks.running_worker`,
shared with the cross-framework tests).
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
from frameworks import ojs_celery_app, running_worker

from ojs_celery import Celery

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


@pytest.fixture
def celery_app(amqp_url: str, prefix: str) -> Iterator[Celery]:
    """An ``ojs_celery.Celery`` app on the session broker under the test's prefix, results via ``rpc://``."""
    with ojs_celery_app(amqp_url, prefix) as app:
        yield app


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
