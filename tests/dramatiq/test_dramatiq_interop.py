"""Interoperability: jobs from ojs_kombu.Client run on actors; actor messages are plain OJS jobs."""

from __future__ import annotations

import json
import threading

import dramatiq
import pytest
from dramatiq.middleware import CurrentMessage
from support import raw_channel, wait_until

from ojs_kombu import Worker
from ojs_kombu.wire.codec import CONTENT_TYPE
from ojs_kombu.wire.headers import Header
from tools.schema import validate_job

pytestmark = pytest.mark.timeout(120)


def test_a_job_from_ojs_kombu_client_runs_on_the_actor_its_type_names(ojs_broker, start_worker, client):
    ojs_broker.add_middleware(CurrentMessage())
    seen = []
    done = threading.Event()

    @dramatiq.actor(actor_name="BuildReport", queue_name="reports")
    def build(report_id, *, fmt="letter"):
        message = CurrentMessage.get_current_message()
        seen.append((report_id, fmt, message.message_id, message.queue_name, message.options.get("retries", 0)))
        done.set()

    start_worker()
    job = client.enqueue("build_report", [42], queue="reports", kwargs={"fmt": "a4"})
    assert done.wait(20)
    assert seen == [(42, "a4", job.id, "reports", 0)]


def test_an_actor_message_is_an_ojs_job_for_a_raw_pika_consumer(ojs_broker, amqp_url, names):
    @dramatiq.actor(queue_name="plain")
    def notify(user, *, channel="email"):
        pass

    message = notify.send_with_options(args=("u1",), kwargs={"channel": "sms"}, delay=None)
    received = []
    with raw_channel(amqp_url) as channel:
        channel.basic_qos(prefetch_count=1)

        def on_message(ch, method, properties, body):
            received.append((properties, json.loads(body)))
            ch.basic_ack(method.delivery_tag)
            ch.stop_consuming()

        channel.basic_consume(names.job_queue("plain"), on_message)
        channel.connection.call_later(10, channel.stop_consuming)
        channel.start_consuming()
    ((properties, envelope),) = received
    validate_job(envelope)
    assert properties.content_type == CONTENT_TYPE and properties.delivery_mode == 2
    assert properties.app_id == "ojs" and properties.message_id == envelope["id"]
    assert properties.headers[Header.QUEUE] == "plain" and properties.headers[Header.ATTEMPT] == 1
    assert envelope["type"] == "notify" and envelope["args"] == ["u1"]
    assert envelope["meta"]["kwargs"] == {"channel": "sms"}
    assert envelope["meta"]["dramatiq"]["message_id"] == message.message_id
    assert envelope["id"][14] == "7"  # a UUIDv7


def test_an_actor_message_runs_on_an_ojs_kombu_worker(ojs_broker, amqp_url, prefix):
    @dramatiq.actor(actor_name="SendInvoice", queue_name="billing")
    def send_invoice(invoice, *, copy=False):
        pass

    ran = []
    done = threading.Event()
    worker = Worker(amqp_url, queues=["billing"], prefix=prefix, concurrency=2)

    @worker.handler("send_invoice")
    def handle(invoice, *, copy=False):
        ran.append((invoice, copy))
        done.set()

    send_invoice.send({"n": 1}, copy=True)
    with worker:
        assert done.wait(20)
    assert ran == [({"n": 1}, True)]


def test_a_scheduled_job_from_the_client_reaches_the_actor(ojs_broker, start_worker, client):
    import time
    from datetime import timedelta

    seen = []

    @dramatiq.actor(queue_name="sched")
    def tick(sent):
        seen.append(time.time() - sent)

    start_worker()
    client.enqueue("tick", [time.time()], queue="sched", scheduled_at=timedelta(seconds=1))
    wait_until(lambda: seen, 20)
    assert seen[0] >= 1.0


def test_rabbitmq_broker_url_forms_are_accepted(amqp_url, prefix, names):
    from urllib.parse import quote

    from support import message_count, pika_parameters

    from ojs_dramatiq import OjsBroker

    params = pika_parameters(amqp_url)  # the RabbitmqBroker form: amqp://u:p@host:port/%2F
    user, password = params.credentials.username, params.credentials.password
    pika_style = f"amqp://{user}:{password}@{params.host}:{params.port}/{quote(params.virtual_host, safe='')}"
    for url in (pika_style, amqp_url):
        broker = OjsBroker(url, prefix=prefix)
        dramatiq.actor(lambda: None, broker=broker, actor_name="ping", queue_name="urls").send()
        broker.close()
    assert message_count(amqp_url, names.job_queue("urls")) == 2
