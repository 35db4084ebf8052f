"""A Celery project on the OJS wire: the only change is the app constructor.

Run a worker and send a few tasks (a broker with the default guest account on
localhost, or ``$OJS_AMQP_URL``)::

    celery -A examples.celery_app worker --loglevel=INFO      # terminal 1
    python examples/celery_app.py                             # terminal 2
    celery -A examples.celery_app flower                      # optional: Flower, http://localhost:5555

Every task below is stock Celery code.  On the wire each call is an OJS job
envelope in ``ojs.queue.celery``; retries travel through
``ojs.queue.retry.celery.{ms}``, countdowns through the scheduling cascade,
and failures end in ``ojs.queue.dlx.celery``.  Any OJS producer (the
``ojs_kombu.Client`` at the end, or another language's client) can enqueue
work for these tasks by type: ``Reports.BuildPDF`` is ``reports.build_pdf``.
"""

from __future__ import annotations

import os
import random

from celery import chain

from ojs_celery import Celery  # was: from celery import Celery

BROKER = os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@localhost:5672//")

app = Celery("examples.celery_app", broker=BROKER, broker_backend="ojs", backend="rpc://")


@app.task
def add(x, y):
    return x + y


@app.task(bind=True, max_retries=5)
def fetch(self, url, *, timeout=10):
    try:
        if random.random() < 0.5:
            raise ConnectionError(f"{url} did not answer within {timeout}s")
        return f"fetched {url}"
    except ConnectionError as exc:
        raise self.retry(exc=exc, countdown=2**self.request.retries) from exc


@app.task(autoretry_for=(TimeoutError,), retry_backoff=True, retry_kwargs={"max_retries": 3})
def flaky_report(n):
    if random.random() < 0.3:
        raise TimeoutError("the database is slow today")
    return n * n


@app.task(name="Reports.BuildPDF")
def build_pdf(report_id, *, paper="A4"):
    return f"report-{report_id}-{paper}.pdf"


if __name__ == "__main__":
    from ojs_kombu import Client, job_type_for

    print(add.delay(2, 3).get(timeout=30))
    print(fetch.delay("https://example.com", timeout=5).get(timeout=120))
    print(chain(add.s(1, 2), add.s(10), flaky_report.s()).delay().get(timeout=120))
    print(add.apply_async((5, 5), countdown=3).get(timeout=30), "(three seconds later)")
    # The same task enqueued by a plain OJS producer: no Celery involved.
    with Client(BROKER) as client:
        job = client.enqueue(job_type_for("Reports.BuildPDF"), [7], queue="celery", kwargs={"paper": "Letter"})
        print("enqueued OJS job", job.id, "of type", job.type)
