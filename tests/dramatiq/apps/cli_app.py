"""Actors run by the ``dramatiq`` CLI in the Dramatiq adapter's tests.

Configured by the environment: ``OJS_AMQP_URL``, ``OJS_TEST_PREFIX`` (entity prefix)
and ``OJS_TEST_RECORD`` (a file each run appends a JSON line to).
"""

import json
import os
import signal
import time

import dramatiq
from dramatiq.middleware import CurrentMessage

from ojs_dramatiq import OjsBroker

broker = OjsBroker(os.environ["OJS_AMQP_URL"], prefix=os.environ["OJS_TEST_PREFIX"])
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)


def record(**fields):
    message = CurrentMessage.get_current_message()
    fields.update(pid=os.getpid(), retries=message.options.get("retries", 0), message_id=message.message_id)
    with open(os.environ["OJS_TEST_RECORD"], "a") as out:
        out.write(json.dumps(fields) + "\n")


@dramatiq.actor(queue_name="cli")
def Greet(name, *, greeting="hello"):
    record(actor="Greet", text=f"{greeting} {name}")


@dramatiq.actor(queue_name="cli")
def slow(n):
    record(actor="slow", n=n, event="start")
    time.sleep(1.0)
    record(actor="slow", n=n, event="end")


@dramatiq.actor(queue_name="cli-kill", max_retries=3, min_backoff=50)
def kill_once(tag):
    if CurrentMessage.get_current_message().options.get("retries", 0) == 0:
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-job, the message is unacked
    record(actor="kill_once", tag=tag)
