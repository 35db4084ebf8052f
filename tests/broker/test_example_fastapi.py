"""``examples/fastapi_app.py``: its endpoints' coroutines over a real broker, with the example's
async worker; the HTTP layer too when FastAPI (and httpx, for its TestClient) is installed."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from support import message_count, wait_until

from ojs_kombu import AsyncClient

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app.py"


@pytest.fixture(scope="module")
def example() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("fastapi_app_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_the_endpoints_coroutines_enqueue_report_and_cancel(example, amqp_url, prefix, names):
    worker = example.make_worker(amqp_url, prefix, grace_period=5)
    worker.start()
    try:
        assert worker.wait_until_ready(15)

        async def scenario() -> tuple[list[dict], dict, dict]:
            async with AsyncClient(amqp_url, prefix=prefix) as client:
                submitted = await asyncio.gather(*(example.submit_report(client, f"user{i}") for i in range(50)))
                first = submitted[0]["job_id"]
                await asyncio.to_thread(
                    wait_until,
                    lambda: (i := worker.activity.lookup(first)) is not None and i.state == "completed",
                    10,
                )
                status = await example.report_status(client, first)
                cancelled = await example.cancel_report(client, submitted[-1]["job_id"])
                return submitted, status, cancelled

        submitted, status, cancelled = asyncio.run(scenario())
        assert len({s["job_id"] for s in submitted}) == 50 and {s["queue"] for s in submitted} == {"reports"}
        assert status == {"job_id": submitted[0]["job_id"], "state": "completed"}
        assert cancelled == {"job_id": submitted[-1]["job_id"], "cancelled": True}
        wait_until(lambda: message_count(amqp_url, names.job_queue("reports")) == 0, message="all reports taken")
    finally:
        worker.stop(timeout=5)


def test_the_http_endpoints(example, amqp_url, prefix, monkeypatch):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    with TestClient(example.create_app(amqp_url, prefix)) as http:
        response = http.post("/reports", json={"user": "ada"})
        assert response.status_code == 202
        job_id = response.json()["job_id"]
        assert http.get(f"/reports/{job_id}").json() == {"job_id": job_id, "state": "unknown"}  # no worker
        assert http.delete(f"/reports/{job_id}").json() == {"job_id": job_id, "cancelled": True}
