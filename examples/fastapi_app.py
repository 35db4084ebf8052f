"""A FastAPI service that enqueues OJS jobs without blocking its event loop, and a worker whose
handlers are ``async def``.

    pip install fastapi uvicorn
    # the service (the broker is $OJS_AMQP_URL):
    uvicorn fastapi_app:app --app-dir examples
    curl -X POST localhost:8000/reports -H 'content-type: application/json' -d '{"user": "ada"}'
    curl localhost:8000/reports/<job_id>
    curl -X DELETE localhost:8000/reports/<job_id>

    # the worker, in another shell: 100 reports at once on one event loop
    python examples/fastapi_app.py worker

The request handlers only ``await`` the :class:`~ojs_kombu.AsyncClient`, whose broker I/O runs
on a thread of its own: concurrent requests' enqueues are published together as one batch.
The functions below take the client as an argument, so they run (and are tested) without FastAPI.
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations, and the
# classes they name are local to create_app().
import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ojs_kombu import AsyncClient, Worker, current_job

PREFIX = os.environ.get("OJS_PREFIX", "")
QUEUE = "reports"

logger = logging.getLogger("fastapi_app")


# -- what the endpoints do ---------------------------------------------------------------------


async def submit_report(client: AsyncClient, user: str) -> dict[str, Any]:
    """Enqueue a ``report.build`` job for ``user``; the response carries its id."""
    job = await client.enqueue("report.build", [user], queue=QUEUE)
    return {"job_id": job.id, "queue": job.queue}


async def report_status(client: AsyncClient, job_id: str) -> dict[str, Any]:
    """What the workers know about the job (INFO); ``unknown`` when none answers within 1 s."""
    info = await client.info(job_id, queue=QUEUE, timeout=1.0)
    return {"job_id": job_id, "state": info.state if info is not None else "unknown"}


async def cancel_report(client: AsyncClient, job_id: str) -> dict[str, Any]:
    """Cancel the job wherever it is (queued, waiting for a retry or running)."""
    await client.cancel(job_id, queue=QUEUE)
    return {"job_id": job_id, "cancelled": True}


# -- the FastAPI application -------------------------------------------------------------------


def create_app(url: str | None = None, prefix: str = PREFIX) -> Any:
    """The FastAPI application: one AsyncClient opened and closed by its lifespan."""
    from fastapi import FastAPI, Request  # here: the rest of the module runs without FastAPI
    from pydantic import BaseModel

    class ReportRequest(BaseModel):
        user: str

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncClient(url, prefix=prefix, queues=[QUEUE]) as client:
            app.state.ojs = client
            yield

    app = FastAPI(title="reports", lifespan=lifespan)

    @app.post("/reports", status_code=202)
    async def post_report(body: ReportRequest, request: Request) -> dict[str, Any]:
        return await submit_report(request.app.state.ojs, body.user)

    @app.get("/reports/{job_id}")
    async def get_report(job_id: str, request: Request) -> dict[str, Any]:
        return await report_status(request.app.state.ojs, job_id)

    @app.delete("/reports/{job_id}")
    async def delete_report(job_id: str, request: Request) -> dict[str, Any]:
        return await cancel_report(request.app.state.ojs, job_id)

    return app


try:
    app = create_app()  # for uvicorn fastapi_app:app; it connects when it starts
except ImportError:  # FastAPI is not installed
    app = None


# -- the worker --------------------------------------------------------------------------------


def make_worker(url: str | None = None, prefix: str = PREFIX, **options: Any) -> Worker:
    """A worker of the ``reports`` queue whose handler is a coroutine: 100 reports run at once on
    the worker's one event loop."""
    options.setdefault("concurrency", 100)
    worker = Worker(url, queues=[QUEUE], prefix=prefix, **options)

    @worker.handler("report.build")
    async def build_report(user: str) -> None:
        await asyncio.sleep(0.2)  # an awaited HTTP call, database query ...
        logger.info("report for %s built (job %s, attempt %d)", user, current_job().id, current_job().attempt)

    return worker


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if sys.argv[1:] == ["worker"]:
        make_worker().run()
    else:
        print(__doc__)
