"""A Dramatiq application on the OJS wire: the actors are ordinary Dramatiq actors,
only the broker line differs from a ``RabbitmqBroker`` application.

    # a worker, with the dramatiq CLI, as always:
    OJS_PREFIX=shop dramatiq dramatiq_app --path examples
    # send some messages to it:
    OJS_PREFIX=shop python examples/dramatiq_app.py send

    # or everything in one process (a random prefix, deleted at the end):
    python examples/dramatiq_app.py

The broker is ``$OJS_AMQP_URL`` (``make demo`` style: ``python -m
ojs_kombu.testing.broker run -- python examples/dramatiq_app.py``).

* ``send_welcome`` runs at once (args and kwargs);
* ``BuildReport`` (a CamelCase actor name) fails once, is retried by Dramatiq's
  ``Retries`` middleware through ``ojs.queue.retry.reports.<ms>``, then succeeds;
* ``remind`` is sent with ``delay=2000`` and waits in the broker, not in the worker;
* ``charge`` always fails and ends in ``ojs.queue.dlx.default``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid

import dramatiq
from dramatiq.middleware import CurrentMessage

from ojs_dramatiq import OjsBroker

_DEMO = __name__ == "__main__" and sys.argv[1:] != ["send"]
PREFIX = os.environ.get("OJS_PREFIX") or (f"demo{uuid.uuid4().hex[:8]}" if _DEMO else "")

broker = OjsBroker(os.environ.get("OJS_AMQP_URL"), prefix=PREFIX)
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)  # before any actor is declared

finished = threading.Semaphore(0)


def say(text: str) -> None:
    message = CurrentMessage.get_current_message()
    attempt = message.options.get("retries", 0) + 1
    print(f"[{time.strftime('%H:%M:%S')}] {message.actor_name} (attempt {attempt}): {text}", flush=True)


@dramatiq.actor(queue_name="emails")
def send_welcome(address: str, *, lang: str = "en") -> None:
    say(f"welcome mail to {address} in {lang}")
    finished.release()


@dramatiq.actor(actor_name="BuildReport", queue_name="reports", max_retries=3, min_backoff=500)
def build_report(report_id: int) -> None:
    if CurrentMessage.get_current_message().options.get("retries", 0) == 0:
        say(f"report {report_id}: the database is busy, failing this attempt")
        raise RuntimeError("database busy")
    say(f"report {report_id} built")
    finished.release()


@dramatiq.actor
def remind(text: str, sent_at: float) -> None:
    say(f"{text} (after {time.time() - sent_at:.2f}s)")
    finished.release()


@dramatiq.actor(max_retries=0)
def charge(amount: int) -> None:
    say(f"charging {amount} fails")
    finished.release()
    raise ValueError("card declined")


def send() -> None:
    send_welcome.send("ada@example.com", lang="fr")
    build_report.send(42)
    remind.send_with_options(args=("time for a break", time.time()), delay=2000)
    charge.send(1999)


def demo() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("dramatiq").setLevel(logging.CRITICAL)  # the failures below are on purpose
    print(f"OJS prefix {PREFIX!r} on {broker!r}")
    worker = dramatiq.Worker(broker, worker_threads=4, worker_timeout=100)
    worker.start()
    try:
        send()
        for _ in range(4):
            if not finished.acquire(timeout=30):
                sys.exit("the demo did not finish in time")
        time.sleep(0.5)
        dead = broker.client.dead_letters("default")
        print(f"dead letters of 'default': {[(d.job.type, d.job.args, d.reason) for d in dead]}")
    finally:
        worker.stop()
        broker.client.teardown()
        broker.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["send"]:
        send()
        print("sent 4 messages")
    else:
        demo()
