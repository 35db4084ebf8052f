"""Actors of the group and pipeline test run by two ``dramatiq`` CLI processes (test_dramatiq_groups.py).

Configured by the environment: ``OJS_AMQP_URL``, ``OJS_TEST_PREFIX`` (entity prefix),
``OJS_TEST_RECORD`` (a file each run appends a JSON line to) and ``OJS_TEST_MARKER`` (where
the one worker :class:`DieAfterReport` kills writes its pid).
"""

import json
import os
import signal

import dramatiq
from dramatiq.middleware import CurrentMessage, Middleware

from ojs_dramatiq import OjsBroker, OjsGroupCallbacks

#: Retries after a lost worker come after 50 ms, not Dramatiq's default 15 s (the sender uses the same).
ACTOR_OPTIONS = {"queue_name": "groups", "min_backoff": 50, "max_backoff": 200}


class DieAfterReport(Middleware):
    """SIGKILLs its worker process once, after ``member(0)`` reported to its group and before its ack.

    Added before ``OjsGroupCallbacks``: Dramatiq runs after-hooks in reverse order, so this one
    runs after the report.  The member is then delivered again (to the other worker) and reports
    again.  Only while some member has not run yet: member 0 is then not the reporter that
    publishes the callback, which the killed worker could otherwise be running (and run twice).
    """

    def after_process_message(self, broker, message, *, result=None, exception=None):
        if message.actor_name != "member" or message.args[0] != 0 or exception is not None:
            return
        if len({r["n"] for r in records() if r["actor"] == "member"}) >= int(os.environ["OJS_TEST_MEMBERS"]):
            return
        try:
            fd = os.open(os.environ["OJS_TEST_MARKER"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return  # killed one worker already
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


broker = OjsBroker(os.environ["OJS_AMQP_URL"], prefix=os.environ["OJS_TEST_PREFIX"])
broker.add_middleware(CurrentMessage())
broker.add_middleware(DieAfterReport())
broker.add_middleware(OjsGroupCallbacks())
dramatiq.set_broker(broker)


def records():
    with open(os.environ["OJS_TEST_RECORD"]) as lines:
        return [json.loads(line) for line in lines]


def record(**fields):
    message = CurrentMessage.get_current_message()
    fields.update(pid=os.getpid(), retries=message.options.get("retries", 0))
    with open(os.environ["OJS_TEST_RECORD"], "a") as out:
        out.write(json.dumps(fields) + "\n")


@dramatiq.actor(**ACTOR_OPTIONS)
def member(n):
    record(actor="member", n=n)


@dramatiq.actor(**ACTOR_OPTIONS)
def finished(tag):
    done = records()
    members = {r["n"] for r in done if r["actor"] == "member"}
    record(actor="finished", tag=tag, members_done=len(members), pipeline_done=any(r["actor"] == "total" for r in done))


@dramatiq.actor(**ACTOR_OPTIONS)
def add(x, y=0):
    record(actor="add", result=x + y)
    return x + y


@dramatiq.actor(**ACTOR_OPTIONS)
def total(x):
    record(actor="total", value=x)
