"""A Dramatiq ``message_id`` (what ``send()`` returned) names its job wherever a job id is taken:
``ojs-amqp dlq show|replay|purge``, ``cancel``, ``info`` (issue 29 item 4)."""

from __future__ import annotations

import json
import threading

import dramatiq
from click.testing import CliRunner
from support import message_count, wait_until

from ojs_dramatiq import current_cancelled
from ojs_dramatiq.encoder import job_id_for
from ojs_kombu.cli import main


def invoke(*argv: str) -> tuple[int, str, str]:
    with CliRunner().isolation() as (out, err, _):
        code = main(list(argv))
    return code, out.getvalue().decode(), err.getvalue().decode()


def test_dlq_show_replay_and_purge_take_the_dramatiq_message_id(ojs_broker, start_worker, amqp_url, prefix, names):
    common = ["--url", amqp_url, "--prefix", prefix]
    failing = threading.Event()
    failing.set()
    runs: list[str] = []

    @dramatiq.actor(queue_name="idq", max_retries=0)
    def flaky(n: int) -> None:
        runs.append(n)
        if failing.is_set():
            raise RuntimeError(f"failed {n}")

    first, second = flaky.send(1), flaky.send(2)
    start_worker()
    dead_letter_queue = names.dead_letter_queue("idq")
    wait_until(lambda: message_count(amqp_url, dead_letter_queue) == 2, 20, message="both messages dead-lettered")
    job_id = job_id_for(first.message_id, first.message_timestamp)
    assert job_id != first.message_id  # Dramatiq's ids are UUID4s: the job id is derived

    code, out, err = invoke("dlq", "show", "idq", first.message_id, "--json", *common)
    assert code == 0, err
    (shown,) = [json.loads(line) for line in out.splitlines()]
    assert shown["id"] == job_id
    assert shown["job"]["meta"]["dramatiq"]["message_id"] == first.message_id
    code, out, _ = invoke("dlq", "show", "idq", first.message_id.upper(), "--json", *common)  # any case
    assert code == 0 and json.loads(out)["id"] == job_id

    failing.clear()
    code, _, err = invoke("dlq", "replay", "idq", "--ids", first.message_id, "--yes", *common)
    assert code == 0, err
    wait_until(lambda: runs.count(1) == 2, 20, message="the replayed message ran again")
    assert message_count(amqp_url, dead_letter_queue) == 1  # only the other letter is left

    code, _, err = invoke("dlq", "purge", "idq", "--ids", second.message_id, "--yes", *common)
    assert code == 0, err
    assert message_count(amqp_url, dead_letter_queue) == 0
    assert runs.count(2) == 1


def test_info_and_cancel_take_the_dramatiq_message_id(ojs_broker, start_worker, amqp_url, prefix):
    common = ["--url", amqp_url, "--prefix", prefix]
    started, cancelled = threading.Event(), threading.Event()

    @dramatiq.actor(queue_name="idrun", max_retries=0)
    def busy() -> None:
        started.set()
        try:
            current_cancelled().wait(20)
        finally:  # interrupted (the default cancel_running) or woken by the event
            if current_cancelled().is_set():
                cancelled.set()

    message = busy.send()
    start_worker(worker_threads=1)
    assert started.wait(20)
    job_id = job_id_for(message.message_id, message.message_timestamp)

    code, out, err = invoke("info", message.message_id, "--queue", "idrun", "--json", *common)
    assert code == 0, err
    found = json.loads(out)
    assert found["job_id"] == job_id and found["state"] == "active"

    code, out, err = invoke("cancel", message.message_id, "--queue", "idrun", *common)
    assert code == 0, err
    assert cancelled.wait(10), "the running actor saw no cancel"
    wait_until(
        lambda: (
            ojs_broker.activity.lookup(message.message_id) is not None
            and ojs_broker.activity.lookup(message.message_id).state != "active"
        ),
        10,
        message="the run settled",
    )
    info = ojs_broker.client.info(message.message_id, queue="idrun")
    assert info is not None and info.job_id == job_id and info.state == "cancelled"
