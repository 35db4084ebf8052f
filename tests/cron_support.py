"""Helpers of the cron scheduler's broker tests (``test_cron_scheduler``, ``test_cron_conformance``).

The fixtures built on them (``registry``, ``schedulers``, ``jobs``, ``slow_worker``) are in ``tests/broker/conftest.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from ojs_kombu.model.cron import tick_job_id
from ojs_kombu.model.timefmt import parse_timestamp
from ojs_kombu.wire.events import decode_cron_event

FAST_LEASE = {"heartbeat": 4.0, "renew_interval": 0.5, "renew_timeout": 1.5}


def wait_for(condition: Callable[[], Any], timeout: float, what: str, step: float = 0.02) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(step)
    return time.monotonic() - started


class Jobs:
    """The jobs arriving in one OJS queue, taken as they come (polled with ``basic_get``)."""

    def __init__(self, url: str, amqp_queue: str) -> None:
        self.conn = Connection(url)
        self.channel = self.conn.default_channel
        self.amqp_queue = amqp_queue
        self.received: list[tuple[float, dict[str, Any]]] = []

    def poll(self) -> list[dict[str, Any]]:
        self.channel.queue_declare(self.amqp_queue, passive=True)
        while (message := self.channel.basic_get(self.amqp_queue, no_ack=True)) is not None:
            self.received.append((time.monotonic(), json.loads(message.body)))
        return self.bodies

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, body in self.received]

    def count(self) -> int:
        try:
            return len(self.poll())
        except Exception:  # noqa: BLE001 - the queue is declared by the first tick
            self.channel = self.conn.default_channel
            return 0

    def close(self) -> None:
        self.conn.release()


def check_tick(body: dict[str, Any], name: str) -> None:
    """A tick's job carries the cron name and its scheduled time, and its id derives from both."""
    assert body["meta"]["cron_name"] == name
    scheduled = parse_timestamp(body["meta"]["cron_triggered_at"])
    assert body["id"] == tick_job_id(name, scheduled)


def cron_events(amqp_url: str, names, expected: int) -> list[Any]:
    """The cron events of the events stream, read from its start until ``expected`` of them came."""
    found: list[Any] = []
    with Connection(amqp_url) as conn:
        conn.connect()
        channel = conn.connection.channel()
        channel.auto_decode = False
        channel.basic_qos(0, 100, False)

        def on_message(message) -> None:
            channel.basic_ack(message.delivery_info["delivery_tag"])
            event = decode_cron_event(message.body, dict(message.properties))
            if event is not None:
                found.append(event)

        channel.basic_consume(names.events_stream, callback=on_message, arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + 15
        while len(found) < expected and time.monotonic() < deadline:
            try:
                conn.connection.drain_events(timeout=0.5)
            except TimeoutError:
                pass
    return found


CHILD = "import sys; from ojs_kombu.cli import main; sys.exit(main())"


def start_cli_scheduler(amqp_url: str, prefix: str) -> subprocess.Popen[str]:
    environ = {**os.environ, "OJS_AMQP_URL": amqp_url}
    environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, "cron", "run", "--prefix", prefix, "--log-level", "warning"],
        env=environ,
        text=True,
        stderr=subprocess.PIPE,
    )
