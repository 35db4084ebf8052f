"""The ``ojs-amqp`` command line against a real broker."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pika
import pytest
from click.testing import CliRunner
from support import get_messages, message_count, raw_channel, wait_until

from ojs_kombu import Client, Job
from ojs_kombu.cli import main
from ojs_kombu.cli.common import redact, remember_secrets
from ojs_kombu.model.job import JobError
from ojs_kombu.model.timefmt import format_timestamp, utcnow


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def invoke(*argv: str, input: str | None = None) -> tuple[int, str, str]:
    """Run ``main`` with click's test streams: ``input`` answers the prompts."""
    with CliRunner().isolation(input=input) as (out, err, _):
        code = main(list(argv))
    return code, out.getvalue().decode(), err.getvalue().decode()


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


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

    code, out, _ = run(capsys, "dlq", "list", "email", "--json", *common)
    [entry] = json_lines(out)
    assert code == 0 and entry["id"] == job.id and entry["reason"] == "rejected"
    assert message_count(amqp_url, names.dead_letter_queue("email")) == 1  # listing kept it
    code, out, _ = run(capsys, "dlq", "list", "email", *common)  # the human table
    assert code == 0 and job.id in out and "email.send" in out and "rejected" in out

    code, out, _ = run(capsys, "dlq", "replay", "email", "--yes", *common)
    assert json.loads(out) == {"replayed": [job.id]}
    assert message_count(amqp_url, names.job_queue("email")) == 1

    run(capsys, "enqueue", "x.y", "[]", "--queue", "email", *common)
    with raw_channel(amqp_url) as channel:
        for _ in range(2):
            method, _, _ = channel.basic_get(names.job_queue("email"))
            channel.basic_nack(method.delivery_tag, requeue=False)
    code, out, err = invoke("dlq", "purge", "email", *common, input="n\n")  # the prompt, declined
    assert (code, out) == (1, "") and "Delete the dead letters of email matching: all (2 letter(s)" in err
    assert message_count(amqp_url, names.dead_letter_queue("email")) == 2
    code, out, _ = run(capsys, "dlq", "purge", "email", "--yes", *common)
    assert json.loads(out) == {"purged": 2}


def test_bad_input_is_a_clear_error(capsys, amqp_url, prefix):
    code, _, err = run(capsys, "enqueue", "Bad Type", "[]", "--url", amqp_url, "--prefix", prefix)
    assert code == 1 and "ValidationError" in err and "guest" not in err


def test_exit_codes_and_no_password_in_any_output(amqp_url, prefix, management):
    secret = "s3cret-pw"
    wrong = amqp_url.replace("guest:guest@", f"guest:{secret}@")
    assert wrong != amqp_url
    common = ["--url", amqp_url, "--prefix", prefix]

    assert invoke("status", "--queue", "none", "--json", *common)[0] == 0
    code, out, err = invoke("dlq", "list", "nope", *common)  # an OjsError: one line, no traceback
    assert (code, out) == (1, "") and err.startswith("ojs-amqp: NotFoundError:") and err.count("\n") == 1
    code, out, err = invoke("status", "--queue", "q", "--url", wrong, "--prefix", prefix)  # login refused
    assert code == 1 and err.startswith("ojs-amqp: AccessRefusedError:") and "Traceback" not in err
    assert secret not in out + err
    for bad in (f"amqp://guest:{secret}@127.0.0.1:notaport//", f"ftp://guest:{secret}@127.0.0.1//"):
        code, out, err = invoke("dlq", "list", "q", "--url", bad)
        assert code == 1 and err.startswith("ojs-amqp: ValidationError: bad broker URL") and err.count("\n") == 1
        assert secret not in out + err
    code, out, err = invoke(  # the management API refuses the login: said on stderr, no password anywhere
        "status",
        "--queue",
        "q",
        "--json",
        "--management-url",
        management.base_url.replace("://", f"://guest:{secret}@"),
        *common,
    )
    assert code == 0 and "HTTP 401" in err and secret not in out + err
    for usage in (["dlq", "list"], ["status", "--bogus"], ["events", "--since", "yesterday", *common], ["nope"]):
        code, out, err = invoke(*usage)
        assert code == 2 and "Usage:" in err and out == "", usage
    assert invoke("--help")[0] == 0


def test_redact_hides_url_passwords_and_remembered_ones():
    remember_secrets("amqp://u:p%40ss-w0rd@h//;amqp://v:other-secret@h2//")
    assert redact("at amqps://user:p@ss@host:5671/vh: refused") == "at amqps://user:***@host:5671/vh: refused"
    assert redact("login p@ss-w0rd and other-secret failed") == "login *** and *** failed"
    assert redact("amqp://alice@host// has no password") == "amqp://alice@host// has no password"


# -- status ---------------------------------------------------------------------------------------------


def test_status_json_numbers_match_the_broker(client, worker_factory, management, amqp_url, prefix, names):
    """3 ready, 1 waiting for a retry, 1 dead, 1 scheduled, paused: what ``status --json`` says."""
    worker = worker_factory(queues=("st",))

    def fail() -> None:
        raise ValueError("always")

    worker.handler("st.fail", fail)
    worker.start()
    assert worker.wait_until_ready()
    client.enqueue(
        "st.fail",
        [],
        queue="st",
        retry={"max_attempts": 3, "initial_interval": "PT10M", "max_interval": "PT10M", "jitter": False},
    )
    client.enqueue("st.fail", [], queue="st", retry={"max_attempts": 1})
    retry_queue = names.retry_queue("st", 600_000)
    wait_until(
        lambda: (
            message_count(amqp_url, names.dead_letter_queue("st")) == 1
            and management.queue(retry_queue) is not None
            and message_count(amqp_url, retry_queue) == 1
        ),
        timeout=30,
        message="one job dead, one waiting for its retry",
    )
    worker.stop(timeout=10)
    for i in range(3):
        client.enqueue("st.fail", [i], queue="st")
    client.enqueue("st.fail", [], queue="st", scheduled_at=timedelta(hours=1))
    client.pause("st")
    common = ["--url", amqp_url, "--prefix", prefix, "--management-url", management.base_url]

    expected = {
        "queue": "st",
        "exists": True,
        "ready": 3,
        "unacked": 0,
        "consumers": 0,
        "retrying": 1,
        "dead": 1,
        "held": 0,  # classic queues dead-letter at most once: they hold nothing
        "paused": True,
    }
    totals = {"totals": {"ready": 3, "retrying": 1, "dead": 1, "held": 0, "scheduled": 1}, "management": True}

    def status() -> list[dict]:
        code, out, err = invoke("status", "--json", *common)
        assert code == 0, err
        return json_lines(out)

    # unacked comes from the management API's statistics, which lag: wait for its sample.
    lines = wait_until(
        lambda: (found := status()) and {k: found[0][k] for k in expected} == expected and found,
        timeout=20,
        message=f"status to show {expected}",
    )
    assert [line.get("queue") for line in lines[:-1]] == ["st"] and lines[-1] == totals
    assert {"publish_rate", "deliver_rate", "ack_rate"} <= lines[0].keys()
    assert all(isinstance(lines[0][k], float) for k in ("publish_rate", "deliver_rate", "ack_rate"))

    client.resume("st")
    code, out, _ = invoke("status", *common)  # the human table
    assert code == 0 and "st" in out and "scheduled (cascade): 1" in out

    # Without the management API: the named queues by passive declares, the rest marked unknown.
    no_management = [*common[:4], "--management-url", ""]  # not even $OJS_MANAGEMENT_URL
    code, out, err = invoke("status", "--json", "--queue", "st", "--queue", "gone", *no_management)
    assert code == 0 and err == ""
    row, missing, last = json_lines(out)
    assert {k: row[k] for k in expected} == {
        **expected,
        "unacked": None,
        "retrying": None,
        "held": None,
        "paused": False,
    }
    assert row["publish_rate"] is None and missing == {**missing, "queue": "gone", "exists": False, "ready": None}
    assert last == {
        "totals": {"ready": 3, "retrying": None, "dead": 1, "held": None, "scheduled": 1},
        "management": False,
    }
    code, out, _ = invoke("status", "--json", "--queue", "st", "--no-paused", *no_management)
    assert code == 0 and json_lines(out)[0]["paused"] is None and json_lines(out)[0]["ready"] == 3
    code, out, err = invoke("status", *no_management)  # nothing to list
    assert code == 1 and "--queue" in err


def test_status_shows_the_dead_letters_a_quorum_queue_holds(amqp_url, prefix, names, management):
    """A quorum job queue dead-letters at least once: a letter whose dead letter queue is missing
    stays held by the job queue (``messages_dlx``); RabbitMQ routes it again only after
    ``dead_letter_worker_publisher_confirm_timeout`` (180 s), longer than this test."""
    queue = "held"
    with Client(amqp_url, prefix=prefix, queue_type="quorum") as quorum:
        quorum.enqueue("h.fail", [], queue=queue)
    assert management.delete_queue(names.dead_letter_queue(queue))
    with raw_channel(amqp_url) as channel:
        method, _, _ = wait_until(
            lambda: (got := channel.basic_get(names.job_queue(queue)))[0] and got, timeout=10, message="the job"
        )
        channel.basic_nack(method.delivery_tag, requeue=False)  # dead-lettered by the broker: no route
    common = ["--queue", queue, "--url", amqp_url, "--prefix", prefix, "--management-url", management.base_url]

    def row() -> dict:
        code, out, err = invoke("status", "--json", *common)
        assert code == 0, err
        return json_lines(out)[0]

    held = wait_until(lambda: (r := row())["held"] == 1 and r, timeout=20, message="the letter held")
    assert (held["ready"], held["dead"]) == (0, 0)
    code, out, _ = invoke("status", "--json", *common)
    assert json_lines(out)[-1]["totals"]["held"] == 1
    code, out, _ = invoke("status", *common)  # the human table has the column
    assert code == 0 and "held" in out


def test_top_once_renders_the_queues_and_the_workers(client, worker_factory, amqp_url, prefix, management):
    worker = worker_factory(events=True)
    worker.handler("ok", lambda: None)
    worker.start()
    assert worker.wait_until_ready()
    wait_until(lambda: client.workers(), timeout=10, message="the worker's presence")
    client.enqueue("ok", [])
    code, out, err = invoke(
        "top", "--once", "--url", amqp_url, "--prefix", prefix, "--management-url", management.base_url
    )
    assert code == 0, err
    assert "OJS queues" in out and "default" in out and worker.worker_id in out


# -- dead letter filters ----------------------------------------------------------------------------------


def _dead_letter(amqp_url, names, queue, count):
    with raw_channel(amqp_url) as channel:
        for _ in range(count):
            method, _, _ = channel.basic_get(names.job_queue(queue))
            channel.basic_nack(method.delivery_tag, requeue=False)


def _failed(job_type, code=None, message=None):
    job = Job.create(job_type, [], queue="dl")
    if code is None:
        return job
    stamp = format_timestamp(utcnow())
    return job.model_copy(
        update={
            "error": JobError(type=code, message=message),
            "errors": [{"code": code, "message": message, "attempt": 1, "occurred_at": stamp}],
        }
    )


def test_each_dlq_filter_acts_on_exactly_the_matching_letters(client, amqp_url, prefix, names):
    common = ["--url", amqp_url, "--prefix", prefix]
    client.declare_queue("dl")
    a = client.enqueue_job(_failed("mail.send", "TimeoutError", "took too long"))
    b = client.enqueue_job(_failed("mail.send", "ValueError", "bad address"))
    with raw_channel(amqp_url) as channel:  # a letter that is not an OJS job
        channel.basic_publish("", names.job_queue("dl"), b"not json", properties=_pika_props("not-a-job-1"))
    _dead_letter(amqp_url, names, "dl", 3)
    boundary = datetime.fromtimestamp(math.floor(utcnow().timestamp()) + 1, UTC)  # x-death times are in seconds
    wait_until(lambda: utcnow() >= boundary, timeout=3, message="the next second")
    c = client.enqueue_job(_failed("report.build", "TimeoutError", "slow report"))
    d = client.enqueue_job(_failed("mail.send"))
    _dead_letter(amqp_url, names, "dl", 2)
    dlq = names.dead_letter_queue("dl")

    def listed(*filters: str) -> list[str]:
        code, out, err = invoke("dlq", "list", "dl", "--json", *filters, *common)
        assert code == 0, err
        return [line["id"] for line in json_lines(out)]

    assert listed() == [a.id, b.id, "not-a-job-1", c.id, d.id]
    assert listed("--type", "mail.send") == [a.id, b.id, d.id]
    assert listed("--type", "mail.send", "--type", "report.build", "--limit", "2") == [a.id, b.id]
    assert listed("--error", "timeouterror") == [a.id, c.id]  # a code, any case
    assert listed("--error", "BAD ADDR") == [b.id]  # text of the message
    assert listed("--since", format_timestamp(boundary)) == [c.id, d.id]
    assert listed("--since", "1h", "--ids", f"{b.id},{c.id.upper()}") == [b.id, c.id]

    code, out, _ = invoke("dlq", "show", "dl", c.id, "--json", *common)
    [shown] = json_lines(out)
    assert code == 0 and shown["job"]["id"] == c.id and shown["x_death"][0]["reason"] == "rejected"
    # Nacked by hand, with no final-failure record: the last failure is unknown, the earlier ones are kept.
    assert shown["error_message"] is None and shown["job"]["errors"][0]["message"] == "slow report"

    code, out, err = invoke("dlq", "replay", "dl", "--type", "mail.send", "--error", "TimeoutError", "--yes", *common)
    assert code == 0 and json_lines(out) == [{"replayed": [a.id]}]
    [(_, properties, _)] = get_messages(amqp_url, names.job_queue("dl"), 1)
    assert properties.message_id == a.id and message_count(amqp_url, names.job_queue("dl")) == 0
    assert listed() == [b.id, "not-a-job-1", c.id, d.id]  # the others, in their order

    code, out, _ = invoke("dlq", "purge", "dl", "--since", format_timestamp(boundary), "--error", "slow", "-y", *common)
    assert code == 0 and json_lines(out) == [{"purged": 1}]
    assert listed() == [b.id, "not-a-job-1", d.id]

    code, out, _ = invoke("dlq", "purge", "dl", "--ids", "NOT-A-JOB-1", "--ids", d.id, "--yes", *common)
    assert code == 0 and json_lines(out) == [{"purged": 2}]
    assert listed() == [b.id] and message_count(amqp_url, dlq) == 1


def test_dlq_export_writes_json_lines_and_replay_asks_first(client, amqp_url, prefix, names, tmp_path):
    common = ["--url", amqp_url, "--prefix", prefix]
    jobs = [client.enqueue_job(_failed("mail.send", "ValueError", f"bad {i}")) for i in range(3)]
    _dead_letter(amqp_url, names, "dl", 3)
    target = tmp_path / "dead.jsonl"
    code, _, err = invoke("dlq", "export", "dl", "--error", "bad 1", "-o", str(target), *common)
    assert code == 0, err
    [exported] = json_lines(target.read_text(encoding="utf-8"))
    assert exported["id"] == jobs[1].id and exported["job"]["args"] == [] and exported["job"]["type"] == "mail.send"
    assert message_count(amqp_url, names.dead_letter_queue("dl")) == 3  # left in place

    code, out, err = invoke("dlq", "replay", "dl", "--ids", jobs[0].id, *common, input="n\n")
    assert (code, out) == (1, "") and "Replay the dead letters of dl matching: 1 id(s) (3 letter(s)" in err
    assert message_count(amqp_url, names.dead_letter_queue("dl")) == 3
    code, out, err = invoke("dlq", "replay", "dl", "--ids", jobs[0].id, *common, input="y\n")
    assert code == 0 and json_lines(out) == [{"replayed": [jobs[0].id]}]
    assert message_count(amqp_url, names.job_queue("dl")) == 1


def _pika_props(message_id):
    return pika.BasicProperties(message_id=message_id, content_type="text/plain")


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

    code, out, _ = run(capsys, "info", job.id, "--queue", "default", "--timeout", "2", "--json", *common)
    assert code == 0
    info = json.loads(out)
    assert (info["job_id"], info["state"], info["worker_id"]) == (job.id, "completed", worker.worker_id)
    code, out, _ = run(capsys, "info", job.id, "--queue", "default", "--timeout", "2", *common)  # the table
    assert code == 0 and f"job {job.id}" in out and "completed" in out and worker.worker_id in out

    unknown = Job.create("cli.job", []).id
    code, out, err = run(capsys, "info", unknown, "--queue", "default", "--timeout", "0.5", *common)
    assert (code, out) == (1, "")
    assert unknown in err

    code, out, _ = run(capsys, "cancel", unknown.upper(), "--queue", "default", *common)
    assert code == 0 and json.loads(out) == {"cancelled": unknown, "queue": "default"}
    wait_until(lambda: worker.cancellations.is_cancelled(unknown), message="the cancel to reach the worker")

    dramatiq_id = str(uuid.uuid4())  # a Dramatiq message_id (UUIDv4) is a job id to cancel and info too
    code, out, _ = run(capsys, "cancel", dramatiq_id, "--queue", "default", *common)
    assert code == 0 and json.loads(out) == {"cancelled": dramatiq_id, "queue": "default"}
    wait_until(lambda: worker.cancellations.is_cancelled(dramatiq_id), message="the cancel to reach the worker")
    for command in ("cancel", "info"):
        code, out, err = run(capsys, command, "12345", "--queue", "default", *common)
        assert (code, out) == (2, "") and "'12345' is not a job id: expected a UUID" in err

    code, out, _ = run(capsys, "pause", "default", *common)
    assert code == 0 and json.loads(out) == {"paused": "default"}
    wait_until(lambda: worker.paused_queues == {"default"}, message="the pause")
    code, out, _ = run(capsys, "resume", "default", *common)
    assert code == 0 and json.loads(out) == {"resumed": "default"}
    wait_until(lambda: worker.paused_queues == frozenset(), message="the resume")


# -- issue 29: the management API found from the broker URL; errors that name their cause ------------------


def _cli_subprocess(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``ojs-amqp ARGV`` in a process of its own (real logging to stderr, as a user sees it)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("OJS_AMQP_URL", "OJS_MANAGEMENT_URL")}
    environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), environ.get("PYTHONPATH", "")])
    environ.update(env or {})
    code = "import sys; from ojs_kombu.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *argv], env=environ, capture_output=True, text=True, timeout=120, check=False
    )


def _port_is_closed(host: str, port: int) -> bool:
    import socket

    with socket.socket() as probe:
        probe.settimeout(2)
        return probe.connect_ex((host, port)) != 0


def test_status_finds_the_management_api_from_the_environment_or_says_which_url_failed(
    client, amqp_url, prefix, management
):
    from urllib.parse import urlsplit

    client.declare_queue("found")
    # $OJS_MANAGEMENT_URL (no --management-url): every queue of the prefix, without --queue
    done = _cli_subprocess(
        "status", "--json", "--url", amqp_url, "--prefix", prefix, env={"OJS_MANAGEMENT_URL": management.base_url}
    )
    assert done.returncode == 0, done.stderr
    *rows, last = json_lines(done.stdout)
    assert [r["queue"] for r in rows] == ["found"] and last["management"] is True

    # only the AMQP URL: the management API is derived (http://HOST:15672/); the session's node has it
    # elsewhere, so the message names the URL tried and what to set
    host = urlsplit(amqp_url).hostname or ""
    if not _port_is_closed(host, 15672):
        pytest.skip(f"something answers on {host}:15672: the derived URL cannot be shown failing here")
    done = _cli_subprocess("status", "--json", "--url", amqp_url, "--prefix", prefix)
    assert (done.returncode, done.stdout) == (1, "")
    assert f"the management API at http://{host}:15672 (derived from the broker URL) did not answer" in done.stderr
    assert "set --management-url or $OJS_MANAGEMENT_URL" in done.stderr and "Connection refused" in done.stderr
    # with --queue the numbers still come (passive declares), and stderr says what is missing and why
    done = _cli_subprocess("status", "--json", "--queue", "found", "--url", amqp_url, "--prefix", prefix)
    assert done.returncode == 0 and json_lines(done.stdout)[0]["ready"] == 0
    assert f"unacked, retrying and rates unknown: the management API at http://{host}:15672" in done.stderr


def test_status_reports_the_brokers_refusal_or_silence_not_the_queue_hint(amqp_url, prefix, management):
    secret = "Wr0ng-pw"
    wrong = amqp_url.replace("guest:guest@", f"guest:{secret}@")
    assert wrong != amqp_url
    for extra in ([], ["--management-url", management.base_url]):  # derived (refused too) or the right one
        done = _cli_subprocess("status", "--json", "--url", wrong, "--prefix", prefix, *extra)
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        assert done.stderr.startswith("ojs-amqp: AccessRefusedError:") and "ACCESS_REFUSED" in done.stderr
        assert "--queue" not in done.stderr and secret not in done.stderr
        assert "guest:***@" in done.stderr

    port = _unused_port()
    closed = f"amqp://guest:{secret}@127.0.0.1:{port}//"
    done = _cli_subprocess("status", "--url", closed, "--management-url", management.base_url)
    assert (done.returncode, done.stdout) == (1, "")
    last = done.stderr.splitlines()[-1]
    assert last.startswith(
        f"ojs-amqp: BrokerConnectionError: cannot reach the broker at amqp://guest:***@127.0.0.1:{port}"
    )
    assert "Connection refused" in last and "--queue" not in done.stderr and secret not in done.stderr


def _unused_port() -> int:
    """A port nothing listens on: bound, then released (the kernel does not hand it out again at once)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_events_with_a_limit_leave_no_py_amqp_warnings(worker_factory, client, amqp_url, prefix):
    worker = worker_factory(events=True)
    worker.handler("ok", lambda: None)
    worker.start()
    assert worker.wait_until_ready()
    jobs = [client.enqueue("ok", []) for _ in range(30)]
    wait_until(lambda: len(client.events(timedelta(minutes=5))) >= 2 * len(jobs), message="the jobs' events")

    done = _cli_subprocess("events", "--since", "5m", "--limit", "3", "--json", "--url", amqp_url, "--prefix", prefix)
    assert done.returncode == 0 and len(json_lines(done.stdout)) == 3
    assert done.stderr == ""  # no "Received method (60, 60) during closing channel" for the deliveries in flight
