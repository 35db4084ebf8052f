"""The Celery app the subprocess workers of ``tests/celery`` run (``celery -A worker_app worker``).

Broker and prefix come from ``$OJS_AMQP_URL`` and ``$OJS_TEST_PREFIX``; results go
through ``rpc://``.  The tasks need a process pool: hard time limits and a pool
process that dies.
"""

from __future__ import annotations

import json
import os
import time

from celery import signals
from kombu import Queue

from ojs_celery import Celery

app = Celery(
    "worker_app",
    broker=os.environ["OJS_AMQP_URL"],
    broker_backend="ojs",
    backend="rpc://",
    broker_transport_options={"prefix": os.environ["OJS_TEST_PREFIX"]},
)

# tests/celery/test_celery_deduplicate.py: execution de-duplication (the ojs:// transport option).
if os.environ.get("OJS_DEDUPLICATE") == "1":
    app.conf.broker_transport_options = {**app.conf.broker_transport_options, "deduplicate": True}

# tests/celery/test_celery_flower.py: the task queues (a worker consumes them all), comma-separated.
if os.environ.get("OJS_TEST_QUEUES"):
    app.conf.task_queues = [Queue(name) for name in os.environ["OJS_TEST_QUEUES"].split(",")]


@app.task(bind=True, time_limit=1, max_retries=1, default_retry_delay=0.2)
def sleepy(self, seconds):
    """Sleeps ``seconds`` (over its hard time limit of 1 s unless short); returns its retries count."""
    time.sleep(seconds if self.request.retries == 0 else 0)
    return self.request.retries


@app.task(bind=True, time_limit=1, max_retries=1, default_retry_delay=0.2)
def always_slow(self):
    """Always exceeds its hard time limit: two attempts, then the dead letter queue."""
    time.sleep(5)


@app.task(bind=True, max_retries=1, default_retry_delay=0.2)
def dies_once(self):
    """Kills its pool process on the first attempt (a lost worker); succeeds on the second."""
    if self.request.retries == 0:
        os._exit(1)
    return self.request.retries


# tests/celery/test_celery_cancel.py: terminate a running task that is cancelled.
app.conf.ojs_cancel_terminate = os.environ.get("OJS_CANCEL_TERMINATE") == "1"


@app.task(bind=True, max_retries=3, default_retry_delay=0.2)
def wait_for_cancel(self, path):
    """Appends a line to ``path`` when it starts, then sleeps a minute (until it is terminated)."""
    with open(path, "a") as started:
        started.write(f"{self.request.retries}\n")
    time.sleep(60)
    return "finished"


@app.task
def echo(value):
    """Returns ``value``."""
    return value


# tests/celery/test_celery_canvas.py: chords on the prefork pool.  With $OJS_FAIL_FIRST_ADD_REPORT, the
# first report of an `add` task to its workflow fails in each pool process (the broker refused it).
if os.environ.get("OJS_FAIL_FIRST_ADD_REPORT"):
    from ojs_kombu.runtime.workflow import WorkflowHook

    _report = WorkflowHook.on_terminal
    _report_failed: set[int] = set()

    def _failing_once(self, job, state, *args, **kwargs):
        if job.type == "worker_app.add" and os.getpid() not in _report_failed:
            _report_failed.add(os.getpid())
            raise ConnectionError("injected: the report was refused")
        return _report(self, job, state, *args, **kwargs)

    WorkflowHook.on_terminal = _failing_once


@app.task
def add(x, y):
    """Returns ``x + y``."""
    return x + y


@app.task
def tsum(values, path):
    """A chord body: appends the header results it was called with to ``path``; returns their sum."""
    with open(path, "a") as log:
        log.write(json.dumps(values) + "\n")
    return sum(values)


@app.task
def explode(x):
    """Always fails."""
    raise ValueError(f"cannot handle {x}")


# tests/celery/test_celery_process_worker.py: what the prefork pool is handed, seen in the worker's main process.
if os.environ.get("OJS_RECEIVED_LOG"):

    @signals.task_received.connect(weak=False)
    def _log_received(request, **_):
        body = request.body
        payload = body[:2] if isinstance(body, list) else json.loads(body)[:2]
        with open(os.environ["OJS_RECEIVED_LOG"], "a") as log:
            log.write(json.dumps({"content_type": request.content_type, "payload": payload}) + "\n")


# tests/celery/test_celery_beat.py: a 1-second beat entry (celery beat -S ojs_celery.beat:Scheduler);
# each run appends its task id to $OJS_BEAT_LOG.
if os.environ.get("OJS_BEAT_LOG"):
    app.conf.beat_schedule = {
        "beat-tick": {"task": "worker_app.record_run", "schedule": 1.0, "args": [os.environ["OJS_BEAT_LOG"]]}
    }


@app.task(bind=True)
def record_run(self, path):
    """Appends its task id to ``path``."""
    with open(path, "a") as log:
        log.write(f"{self.request.id}\n")


@app.task(bind=True, max_retries=2, default_retry_delay=0.2)
def retry_once(self, path):
    """Appends ``{task id} {retries}`` to ``path``; retries (``Task.retry``, the same task id) once, then returns."""
    with open(path, "a") as log:
        log.write(f"{self.request.id} {self.request.retries}\n")
    if self.request.retries == 0:
        raise self.retry()
    return self.request.retries


# tests/celery/test_celery_rate_limit.py: Celery's rate_limit held across workers (ojs_celery.limits).
app.conf.ojs_rate_limits = os.environ.get("OJS_RATE_LIMITS") == "1"
if app.conf.ojs_rate_limits:  # two workers of one node name: without remote control, no pidbox queue to share
    app.conf.worker_enable_remote_control = False


@app.task(rate_limit="5/s")
def throttled(path, n):
    """Appends ``run {n} {unix time} {worker pid}`` to ``path`` (the pool process's parent is the worker)."""
    with open(path, "a") as log:
        log.write(f"run {n} {time.time()} {os.getppid()}\n")


@signals.task_received.connect(weak=False)
def _log_admitted(request, **_):
    """The worker's main process received ``throttled`` (the transport admitted it): ``admitted {n} {time} {pid}``."""
    if request.task_name == "worker_app.throttled":
        path, n = request.args
        with open(path, "a") as log:
            log.write(f"admitted {n} {time.time()} {os.getpid()}\n")
