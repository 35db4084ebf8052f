"""The ``ojs-amqp`` command line against a real broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import get_messages, message_count, raw_channel, wait_until

from ojs_kombu import Job
from ojs_kombu.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_enqueue_declare_and_dead_letter_commands(capsys, amqp_url, prefix, names):
    common = ["--url", amqp_url, "--prefix", prefix]
    code, out, _ = run(capsys, "declare", "email", *common, "--max-priority", "10")
    assert code == 0 and out.strip() == names.job_queue("email")

    code, out, _ = run(
        capsys,
        "enqueue",
        "email.send",
        '["ada@example.com"]',
        "--queue",
        "email",
        "--kwargs",
        '{"lang": "fr"}',
        "--priority",
        "5",
        *common,
    )
    job = Job.from_json(out)
    assert code == 0 and job.kwargs == {"lang": "fr"} and job.priority == 5
    [(_, properties, _)] = get_messages(amqp_url, names.job_queue("email"), 1, ack=False)
    assert properties.message_id == job.id

    with raw_channel(amqp_url) as channel:  # dead-letter it the way a worker would
        method, _, _ = channel.basic_get(names.job_queue("email"))
        channel.basic_nack(method.delivery_tag, requeue=False)

    code, out, _ = run(capsys, "dlq", "list", "email", *common)
    [entry] = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and entry["id"] == job.id and entry["reason"] == "rejected"
    assert message_count(amqp_url, names.dead_letter_queue("email")) == 1  # listing kept it

    code, out, _ = run(capsys, "dlq", "replay", "email", *common)
    assert json.loads(out) == {"replayed": [job.id]}
    assert message_count(amqp_url, names.job_queue("email")) == 1

    run(capsys, "enqueue", "x.y", "[]", "--queue", "email", *common)
    with raw_channel(amqp_url) as channel:
        for _ in range(2):
            method, _, _ = channel.basic_get(names.job_queue("email"))
            channel.basic_nack(method.delivery_tag, requeue=False)
    with pytest.raises(SystemExit, match="--yes"):  # refuses without --yes
        main(["dlq", "purge", "email", *common])
    assert message_count(amqp_url, names.dead_letter_queue("email")) == 2
    code, out, _ = run(capsys, "dlq", "purge", "email", "--yes", *common)
    assert json.loads(out) == {"purged": 2}


def test_bad_input_is_a_clear_error(capsys, amqp_url, prefix):
    code, _, err = run(capsys, "enqueue", "Bad Type", "[]", "--url", amqp_url, "--prefix", prefix)
    assert code == 1 and "ValidationError" in err and "guest" not in err


# -- ojs-amqp worker, run as a user runs it: the installed script, from the project directory ------------

APP = """
import os
import sys

from ojs_kombu import Worker

worker = Worker(
    prefix=os.environ["APP_PREFIX"],
    queues=["unused"],
    concurrency=1,
    grace_period=5,
    on_conflict=os.environ.get("APP_ON_CONFLICT", "use-existing"),
)


@worker.handler("cli.job")
def record(text):
    with open("ran.txt", "a", encoding="utf-8") as out:
        out.write(text + "\\n")


@worker.handler("cli.exit")
def leave(code):
    sys.exit(code)
"""


@pytest.fixture
def project(tmp_path, amqp_url, prefix):
    """A project directory holding ``app.py``, and a way to run ``ojs-amqp`` from it."""
    (tmp_path / "app.py").write_text(APP, encoding="utf-8")
    script = Path(sys.executable).with_name("ojs-amqp")  # the console script: sys.path[0] is its bin/
    processes: list[subprocess.Popen[str]] = []

    def start(*argv: str, **env: str) -> subprocess.Popen[str]:
        environment = {**os.environ, "OJS_AMQP_URL": amqp_url, "APP_PREFIX": prefix, **env}
        environment.pop("PYTHONPATH", None)
        process = subprocess.Popen(
            [str(script), *argv], cwd=tmp_path, env=environment, text=True, stderr=subprocess.PIPE
        )
        processes.append(process)
        return process

    yield tmp_path, start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def test_worker_command_runs_an_app_from_the_current_directory(project, client, management, names):
    directory, start = project
    process = start("worker", "app:worker", "--queues", "cliq,other", "--concurrency", "3", "--log-level", "warning")
    client.enqueue("cli.job", ["hello"], queue="cliq")
    client.enqueue("cli.job", ["world"], queue="other")
    ran = directory / "ran.txt"
    wait_until(lambda: ran.exists() and len(ran.read_text().splitlines()) == 2, timeout=30, message="two jobs run")
    assert sorted(ran.read_text().splitlines()) == ["hello", "world"]
    details = wait_until(
        lambda: (management.queue(names.job_queue("cliq")) or {}).get("consumer_details"),
        timeout=15,
        message="consumer details",
    )
    assert details[0]["prefetch_count"] == 3  # --concurrency
    assert management.queue(names.job_queue("unused")) is None  # --queues replaced the Worker's queues

    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0  # a graceful shutdown
    assert "shutting down" not in err  # an INFO record: --log-level warning hides it


def test_worker_command_exits_non_zero_when_the_worker_dies(project, amqp_url, names):
    with raw_channel(amqp_url) as channel:  # a job queue the app refuses to use (on_conflict="raise")
        channel.queue_declare(names.job_queue("default"), durable=True, arguments={"x-max-priority": 5})
    _, start = project
    process = start("worker", "app:worker", "--queues", "default", APP_ON_CONFLICT="raise")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert "ojs-amqp: WorkerError:" in err and "TopologyConflictError" in err


def test_worker_command_exits_with_a_handlers_sys_exit_status(project, client, amqp_url, names):
    _, start = project
    process = start("worker", "app:worker", "--queues", "default")
    job = client.enqueue("cli.exit", [3], retry={"max_attempts": 1})
    _, err = process.communicate(timeout=60)
    assert process.returncode == 3, err
    [(_, properties, _)] = get_messages(amqp_url, names.dead_letter_queue("default"), 1)
    assert properties.message_id == job.id  # the attempt was failed before the worker exited


def test_worker_command_reports_an_unimportable_app(project):
    _, start = project
    process = start("worker", "missing_app:worker")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1 and "cannot import 'missing_app'" in err


def test_control_commands_cancel_info_pause_resume(capsys, client, worker_factory, amqp_url, prefix, names):
    common = ["--url", amqp_url, "--prefix", prefix]
    worker = worker_factory()
    worker.handler("cli.job", lambda *args: None)
    worker.start()
    assert worker.wait_until_ready()
    job = client.enqueue("cli.job", ["x"])
    wait_until(lambda: worker.activity.lookup(job.id) is not None, message="the job to run")

    code, out, _ = run(capsys, "info", job.id, "--queue", "default", "--timeout", "2", *common)
    assert code == 0
    info = json.loads(out)
    assert (info["job_id"], info["state"], info["worker_id"]) == (job.id, "completed", worker.worker_id)

    unknown = Job.create("cli.job", []).id
    code, out, err = run(capsys, "info", unknown, "--queue", "default", "--timeout", "0.5", *common)
    assert (code, out) == (1, "")
    assert unknown in err

    code, out, _ = run(capsys, "cancel", unknown.upper(), "--queue", "default", *common)
    assert code == 0 and json.loads(out) == {"cancelled": unknown, "queue": "default"}
    wait_until(lambda: worker.cancellations.is_cancelled(unknown), message="the cancel to reach the worker")

    code, out, _ = run(capsys, "pause", "default", *common)
    assert code == 0 and json.loads(out) == {"paused": "default"}
    wait_until(lambda: worker.paused_queues == {"default"}, message="the pause")
    code, out, _ = run(capsys, "resume", "default", *common)
    assert code == 0 and json.loads(out) == {"resumed": "default"}
    wait_until(lambda: worker.paused_queues == frozenset(), message="the resume")
