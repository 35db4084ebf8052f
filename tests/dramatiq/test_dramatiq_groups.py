"""Dramatiq groups with a completion callback, and pipelines, across two ``dramatiq`` CLI processes, no Redis.

``OjsGroupCallbacks`` counts the members on the OJS fan-in; a worker is SIGKILLed after a member
reported and before its ack, so that member runs and reports twice.  Pipeline results travel in
the messages (Dramatiq's ``Pipelines`` middleware): no result backend anywhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import pytest
from dramatiq import group, pipeline
from support import message_count, wait_until

from ojs_dramatiq import OjsBroker, OjsGroupCallbacks

pytestmark = pytest.mark.timeout(120)

APPS = Path(__file__).parent / "apps"
MEMBERS = 19  # and one pipeline: a group of 20


def start_cli(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    # One thread: when its worker is killed, member 0 is the only message it runs, so that every
    # other message runs once (those it had prefetched are delivered again, to the other worker).
    command = [sys.executable, "-m", "dramatiq", "groups_app", "--processes", "1", "--threads", "1"]
    command += ["--path", str(APPS)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))


def test_a_group_callback_runs_once_after_every_member_across_processes(amqp_url, prefix, names, management, tmp_path):
    record, marker = tmp_path / "record.jsonl", tmp_path / "killed"
    record.touch()
    env = {
        **os.environ,
        "OJS_AMQP_URL": amqp_url,
        "OJS_TEST_PREFIX": prefix,
        "OJS_TEST_RECORD": str(record),
        "OJS_TEST_MARKER": str(marker),
        "OJS_TEST_MEMBERS": str(MEMBERS),
    }
    logs = [tmp_path / "worker0.log", tmp_path / "worker1.log"]
    workers = [start_cli(env, log) for log in logs]
    sender = OjsBroker(amqp_url, prefix=prefix)
    sender.add_middleware(OjsGroupCallbacks())
    try:
        options = {"min_backoff": 50, "max_backoff": 200}
        member, finished, add, total = (
            dramatiq.Actor(
                lambda *a: None, broker=sender, actor_name=name, queue_name="groups", priority=0, options=options
            )
            for name in ("member", "finished", "add", "total")
        )

        def records() -> list[dict]:
            return [json.loads(line) for line in record.read_text().splitlines()]

        def ran(actor: str) -> list[dict]:
            return [r for r in records() if r["actor"] == actor]

        started = time.monotonic()
        steps = pipeline([add.message(1, 2), add.message(3), total.message()], broker=sender)
        g = group([*(member.message(n) for n in range(MEMBERS)), steps], broker=sender)
        g.add_completion_callback(finished.message("done"))
        g.run()
        logs_text = lambda: "\n".join(log.read_text()[-2000:] for log in logs)  # noqa: E731
        wait_until(
            lambda: ran("finished") and [r["n"] for r in ran("member")].count(0) == 2,
            60,
            message=f"the callback and member 0's second run; worker logs:\n{logs_text()}",
        )
        # The CLI whose worker process was SIGKILLed notices it and exits; by then the other may
        # have run member 0 again already.
        killed = wait_until(lambda: [w for w in workers if w.poll() is not None], 30, message="the killed CLI exited")
        survivors = [w for w in workers if w.poll() is None]
        assert len(killed) == 1 and killed[0].returncode != 0 and len(survivors) == 1
        wait_until(lambda: message_count(amqp_url, names.job_queue("groups")) == 0, 20, message="the queue drained")
        survivors[0].send_signal(signal.SIGTERM)  # graceful: what it runs ends and is acked before it exits
        assert survivors[0].wait(60) == 0
        elapsed = time.monotonic() - started
    finally:
        sender.close()
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait(30)

    (callback,) = ran("finished")  # exactly once, though member 0 reported twice
    assert callback["tag"] == "done"
    assert callback["members_done"] == MEMBERS and callback["pipeline_done"]  # after every member ended
    runs = ran("member")
    assert sorted(r["n"] for r in runs) == [0, *range(MEMBERS)]  # member 0 twice, the others once
    first, second = (r for r in runs if r["n"] == 0)
    assert first["pid"] == int(marker.read_text()) != second["pid"] and second["retries"] == 1  # the lost attempt
    assert [r["result"] for r in ran("add")] == [3, 6] and [r["value"] for r in ran("total")] == [6]
    assert len({r["pid"] for r in records()}) == 2  # both processes ran jobs
    assert message_count(amqp_url, names.job_queue("groups")) == 0
    fan_in_streams = [q["name"] for q in management.queues(names.fan_in_stream(""))]
    assert fan_in_streams == []  # deleted once the callback was published
    print(f"group of {MEMBERS + 1} with a callback and a killed worker: {elapsed:.1f} s")
