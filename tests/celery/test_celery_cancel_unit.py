"""Pure logic of the Celery control plane (no broker): the on_cancel hook, the queues a revoke cancels in."""

from __future__ import annotations

import logging

import pytest
from kombu import Exchange, Queue

from ojs_celery import Celery
from ojs_celery.control import ON_CANCEL_HOOK, TRANSPORT_LIFECYCLE_HOOK, DroppedTaskLifecycle, cancel_queues
from ojs_celery.lifecycle import INFO_HOOK, LIFECYCLE_HOOK, worker_lifecycle
from ojs_celery.limits import RATE_LIMITS_HOOK
from ojs_kombu.transport.control import HookedCancellations
from ojs_kombu.transport.settings import Settings


def test_every_cancel_reaches_the_hook_lowercased_and_is_recorded():
    seen: list[str] = []
    cancellations = HookedCancellations(seen.append)
    cancellations.cancel("01ABC")
    cancellations.cancel("01abc")  # a replay: the hook is called again (it must be idempotent)
    assert seen == ["01abc", "01abc"]
    assert cancellations.is_cancelled("01ABC")


def test_a_failing_hook_is_logged_and_the_cancel_still_recorded(caplog):
    def broken(job_id: str) -> None:
        raise RuntimeError("nope")

    cancellations = HookedCancellations(broken)
    with caplog.at_level(logging.ERROR, logger="ojs_kombu.transport.control"):
        cancellations.cancel("01abc")
    assert cancellations.is_cancelled("01abc")
    assert "on_cancel hook failed for job 01abc" in caplog.text


def test_on_cancel_option_is_imported_from_a_path_or_refused():
    assert Settings.from_options({"on_cancel": "os.path:basename"}).load_on_cancel() is __import__("os").path.basename
    assert Settings.from_options({}).load_on_cancel() is None
    with pytest.raises(TypeError, match="on_cancel must be callable"):
        Settings.from_options({"on_cancel": 42}).load_on_cancel()


def test_lifecycle_option_gives_a_lifecycle_or_is_refused():
    assert Settings.from_options({"lifecycle": LIFECYCLE_HOOK}).load_lifecycle() is worker_lifecycle()
    assert Settings.from_options({}).load_lifecycle() is None
    transport = Settings.from_options({"lifecycle": TRANSPORT_LIFECYCLE_HOOK}).load_lifecycle()
    assert isinstance(transport, DroppedTaskLifecycle) and transport.hub is worker_lifecycle()
    with pytest.raises(TypeError, match="must give a Lifecycle"):
        Settings.from_options({"lifecycle": "os.path:sep"}).load_lifecycle()


def test_the_app_installs_the_hook_and_keeps_the_users_transport_options():
    app = Celery("unit", broker="amqp://localhost//", broker_backend="ojs", broker_transport_options={"prefix": "p"})
    try:
        assert app.conf.broker_transport_options == {
            "prefix": "p",
            "on_cancel": ON_CANCEL_HOOK,
            "lifecycle": TRANSPORT_LIFECYCLE_HOOK,
            "info": INFO_HOOK,
            "rate_limits": RATE_LIMITS_HOOK,
        }
    finally:
        app.close()


def test_a_revoke_cancels_in_the_apps_job_queues_only():
    broadcast = Exchange("news", type="fanout")
    app = Celery(
        "unit",
        broker="amqp://localhost//",
        broker_backend="ojs",
        broker_transport_options={"passthrough_queues": ["legacy"]},
        task_queues=[
            Queue("celery"),
            Queue("Reports_High"),  # mapped like the transport maps it
            Queue("legacy"),  # a passthrough queue: not a job queue
            Queue("news", broadcast),  # bound to a fanout exchange: not a job queue
            Queue("scratch", durable=False),
            Queue("mine", exclusive=True),
        ],
    )
    try:
        assert cancel_queues(app) == ["celery", "reports-high"]
    finally:
        app.close()
