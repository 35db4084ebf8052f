"""The Prometheus endpoint of a worker (``Worker(metrics_port=…)``, ``ojs-amqp worker --metrics-port``),
scraped over HTTP after real jobs ran: per job type runtime, outcomes, queue wait and lateness."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import wait_until

from ojs_kombu import RetryPolicy
from ojs_kombu.errors import MetricsServerError

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

#: What each "work.run" job takes: the runtime the histogram must see.
WORK_SECONDS = 0.2


def scrape(url: str) -> Samples:
    """Every sample the endpoint serves, by (name, labels)."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def listener() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_scrape_shows_runtime_outcomes_queue_wait_and_lateness(client, worker_factory, prefix):
    queue = f"metrics-{prefix}"  # the metrics of this test alone: the registry is the process's
    worker = worker_factory((queue,), metrics_port=0, concurrency=4)
    worker.handler("work.run", lambda: threading.Event().wait(WORK_SECONDS))  # the job's work, not a sync
    worker.handler("work.fail", lambda: 1 / 0)
    worker.start()
    assert worker.wait_until_ready()
    server = worker.metrics_server
    assert server is not None and server.host == "127.0.0.1"  # loopback unless told otherwise
    url = server.url

    for _ in range(3):
        client.enqueue("work.run", [], queue=queue)
    client.enqueue("work.fail", [], queue=queue, retry=RetryPolicy(max_attempts=2, initial_interval="PT0.1S"))
    scheduled = client.enqueue("work.run", [], queue=queue, scheduled_at=timedelta(seconds=1))

    def settled() -> Samples | None:
        samples = scrape(url)
        done = value(samples, "ojs_job_outcomes_total", queue=queue, type="work.run", outcome="succeeded") == 4
        dead = value(samples, "ojs_job_outcomes_total", queue=queue, type="work.fail", outcome="dead-lettered")
        return samples if done and dead == 1 else None

    samples = wait_until(settled, timeout=30, message="4 jobs succeeded and 1 dead-lettered, seen by a scrape")

    run = {"queue": queue, "type": "work.run"}
    fail = {"queue": queue, "type": "work.fail"}
    outcomes = {
        outcome: value(samples, "ojs_job_outcomes_total", **fail, outcome=outcome)
        for outcome in ("succeeded", "failed", "retried", "dead-lettered")
    }
    assert outcomes == {"succeeded": 0, "failed": 2, "retried": 1, "dead-lettered": 1}
    assert value(samples, "ojs_job_runtime_seconds_count", **run) == 4
    assert WORK_SECONDS * 4 <= value(samples, "ojs_job_runtime_seconds_sum", **run) < 10
    assert value(samples, "ojs_job_runtime_seconds_count", **fail) == 2  # one per attempt
    # Queue wait: the first attempt of each job (4 work.run, 1 work.fail).
    assert value(samples, "ojs_job_queue_wait_seconds_count", **run) == 4
    assert value(samples, "ojs_job_queue_wait_seconds_count", **fail) == 1
    assert value(samples, "ojs_job_queue_wait_seconds_sum", **run) < 10
    # Lateness: the scheduled job alone, started at or after its scheduled_at (never early) within seconds.
    assert value(samples, "ojs_job_schedule_lateness_seconds_count", **run) == 1
    lateness = value(samples, "ojs_job_schedule_lateness_seconds_sum", **run)
    assert 0 <= lateness < 5, lateness
    info = worker.activity.lookup(scheduled.id)
    assert info is not None and info.started_at is not None and scheduled.scheduled_datetime is not None
    assert info.started_at >= scheduled.scheduled_datetime
    # The binding's §12.1 metrics come from the same endpoint.
    assert value(samples, "ojs_amqp_messages_acked_total", queue=queue) >= 4

    worker.stop()
    assert worker.metrics_server is server
    with pytest.raises(urllib.error.URLError):  # stop() closed the endpoint
        scrape(url)
    with socket.socket() as sock:  # and freed its port (what a restarted worker binds again)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", server.port))


def test_a_metrics_port_in_use_is_a_typed_error_at_start(worker_factory, listener):
    worker = worker_factory(metrics_port=listener)
    threads = threading.active_count()

    with pytest.raises(MetricsServerError, match=f"127.0.0.1:{listener}"):
        worker.start()
    assert worker.metrics_server is None
    assert threading.active_count() == threads  # no handler, consumer or beacon thread was started
    worker.stop()  # a worker that never started stops at once


# -- ojs-amqp worker --metrics-port ----------------------------------------------------------------

APP = """
import os

from ojs_kombu import Worker

worker = Worker(prefix=os.environ["APP_PREFIX"], queues=[os.environ["APP_QUEUE"]], concurrency=1, grace_period=5)


@worker.handler("cli.job")
def run():
    pass
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def run_cli(tmp_path, amqp_url, prefix) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """``run_cli(*argv)``: ``ojs-amqp worker app:worker *argv`` from a project holding ``APP``; killed at the end."""
    (tmp_path / "app.py").write_text(APP, encoding="utf-8")
    environment = {**os.environ, "OJS_AMQP_URL": amqp_url, "APP_PREFIX": prefix, "APP_QUEUE": f"cli-{prefix}"}
    environment.pop("PYTHONPATH", None)
    script = Path(sys.executable).with_name("ojs-amqp")  # the console script, as a user runs it
    processes: list[subprocess.Popen[str]] = []

    def start(*argv: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [str(script), "worker", "app:worker", *argv],
            cwd=tmp_path,
            env=environment,
            text=True,
            stderr=subprocess.PIPE,
        )
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def test_worker_command_serves_metrics_on_the_given_port_and_host(run_cli, client, prefix):
    port = free_port()
    process = run_cli("--metrics-port", str(port), "--metrics-host", "127.0.0.2")  # another loopback address
    client.enqueue("cli.job", [], queue=f"cli-{prefix}")
    labels = {"queue": f"cli-{prefix}", "type": "cli.job", "outcome": "succeeded"}

    def succeeded() -> bool:
        try:
            return value(scrape(f"http://127.0.0.2:{port}/metrics"), "ojs_job_outcomes_total", **labels) == 1
        except urllib.error.URLError:  # not listening yet
            return False

    wait_until(succeeded, timeout=30, message="the job's outcome on the worker's endpoint")
    with pytest.raises(urllib.error.URLError):  # bound to the given host only
        scrape(f"http://127.0.0.1:{port}/metrics")
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err


def test_worker_command_exits_1_when_the_metrics_port_is_in_use(run_cli, listener):
    process = run_cli("--metrics-port", str(listener))
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert f"ojs-amqp: MetricsServerError: cannot serve metrics on 127.0.0.1:{listener}" in err
