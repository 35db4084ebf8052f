"""Copied as ``tests/common.py`` next to Dramatiq's own test suite (extracted from its sdist at
test time) by ``tests/dramatiq/test_dramatiq_peer_suite.py``: the helpers its tests import."""

import os
import platform
from contextlib import contextmanager

import pika
import pytest
from dramatiq import Worker

RABBITMQ_USERNAME = os.getenv("RABBITMQ_USERNAME", "guest")
RABBITMQ_PASSWORD = os.getenv("RABBITMQ_PASSWORD", "guest")
RABBITMQ_CREDENTIALS = pika.credentials.PlainCredentials(RABBITMQ_USERNAME, RABBITMQ_PASSWORD)

skip_in_ci = pytest.mark.skipif(os.getenv("CI") is not None, reason="skipped in CI")
skip_on_windows = pytest.mark.skipif(platform.system() == "Windows", reason="skipped on Windows")
skip_on_pypy = pytest.mark.skipif(platform.python_implementation() == "PyPy", reason="no time limits on PyPy")
# The tests marked so build their own RabbitmqBroker on 127.0.0.1:5672: not ours to test.
skip_unless_rabbit_mq = pytest.mark.skip(reason="builds a stock RabbitmqBroker on the default port")


@contextmanager
def worker(*args, **kwargs):
    worker = Worker(*args, **kwargs)
    try:
        worker.start()
        yield worker
    finally:
        worker.stop()
