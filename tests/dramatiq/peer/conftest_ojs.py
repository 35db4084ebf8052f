"""Copied as ``tests/conftest.py`` next to Dramatiq's own test suite (extracted from its sdist at
test time) by ``tests/dramatiq/test_dramatiq_peer_suite.py``.

It maps the suite's broker fixtures onto :class:`ojs_dramatiq.OjsBroker` on the
broker named by ``$OJS_AMQP_URL``, under one entity prefix for the session
(``flush_all()`` after each test, as upstream does on its shared broker; every
entity of the prefix is deleted at the end through ``$OJS_MANAGEMENT_URL``):

* ``rabbitmq_broker`` is a plain ``OjsBroker(max_priority=10)``;
* ``stub_broker`` is an ``OjsBroker`` with the two test conveniences of
  Dramatiq's ``StubBroker`` the generic tests rely on: ``dead_letters`` and
  ``join(queue, fail_fast=...)``, which re-raises the exception of a message
  that was dead-lettered while joining;
* result and rate limiter backends are Dramatiq's in-process stub backends
  (no Redis, no memcached).
"""

import logging
import os
import uuid
from collections import defaultdict

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.middleware import Middleware
from dramatiq.rate_limits import backends as rl_backends
from dramatiq.results import backends as res_backends

from ojs_dramatiq import OjsBroker
from ojs_kombu.amqp.management import ManagementClient

logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(threadName)s] [%(name)s] [%(levelname)s] %(message)s")
logging.getLogger("ojs_kombu").setLevel(logging.WARNING)

AMQP_URL = os.environ["OJS_AMQP_URL"]


def _management():
    url = os.environ.get("OJS_MANAGEMENT_URL")
    if not url:
        return None
    return ManagementClient(
        url, os.environ.get("OJS_MANAGEMENT_USER", "guest"), os.environ.get("OJS_MANAGEMENT_PASSWORD", "guest")
    )


class _DeadLetterRecorder(Middleware):
    def after_nack(self, broker, message):
        broker.dead_letters_by_queue[message.queue_name].append((message, message._exception))


class StubCompatibleOjsBroker(OjsBroker):
    """OjsBroker plus what StubBroker offers tests: ``dead_letters`` and a fail-fast ``join``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dead_letters_by_queue = defaultdict(list)
        self.fail_fast_default = True
        self.add_middleware(_DeadLetterRecorder())

    @property
    def dead_letters(self):
        return [message for letters in self.dead_letters_by_queue.values() for message, _ in letters]

    def join(self, queue_name, min_successes=3, idle_time=30, *, timeout=None, fail_fast=None):
        super().join(queue_name, min_successes, idle_time, timeout=timeout)
        if self.fail_fast_default if fail_fast is None else fail_fast:
            for _, exception in self.dead_letters_by_queue[queue_name]:
                raise exception or Exception("Message failed with unknown error")

    def flush_all(self):
        super().flush_all()
        for letters in self.dead_letters_by_queue.values():
            letters.clear()


PREFIX = f"peer{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session", autouse=True)
def _entities():
    """Declare the prefix's scheduling cascade once (its 35 queues take ~0.5 s); delete everything at the end."""
    broker = OjsBroker(AMQP_URL, prefix=PREFIX, max_priority=10)
    broker.get_queue_message_counts("default")
    broker.close()
    yield
    management = _management()
    if management is not None:
        management.delete_by_prefix(PREFIX + ".")


def _broker(cls, **options):
    broker = cls(AMQP_URL, prefix=PREFIX, max_priority=10, **options)
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    yield broker
    try:
        broker.flush_all()
    finally:
        broker.close()


@pytest.fixture
def stub_broker():
    yield from _broker(StubCompatibleOjsBroker)


@pytest.fixture
def rabbitmq_broker():
    yield from _broker(OjsBroker)


@pytest.fixture
def stub_worker(stub_broker):
    worker = Worker(stub_broker, worker_timeout=100, worker_threads=32)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def rabbitmq_worker(rabbitmq_broker):
    worker = Worker(rabbitmq_broker, worker_threads=32)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def info_logging():
    logger = logging.getLogger()
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(logging.DEBUG)


@pytest.fixture
def stub_rate_limiter_backend():
    return rl_backends.StubBackend()


@pytest.fixture(params=["stub"])
def rate_limiter_backend(request):
    return rl_backends.StubBackend()


@pytest.fixture
def stub_result_backend():
    return res_backends.StubBackend()


@pytest.fixture(params=["stub"])
def result_backend(request):
    return res_backends.StubBackend()
