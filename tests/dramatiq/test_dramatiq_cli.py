"""The ``dramatiq`` CLI in a subprocess on OjsBroker: running actors, graceful shutdown, a killed worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import pytest
from support import get_messages, message_count, raw_channel, wait_until

from ojs_dramatiq import OjsBroker
from ojs_kombu.wire.headers import Header

pytestmark = pytest.mark.timeout(180)

APPS = Path(__file__).parent / "apps"


class Cli:
    """``dramatiq cli_app`` in a subprocess, recording runs to a file."""

    def __init__(self, amqp_url: str, prefix: str, record: Path, threads: int = 1):
        env = {**os.environ, "OJS_AMQP_URL": amqp_url, "OJS_TEST_PREFIX": prefix, "OJS_TEST_RECORD": str(record)}
        self.record = record
        self.log = record.with_suffix(f".{time.monotonic_ns()}.log")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dramatiq",
                "cli_app",
                "--processes",
                "1",
                "--threads",
                str(threads),
                "--path",
                str(APPS),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )

    def records(self) -> list[dict]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def wait_for(self, predicate, timeout: float = 60.0) -> list[dict]:
        return wait_until(
            lambda: (lambda r: r if predicate(r) else None)(self.records()),
            timeout,
            message=f"records; CLI log:\n{self.log.read_text()[-3000:]}",
        )

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


@pytest.fixture
def cli(amqp_url, prefix, tmp_path):
    started: list[Cli] = []

    def start(threads: int = 1) -> Cli:
        process = Cli(amqp_url, prefix, tmp_path / "record.jsonl", threads)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


@pytest.fixture
def sender(amqp_url, prefix):
    """The CLI app's actors, declared on a sending-only broker of the test process."""
    broker = OjsBroker(amqp_url, prefix=prefix)
    actors = {
        name: dramatiq.Actor(
            lambda *a, **k: None, broker=broker, actor_name=name, queue_name=queue, priority=0, options=options
        )
        for name, queue, options in (
            ("Greet", "cli", {}),
            ("slow", "cli", {}),
            ("kill_once", "cli-kill", {"max_retries": 3, "min_backoff": 50}),
        )
    }
    yield actors
    broker.close()


def test_cli_runs_actors_and_hands_back_unstarted_messages_on_sigterm(cli, sender, amqp_url, names):
    worker = cli(threads=1)
    sender["Greet"].send("ada", greeting="hi")
    records = worker.wait_for(lambda r: len(r) == 1)
    assert records[0]["text"] == "hi ada" and records[0]["retries"] == 0

    for n in range(4):
        sender["slow"].send(n)
    worker.wait_for(lambda r: any(x.get("event") == "start" for x in r))
    assert worker.stop() == 0  # graceful: the running job finishes, the prefetched one is handed back
    slow_runs = [r for r in worker.records() if r["actor"] == "slow"]
    assert [r["event"] for r in slow_runs] == ["start", "end"]
    left = get_messages(amqp_url, names.job_queue("cli"), 3)
    assert len(left) == 3 and message_count(amqp_url, names.job_queue("cli")) == 0
    assert sorted(json.loads(body)["args"][0] for _, _, body in left) == sorted({0, 1, 2, 3} - {slow_runs[0]["n"]})
    assert all(props.headers[Header.ATTEMPT] == 1 and not method.redelivered for method, props, _ in left)


def test_a_worker_killed_mid_job_costs_the_job_an_attempt(cli, sender, amqp_url, names):
    first = cli()
    message = sender["kill_once"].send("k")
    assert first.process.wait(60) != 0  # SIGKILL of the worker process: the CLI shuts down
    assert first.records() == []
    second = cli()
    records = second.wait_for(lambda r: len(r) == 1)
    assert records[0]["retries"] == 1  # the lost attempt was counted
    assert records[0]["message_id"] == message.message_id
    assert second.stop() == 0


def test_a_job_that_always_loses_its_worker_ends_in_the_dlq(ojs_broker, start_worker, amqp_url, names):
    runs = []

    @dramatiq.actor(queue_name="lost", max_retries=0)
    def lost():
        runs.append(1)

    lost.send()
    # A consumer takes the message and vanishes without acking: RabbitMQ redelivers it.
    with raw_channel(amqp_url) as channel:
        wait_until(lambda: channel.basic_get(names.job_queue("lost"), auto_ack=False)[0], 10)
    start_worker()
    wait_until(lambda: message_count(amqp_url, names.dead_letter_queue("lost")) == 1, 20)
    ((_, properties, _),) = get_messages(amqp_url, names.dead_letter_queue("lost"), 1)
    assert properties.headers["x-death"][0]["reason"] == "rejected"
    assert runs == []
