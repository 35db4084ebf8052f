"""``celery beat -S ojs_celery.beat:Scheduler``: beat_schedule entries as OJS cron jobs, fired by the leader."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from celery.schedules import crontab, schedule, solar
from support import wait_until

from ojs_celery import Celery
from ojs_celery.beat import MARKER, cron_name_for, crons_for, expression_for, synchronise
from ojs_kombu import ValidationError
from ojs_kombu.model.cron import tick_job_id
from ojs_kombu.model.naming import Names
from ojs_kombu.runtime.cron import CronRegistry

pytestmark = pytest.mark.timeout(180)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


@pytest.fixture
def app() -> Celery:
    app = Celery("proj", broker="amqp://guest:guest@localhost//", broker_backend="ojs", timezone="Europe/Paris")
    app.conf.task_routes = {"proj.report": {"queue": "Reports_High"}}

    @app.task(name="proj.add", max_retries=2, shared=False)
    def add(x, y):
        return x + y

    return app


def test_crontab_and_intervals_become_expressions(app):
    assert expression_for(crontab(minute="*/15", hour="9-17", day_of_week="mon-fri"), app) == (
        "*/15 9-17 * * mon-fri",
        "Europe/Paris",
    )
    assert expression_for(crontab(minute={5, 1}, hour=3), app) == ("1,5 3 * * *", "Europe/Paris")
    assert expression_for(30, app) == ("@every 30s", "UTC")
    assert expression_for(timedelta(seconds=1.5), app) == ("@every 1500ms", "UTC")
    assert expression_for(schedule(timedelta(hours=1)), app) == ("@every 3600s", "UTC")
    sunrise = solar.__new__(solar)  # a real one needs the ephem package
    sunrise.event, sunrise.lat, sunrise.lon = "sunrise", 48.8, 2.3
    with pytest.raises(ValidationError, match="solar") as refused:
        expression_for(sunrise, app)
    assert refused.value.field == "cron"

    class Custom(schedule):
        pass

    with pytest.raises(ValidationError, match="only crontab"):
        expression_for(Custom(timedelta(seconds=1)), app)


def test_entry_names_become_cron_names():
    assert cron_name_for("add-every-30-seconds") == "add-every-30-seconds"
    assert cron_name_for("Send report (daily)") == "send-report-daily"
    with pytest.raises(ValidationError) as refused:
        cron_name_for("!!!")
    assert refused.value.field == "name"


def test_an_entry_becomes_the_job_apply_async_would_send(app):
    (add, report) = crons_for(
        app,
        {
            "Add every 30 s": {"task": "proj.add", "schedule": 30, "args": (1, 2)},
            "report": {
                "task": "proj.report",
                "schedule": crontab(hour=7, minute=30),
                "kwargs": {"kind": "daily"},
                "options": {"time_limit": 60, "headers": {"origin": "beat"}, "overlap_policy": "skip"},
            },
        },
    )
    assert (add.name, add.cron, add.type, add.args, add.queue) == (
        "add-every-30-s",
        "@every 30s",
        "proj.add",
        [1, 2],
        "celery",
    )
    assert add.options["meta"]["celery"] == {"task": "proj.add"}
    assert add.options["meta"][MARKER] == {"app": "proj", "entry": "Add every 30 s"}
    assert add.options["retry"]["max_attempts"] == 3  # max_retries + 1
    assert add.overlap_policy == "allow"  # what beat does
    assert (report.cron, report.timezone, report.queue, report.overlap_policy) == (
        "30 7 * * *",
        "Europe/Paris",
        "reports-high",
        "skip",
    )
    assert report.options["meta"]["kwargs"] == {"kind": "daily"}
    assert report.options["meta"]["celery"]["headers"] == {"origin": "beat", "timelimit": [60, None]}
    with pytest.raises(ValidationError, match="'a b' and 'a-b'"):
        crons_for(app, {"a b": {"task": "proj.add", "schedule": 1}, "a-b": {"task": "proj.add", "schedule": 1}})
    with pytest.raises(ValidationError, match="entry 'x'") as refused:
        crons_for(app, {"x": {"task": "proj.add", "schedule": 1, "args": [object()]}})
    assert refused.value.field.startswith("args")


def test_synchronise_registers_changes_and_removes_only_its_own_crons(app, amqp_url, prefix):
    schedule_v1 = {"a": {"task": "proj.add", "schedule": 1}, "b": {"task": "proj.add", "schedule": 2}}
    with CronRegistry.connect(amqp_url, names=Names(prefix)) as registry:
        registry.register_cron("foreign", "@every 1s", "other.job", queue="other")
        assert synchronise(registry, crons_for(app, schedule_v1), "proj") == (["a", "b"], [])
        assert synchronise(registry, crons_for(app, schedule_v1), "proj") == ([], [])  # unchanged: nothing written
        another = Celery("another", broker="amqp://guest:guest@localhost//", broker_backend="ojs")
        assert synchronise(registry, crons_for(another, {"c": {"task": "x.y", "schedule": 1}}), "another") == (
            ["c"],
            [],
        )
        schedule_v2 = {"a": {"task": "proj.add", "schedule": 5}}
        assert synchronise(registry, crons_for(app, schedule_v2), "proj") == (["a"], ["b"])
        assert sorted(c.name for c in registry.list()) == ["a", "c", "foreign"]
        assert next(c for c in registry.list() if c.name == "a").cron == "@every 5s"


def start_beat(amqp_url: str, prefix: str, log: Path, workdir: Path, name: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "OJS_AMQP_URL": amqp_url,
        "OJS_TEST_PREFIX": prefix,
        "OJS_BEAT_LOG": str(log),
        "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
    }
    output = open(workdir / f"{name}.log", "w")
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "worker_app",
                "beat",
                "-S",
                "ojs_celery.beat:Scheduler",
                "--loglevel=INFO",
            ],
            cwd=workdir,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    finally:
        output.close()


def runs(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def scheduled_at(task_id: str) -> datetime:
    """The scheduled time a tick id carries (its UUIDv7 timestamp)."""
    return datetime.fromtimestamp(int(task_id[:8] + task_id[9:13], 16) / 1000, UTC)


def test_two_beat_processes_send_each_tick_once_and_the_survivor_takes_over(
    amqp_url, prefix, tmp_path, celery_subprocess_worker
):
    log = tmp_path / "runs.txt"
    beats = [start_beat(amqp_url, prefix, log, tmp_path, f"beat{i}") for i in range(2)]
    try:
        with celery_subprocess_worker(extra_env={"OJS_BEAT_LOG": str(log)}):
            with CronRegistry.connect(amqp_url, names=Names(prefix)) as registry:
                wait_until(lambda: len(runs(log)) >= 5, 60, message="five ticks run by the worker")
                leader = registry.leader()
                assert leader is not None
                (firing,) = [b for b in beats if b.pid == leader.pid]
                (survivor,) = [b for b in beats if b is not firing]
                before = runs(log)
                assert len(set(before)) == len(before)  # each tick ran once
                for task_id in before:
                    assert task_id == tick_job_id("beat-tick", scheduled_at(task_id))
                (cron,) = registry.list()
                assert (cron.name, cron.cron, cron.type, cron.queue) == (
                    "beat-tick",
                    "@every 1s",
                    "worker_app.record_run",
                    "celery",
                )

                killed_at, killed_wall = time.monotonic(), datetime.now(UTC)
                firing.send_signal(signal.SIGKILL)
                firing.wait(10)
                elected = wait_until(
                    lambda: (found := registry.leader()) is not None and found.pid == survivor.pid and time.monotonic(),
                    10,
                    interval=0.01,
                    message="the surviving beat elected",
                )
                wait_until(
                    lambda: any(scheduled_at(t) > killed_wall for t in runs(log)),
                    10,
                    interval=0.01,
                    message="a tick of the survivor",
                )
                took = time.monotonic() - killed_at
                print(f"\nSIGKILL of the firing beat -> the other beat led after {elected - killed_at:.3f} s; "
                      f"the next tick's task ran {took:.3f} s after the kill")  # fmt: skip
                assert took <= 5.0
                wait_until(lambda: len(runs(log)) >= len(before) + 3, 20, message="three more ticks")
                after = runs(log)
                assert len(after) - len(set(after)) <= 1  # a kill between a publish and its tick record repeats one
            survivor.send_signal(signal.SIGTERM)
            assert survivor.wait(30) == 0
    finally:
        for beat in beats:
            if beat.poll() is None:
                beat.kill()
                beat.wait(10)
    output = (tmp_path / f"beat{beats.index(survivor)}.log").read_text()
    assert "beat: 1 entry as OJS cron jobs" in output
    assert "Traceback" not in output


def test_a_broker_that_is_not_ojs_is_refused():
    from celery.exceptions import ImproperlyConfigured

    from ojs_celery.beat import Scheduler

    stock = Celery("stock", broker="amqp://guest:guest@localhost//")
    with pytest.raises(ImproperlyConfigured, match="ojs://"):
        Scheduler(stock)
    lazy = Scheduler(stock, lazy=True, max_interval=7)  # what celery beat makes for its banner
    assert lazy.info.endswith("(the leader of the beat processes fires)")
    assert lazy.tick() == 7.0  # --max-interval: how often beat's loop checks on the cron scheduler
