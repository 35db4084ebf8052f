"""Building blocks of the framework fixtures, shared by ``tests/celery``, ``tests/dramatiq``
and the cross-framework tests (``tests/test_interop_celery_dramatiq.py``).

Fixtures in a sub-directory ``conftest.py`` are not visible to tests outside it,
so the setup lives here and the conftests wrap it in fixtures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
from celery import _state as celery_state
from celery.contrib.testing.worker import start_worker
from celery.worker import state as worker_state

from ojs_celery import Celery
from ojs_dramatiq import OjsBroker


def ojs_url(amqp_url: str) -> str:
    """The ``ojs://`` (``ojss://`` for TLS) URL of an AMQP URL."""
    scheme, sep, rest = amqp_url.partition("://")
    if not sep:
        raise ValueError(f"not a URL: {amqp_url!r}")
    return f"{'ojss' if scheme in ('amqps', 'ojss') else 'ojs'}://{rest}"


@contextmanager
def ojs_celery_app(broker: str, prefix: str, *, broker_backend: str | None = "ojs", **options: Any) -> Iterator[Celery]:
    """An ``ojs_celery.Celery`` app on ``broker`` under entity prefix ``prefix``, results via ``rpc://``.

    ``broker`` is an AMQP URL (with ``broker_backend="ojs"``) or an ``ojs://`` URL.
    The app is made current, and closed afterwards.  The shared tasks its tests defined are
    forgotten then: Celery adds every ``@app.task`` (``shared=True``) to each app finalized
    later, and a later test defining a task of the same name (the quorum and cluster modules
    run these tests again) would otherwise get the earlier test's function.
    """
    finalizers = set(celery_state._on_app_finalizers)
    options.setdefault("backend", "rpc://")
    app = Celery(
        "ojs_tests",
        broker=broker,
        broker_backend=broker_backend,
        broker_transport_options={"prefix": prefix},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        **options,
    )
    app.set_current()
    try:
        yield app
    finally:
        app.close()
        celery_state._on_app_finalizers.intersection_update(finalizers)


@contextmanager
def running_worker(app: Celery, concurrency: int = 2, **kwargs: Any) -> Iterator[object]:
    """A Celery worker in this process (``threads`` pool) consuming the app's default queue.

    ``kwargs`` go to the ``WorkController`` (``queues=["email"]`` & co.).  The
    ``threads`` pool, because Celery's in-thread ``solo`` worker stalls with
    ``worker_prefetch_multiplier=1`` and ``acks_late`` (stock Celery 5.7 too: the ack
    is queued on the hub and not run until the next event).
    """
    with start_worker(
        app,
        pool="threads",
        concurrency=concurrency,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=30,
        **kwargs,
    ) as worker:
        try:
            yield worker
        finally:
            # The hub may sleep up to 10 s in poll(): ask it to stop, then wake it.
            worker_state.should_terminate = 0
            if getattr(worker, "hub", None) is not None:
                worker.hub.call_soon(lambda: None)


@contextmanager
def global_ojs_broker(amqp_url: str, prefix: str, **options: Any) -> Iterator[OjsBroker]:
    """An OjsBroker (Dramatiq's default middleware) under ``prefix``, set as the global broker.

    The previous global broker is restored and the broker closed afterwards.
    """
    broker = OjsBroker(amqp_url, prefix=prefix, **options)
    previous = dramatiq.get_broker() if dramatiq.broker.global_broker is not None else None
    dramatiq.set_broker(broker)
    broker.emit_after("process_boot")  # what the dramatiq CLI does (starts TimeLimit's timer thread)
    try:
        yield broker
    finally:
        broker.close()
        dramatiq.broker.global_broker = previous


def new_dramatiq_worker(broker: OjsBroker, **options: Any) -> dramatiq.Worker:
    """A started ``dramatiq.Worker`` (``worker_timeout=100``, 4 threads unless given); the caller stops it."""
    options.setdefault("worker_timeout", 100)
    options.setdefault("worker_threads", 4)
    worker = dramatiq.Worker(broker, **options)
    worker.start()
    return worker


@contextmanager
def dramatiq_worker_starter(default_broker: OjsBroker) -> Iterator[Callable[..., dramatiq.Worker]]:
    """``start(broker=default_broker, **options)``: a started ``dramatiq.Worker``; every one stopped on exit."""
    workers: list[dramatiq.Worker] = []

    def start(broker: OjsBroker | None = None, **options: Any) -> dramatiq.Worker:
        worker = new_dramatiq_worker(broker or default_broker, **options)
        workers.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in workers:
            worker.stop(timeout=10_000)


@contextmanager
def dramatiq_worker(broker: OjsBroker, **options: Any) -> Iterator[dramatiq.Worker]:
    """A started ``dramatiq.Worker``, stopped on exit."""
    worker = new_dramatiq_worker(broker, **options)
    try:
        yield worker
    finally:
        worker.stop(timeout=10_000)
