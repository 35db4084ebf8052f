"""Flower over ``ojs://`` (issue 29 item 5): its queue views show the OJS job queues under their Celery names.

A real Flower (``celery -A worker_app flower``) in a subprocess, a real broker and, for the
workers' queues, a real ``celery worker``: ``/api/queues/length`` and the broker page read
``{prefix}.ojs.queue.reports-high`` as ``Reports_High`` with its exact ready count.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from support import ojs_url, raw_channel, wait_until

from ojs_celery import Celery
from ojs_celery.flower import OjsBroker, install, management_root

pytest.importorskip("flower")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

MAPPED = "Reports_High"  # its OJS queue is reports-high


@contextmanager
def flower_process(amqp_url: str, prefix: str, *args: str, queues: str = "") -> Iterator[str]:
    """``celery -A worker_app flower`` on a free port; yields its base URL."""
    env = {
        **os.environ,
        "OJS_AMQP_URL": amqp_url,
        "OJS_TEST_PREFIX": prefix,
        "OJS_TEST_QUEUES": queues,
        "FLOWER_UNAUTHENTICATED_API": "1",
        "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
    }
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"flower-{prefix}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "worker_app", "flower", "--address=127.0.0.1", "--port=0", *args],
            cwd=HERE,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:

            def port() -> str | None:
                if process.poll() is not None:
                    raise AssertionError(f"flower exited with {process.returncode}: {log_path.read_text()}")
                found = re.search(r"Visit me at (http://127\.0\.0\.1:\d+)", log_path.read_text())
                return found[1] if found else None

            yield wait_until(port, timeout=60, interval=0.1, message="Flower's HTTP server")
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def queue_lengths(base: str) -> dict[str, dict]:
    response = requests.get(f"{base}/api/queues/length", timeout=30)
    assert response.status_code == 200, response.text
    return {q["name"]: q for q in response.json()["active_queues"]}


@pytest.fixture
def producer(amqp_url, prefix):
    app = Celery(
        "worker_app",
        broker=amqp_url,
        broker_backend="ojs",
        backend="rpc://",
        broker_transport_options={"prefix": prefix},
    )
    yield app
    app.close()


def test_queue_lengths_and_broker_page_show_the_celery_queues(amqp_url, prefix, names, broker, producer):
    """No worker: Flower asks for the app's task_queues; each comes back under its Celery name with its
    exact ready count, and the management API (--broker_api) fills in the unacked column."""
    for i in range(7):
        producer.send_task("worker_app.echo", (i,), queue=MAPPED)
    for i in range(3):
        producer.send_task("worker_app.echo", (i,), queue="celery")
    host = broker.management_url.split("://", 1)[1].rstrip("/")
    broker_api = f"http://{broker.management_user}:{broker.management_password}@{host}/api/"
    with flower_process(amqp_url, prefix, f"--broker_api={broker_api}", queues=f"{MAPPED},celery") as base:
        lengths = queue_lengths(base)
        assert {name: q["messages_ready"] for name, q in lengths.items()} == {MAPPED: 7, "celery": 3}
        assert lengths[MAPPED]["queue"] == names.job_queue("reports-high")
        assert lengths["celery"]["queue"] == names.job_queue("celery")
        assert all(q["consumers"] == 0 for q in lengths.values())
        # The management API samples its statistics: a queue declared a moment ago has none yet.
        lengths = wait_until(
            lambda: (found := queue_lengths(base))[MAPPED]["messages_unacknowledged"] is not None and found,
            timeout=20,
            interval=0.5,
            message="the management API's statistics of the queue",
        )
        assert lengths[MAPPED]["messages_unacknowledged"] == 0
        assert lengths[MAPPED]["messages"] == 7

        page = requests.get(f"{base}/broker", timeout=30)
        assert page.status_code == 200
        row = re.search(rf'<tr id="{MAPPED}">(.*?)</tr>', page.text, re.S)
        assert row is not None, page.text
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row[1], re.S)
        assert cells[0] == MAPPED
        assert cells[3] == "7"  # Ready
        assert "is not supported" not in page.text


def test_the_workers_queues_with_their_consumers(amqp_url, prefix, celery_subprocess_worker, producer):
    """With a worker, Flower asks for the queues the worker consumes (not in Flower's own app config):
    reported with the worker as consumer, drained once the worker ran the tasks."""
    with celery_subprocess_worker(extra_env={"OJS_TEST_QUEUES": MAPPED}):
        with flower_process(amqp_url, prefix, "--broker_api=http://127.0.0.1:1/api/") as base:

            def worker_seen() -> bool:
                workers = requests.get(f"{base}/api/workers", params={"refresh": 1}, timeout=30).json()
                return any(q["name"] == MAPPED for info in workers.values() for q in info.get("active_queues") or [])

            wait_until(worker_seen, timeout=60, interval=0.5, message="Flower to see the worker's queues")
            results = [producer.send_task("worker_app.echo", (i,), queue=MAPPED) for i in range(4)]
            assert [r.get(timeout=60) for r in results] == [0, 1, 2, 3]
            lengths = wait_until(
                lambda: (found := queue_lengths(base)).get(MAPPED, {}).get("messages_ready") == 0 and found,
                timeout=60,
                interval=0.5,
                message="the worker to drain the queue",
            )
            assert set(lengths) == {MAPPED}  # the worker's queues, not Flower's app's default "celery"
            assert lengths[MAPPED]["consumers"] == 1
            # The management API at --broker_api does not answer: its columns are unknown, the counts are not.
            assert lengths[MAPPED]["messages_unacknowledged"] is None


def test_reads_job_queues_and_plain_queues_without_a_management_api(amqp_url, prefix, names, client, monkeypatch):
    """In-process: no management API; a job queue by its mapped name, a plain (non-OJS) queue by its
    own name, a queue that does not exist left out (as Flower's RabbitMQ client does)."""
    monkeypatch.setenv("OJS_MANAGEMENT_URL", "")
    for i in range(2):
        client.enqueue("echo", [i], queue="reports-high")
    plain = f"{prefix}.plain"
    with raw_channel(amqp_url) as channel:
        channel.queue_declare(plain, durable=True)
        for _ in range(3):
            channel.basic_publish("", plain, b"{}")
    wait_until(lambda: client.queue_counts([plain])[plain].ready == 3, message="the plain queue's messages")
    broker = OjsBroker(ojs_url(amqp_url), broker_options={"prefix": prefix})
    rows = broker.read([MAPPED, plain, "missing"])
    assert rows == [
        {
            "name": MAPPED,
            "messages": 2,
            "messages_ready": 2,
            "messages_unacknowledged": None,
            "consumers": 0,
            "idle_since": None,
            "queue": names.job_queue("reports-high"),
        },
        {
            "name": plain,
            "messages": 3,
            "messages_ready": 3,
            "messages_unacknowledged": None,
            "consumers": 0,
            "idle_since": None,
            "queue": plain,
        },
    ]


def test_an_unreachable_broker_reads_as_no_queues(caplog):
    started = time.monotonic()
    assert OjsBroker("ojs://guest:secret@127.0.0.1:1//").read(["celery"]) == []
    assert time.monotonic() - started < 10
    assert "could not be read" in caplog.text
    assert "secret" not in caplog.text


def test_install_serves_ojs_schemes_and_leaves_the_others_to_flower():
    from flower.utils.broker import Broker, RabbitMQ

    install()
    install()  # idempotent: one wrapper, not two
    assert isinstance(Broker("ojs://guest:guest@localhost//", http_api=None), OjsBroker)
    assert isinstance(Broker("ojss://guest:guest@localhost//"), OjsBroker)
    assert isinstance(Broker("amqp://guest:guest@localhost//", http_api=None), RabbitMQ)
    with pytest.raises(NotImplementedError):
        Broker("sqs://")
    stock = Broker.__new__.ojs_stock_new
    assert not hasattr(stock, "ojs_stock_new")


def test_options_flower_passes():
    broker = OjsBroker(
        "ojs://u:p@h//",
        http_api="http://admin:pw@mgmt:15672/api/",
        broker_options={"prefix": "tenant1", "passthrough_queues": ["legacy"]},
    )
    assert broker.management_url == "http://admin:pw@mgmt:15672/"
    assert broker.amqp_queues(MAPPED) == ["tenant1.ojs.queue.reports-high", MAPPED]
    assert broker.amqp_queues("legacy") == ["legacy"]
    assert broker.amqp_queues("dlx.x") == ["dlx.x"]  # no OJS name maps to it: a plain queue or nothing


@pytest.mark.parametrize(
    ("broker_api", "root"),
    [
        ("http://guest:guest@localhost:15672/api/", "http://guest:guest@localhost:15672/"),
        ("http://localhost:15672/api", "http://localhost:15672/"),
        ("https://h/rabbit/api/", "https://h/rabbit"),
        ("http://h:15672/api/apivhost", "http://h:15672/"),
        ("http://h:15672/", "http://h:15672/"),
        ("http://h:15672", "http://h:15672/"),
    ],
)
def test_management_root(broker_api, root):
    assert management_root(broker_api) == root
