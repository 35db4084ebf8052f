"""Jobs cross frameworks: OJS producers -> Celery tasks, Celery -> ojs_kombu.Worker and raw pika."""

from __future__ import annotations

import json
import threading

import pytest
from support import raw_channel, wait_until

from ojs_kombu import Worker, job_type_for
from tools.schema import validate_job

pytestmark = pytest.mark.broker


def test_a_job_from_ojs_kombu_client_runs_as_a_celery_task(celery_app, worker_factory, client):
    seen = []
    done = threading.Event()

    @celery_app.task(name="Billing.ChargeCard", bind=True)
    def charge(self, customer, amount, *, currency="EUR"):
        seen.append((customer, amount, currency, self.request.id, self.request.retries))
        done.set()

    job = client.enqueue(
        job_type_for("Billing.ChargeCard"), ["cust-1", 12.5], queue="celery", kwargs={"currency": "CHF"}
    )
    assert job.type == "billing.charge_card"
    with worker_factory(celery_app):
        assert done.wait(20)
    assert seen == [("cust-1", 12.5, "CHF", job.id, 0)]


def test_celery_delay_is_consumed_by_an_ojs_kombu_worker(celery_app, amqp_url, prefix):
    @celery_app.task(name="Reports.BuildPDF")
    def build_pdf(report_id, *, fmt="A4"):
        raise AssertionError("runs on the ojs_kombu worker, not here")

    received = []
    worker = Worker(amqp_url, queues=["celery"], prefix=prefix, concurrency=1)

    @worker.handler("reports.build_pdf")
    def handle(report_id, *, fmt="A4"):
        received.append((report_id, fmt))

    with worker:
        result = build_pdf.delay(9, fmt="Letter")
        wait_until(lambda: received, timeout=20, message="the ojs_kombu worker to run the job")
    assert received == [(9, "Letter")]
    assert result.id  # a UUIDv7


def test_celery_delay_is_read_by_a_raw_pika_consumer(celery_app, amqp_url, names):
    @celery_app.task
    def add(x, y):
        return x + y

    result = add.apply_async((2, 3), countdown=0)
    messages = []
    with raw_channel(amqp_url) as channel:

        def on_message(ch, method, properties, body):
            messages.append((properties, json.loads(body)))
            ch.basic_ack(method.delivery_tag)
            ch.stop_consuming()

        channel.basic_qos(prefetch_count=1)
        channel.basic_consume(names.job_queue("celery"), on_message)
        channel.connection.call_later(10, channel.stop_consuming)
        channel.start_consuming()
    [(properties, envelope)] = messages
    validate_job(envelope)
    assert envelope["id"] == result.id == properties.message_id
    assert envelope["args"] == [2, 3] and envelope["specversion"] == "1.0"
    assert properties.content_type == "application/openjobspec+json" and properties.delivery_mode == 2
    assert properties.headers["x-ojs-attempt"] == 1
