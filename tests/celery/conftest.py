"""Fixtures for the Celery adapter's tests: an ``ojs_celery.Celery`` app per test and a real worker.

Every app lives under the test's entity prefix (transport option ``prefix``), so
its queues (``{prefix}.ojs.queue.celery`` & co.) are deleted after the test.
The in-thread worker uses the ``threads`` pool (see :func:`frameworks.running_worker`,
shared with the cross-framework tests).
Time limits and lost workers need a process pool: see :func:`celery_subprocess_worker`.
Chords need a result backend that supports them: :func:`redis_url` is a Redis server for the
session (``$OJS_REDIS_URL``, else a private ``redis-server``; see :mod:`tools.redis`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from frameworks import ojs_celery_app, running_worker

from ojs_celery import Celery
from tools.redis import RedisServerError, provision_redis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


@pytest.fixture
def celery_app(amqp_url: str, prefix: str) -> Iterator[Celery]:
    """An ``ojs_celery.Celery`` app on the session broker under the test's prefix, results via ``rpc://``."""
    with ojs_celery_app(amqp_url, prefix) as app:
        yield app


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis server for the whole session (Celery's Redis result backend), stopped at the end.

    ``$OJS_REDIS_URL`` when set, else a private ``redis-server`` on a free port with its own
    directory under ``.cache/redis``.  Celery's result keys carry task and group ids, so tests
    share the server without stepping on each other.
    """
    try:
        with provision_redis(ROOT / ".cache" / "redis") as url:
            yield url
    except RedisServerError as exc:
        pytest.fail(f"no Redis server for the result backend: {exc}")


@pytest.fixture
def celery_redis_app(amqp_url: str, prefix: str, redis_url: str) -> Iterator[Celery]:
    """Like :func:`celery_app`, with results (and chord counters) in the session's Redis.

    One backend for all threads (``result_backend_thread_safe``): the in-thread worker's
    threads subscribe to the results of the tasks they publish, and a per-thread backend would
    keep those subscriptions past the test.  The pub/sub connection is closed (ending every
    subscription) while Redis still runs, so results freed later, at exit, after the session
    has stopped the server, have nothing left to unsubscribe from.
    """
    with ojs_celery_app(amqp_url, prefix, backend=redis_url, result_backend_thread_safe=True) as app:
        yield app
        consumer = app.backend.result_consumer
        consumer.stop()
        consumer.subscribed_to.clear()


@pytest.fixture
def worker_factory():
    """``with worker_factory(app): ...`` runs an in-thread worker."""
    return running_worker


@contextmanager
def subprocess_worker(
    amqp_url: str, prefix: str, *, concurrency: int = 1, extra_env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """``celery worker`` (prefork pool) in a subprocess on ``tests/celery/worker_app.py``."""
    env = {
        **os.environ,
        "OJS_AMQP_URL": amqp_url,
        "OJS_TEST_PREFIX": prefix,
        "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
        **(extra_env or {}),
    }
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"celery-worker-{prefix}.log", "w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker_app",
            "worker",
            "--pool=prefork",
            f"--concurrency={concurrency}",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-n",
            f"w-{prefix}@%h",
        ],
        cwd=HERE,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
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
