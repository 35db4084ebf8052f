"""Fan-in on a real broker (DESIGN §21): outcomes counted once per job, one Ready, callbacks fired once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest
from support import get_messages, message_count, raw_channel, wait_until

from ojs_kombu import Names
from ojs_kombu.amqp.fanin import MAX_READERS, STREAM_MAX_AGE, FanIn, Pending, Ready
from ojs_kombu.errors import NotFoundError, ResultTooLargeError, ValidationError
from ojs_kombu.model.ids import new_job_id
from ojs_kombu.model.job import Job
from ojs_kombu.model.workflow import MAX_RESULT_BYTES, batch, evaluate
from ojs_kombu.wire.codec import encode

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fan_in(amqp_url: str, names: Names) -> Iterator[FanIn]:
    with kombu.Connection(amqp_url) as connection:
        connection.connect()
        fan = FanIn(connection.connection, names=names)
        yield fan
        fan.close()


@pytest.fixture
def workflow_id(fan_in: FanIn) -> Iterator[str]:
    wf = new_job_id()
    yield wf
    fan_in.cleanup(wf)


def test_duplicates_count_once_and_one_ready(fan_in: FanIn, workflow_id: str):
    fan_in.open(workflow_id, 3, {"type": "chain", "steps": []})
    fan_in.open(workflow_id, 3)  # idempotent
    assert fan_in.report(workflow_id, 0, 3, "completed", {"a": 1}) == Pending(workflow_id, 1, 3)
    assert fan_in.report(workflow_id, 0, 3, "completed", {"a": "again"}) == Pending(workflow_id, 1, 3)
    assert fan_in.report(workflow_id, 2, 3, "completed", 3) == Pending(workflow_id, 2, 3)
    ready = fan_in.report(workflow_id, 1, 3, "completed", [2])
    assert isinstance(ready, Ready)
    assert ready.continuation == {"type": "chain", "steps": []}
    assert ready.results == {"0": {"a": 1}, "1": [2], "2": 3}  # the first report of job 0 wins
    assert ready.failed == ()
    # After the win, another job's late duplicate is told to wait, never Ready.
    assert fan_in.report(workflow_id, 2, 3, "completed", 3) == Pending(workflow_id, 3, 3)


def test_cleanup_and_late_reports(fan_in: FanIn, names: Names, amqp_url: str, management):
    wf = new_job_id()
    stream = names.fan_in_stream(wf)
    fan_in.open(wf, 2)
    fan_in.report(wf, 0, 2, "completed", 1)
    info = management.queue(stream)
    assert info is not None
    assert info["type"] == "stream"
    assert info["arguments"]["x-max-age"] == STREAM_MAX_AGE  # the safety net: RabbitMQ refuses x-expires here
    assert isinstance(fan_in.report(wf, 1, 2, "completed", 2), Ready)
    fan_in.cleanup(wf)
    fan_in.cleanup(wf)  # idempotent
    assert not _exists(amqp_url, stream)
    # Late reports after the clean-up (the winner's included) neither win nor declare the stream again.
    with kombu.Connection(amqp_url) as connection:
        connection.connect()
        other = FanIn(connection.connection, names=names)
        assert other.report(wf, 0, 2, "completed", 1) == Pending(wf, 2, 2)
        assert other.report(wf, 1, 2, "completed", 2) == Pending(wf, 2, 2)
        other.close()
    assert not _exists(amqp_url, stream)


def _exists(amqp_url: str, queue: str) -> bool:
    import pika.exceptions

    try:
        with raw_channel(amqp_url) as channel:
            channel.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    return True


def test_bad_reports_are_refused(fan_in: FanIn, workflow_id: str):
    with pytest.raises(NotFoundError, match="open"):
        fan_in.report(workflow_id, 0, 3, "completed")  # never opened: no stream to count in
    with pytest.raises(ValidationError) as info:
        fan_in.open(workflow_id, 0)
    assert info.value.field == "count"
    with pytest.raises(ValidationError) as info:
        fan_in.report(workflow_id, 3, 3, "completed")
    assert info.value.field == "index"
    with pytest.raises(ValidationError) as info:
        fan_in.report(workflow_id, 0, 3, "active")
    assert info.value.field == "state"
    with pytest.raises(ResultTooLargeError):
        fan_in.report(workflow_id, 0, 3, "completed", "x" * MAX_RESULT_BYTES)  # checked before anything is sent


def test_failure_selects_on_complete_and_on_failure(fan_in: FanIn, workflow_id: str, names: Names, amqp_url: str):
    members = [Job.create("email.send", [f"user{i}"]) for i in range(3)]
    wf = batch(
        members,
        on_complete=Job.create("batch.report", [], queue="reports", id=_derived(workflow_id, 1)),
        on_success=Job.create("batch.celebrate", [], queue="reports", id=_derived(workflow_id, 2)),
        on_failure=Job.create("batch.alert", [], queue="reports", id=_derived(workflow_id, 3)),
        id=workflow_id,
    )
    queue = names.job_queue("reports")
    with raw_channel(amqp_url) as channel:
        channel.queue_declare(queue, durable=True)
    try:
        fan_in.open(workflow_id, 3)
        fan_in.report(workflow_id, 0, 3, "completed", {"message_id": "msg_001"})
        fan_in.report(workflow_id, 2, 3, "failed", error={"code": "handler_error", "message": "bounced"})
        ready = fan_in.report(workflow_id, 1, 3, "completed", {"message_id": "msg_002"})
        assert isinstance(ready, Ready) and ready.failed == (2,)
        # The model selects the callbacks from the fan-in's states (spec §6.4, §12.3 scenario B).
        outcomes = {(i,): _outcome(state, ready.results[str(i)]) for i, state in ready.states.items()}
        status = evaluate(wf, outcomes)
        assert [r.path for r in status.runnable] == [("on_complete",), ("on_failure",)]
        assert all(r.parent_results == ready.results for r in status.runnable)
        callbacks = [(queue, encode(r.job)) for r in status.runnable]
        # The winner dies after the broker took both callbacks, before its "fired" record.
        append = fan_in._append

        def die_before_fired_record(stream: str, record_id: str, record: dict) -> None:
            if record.get("kind") == "fired":
                raise RuntimeError("SIGKILL")
            append(stream, record_id, record)

        fan_in._append = die_before_fired_record  # type: ignore[method-assign]
        with pytest.raises(RuntimeError):
            fan_in.fire(ready, callbacks)
        fan_in._append = append  # type: ignore[method-assign]
        wait_until(lambda: message_count(amqp_url, queue) == 2)
        # Its job is delivered again and reports again: Ready again, both callbacks known as fired.
        again = fan_in.report(workflow_id, 1, 3, "completed", {"message_id": "msg_002"})
        assert isinstance(again, Ready)
        assert again.fired == {wf.on_complete.id, wf.on_failure.id}  # type: ignore[union-attr]
        assert fan_in.fire(again, callbacks) == []
        # Once fire() finished, a further report of the winner's job is Pending.
        assert fan_in.report(workflow_id, 1, 3, "completed", {"message_id": "msg_002"}) == Pending(workflow_id, 3, 3)
        got = get_messages(amqp_url, queue, 2)
        assert sorted(props.message_id for _, props, _ in got) == sorted([wf.on_complete.id, wf.on_failure.id])  # type: ignore[union-attr]
        assert all(b"BCC" not in str(props.headers).encode() for _, props, _ in got)  # the broker strips it
        assert message_count(amqp_url, queue) == 0
    finally:
        with raw_channel(amqp_url) as channel:
            channel.queue_delete(queue)


def test_200_members_from_4_connections_some_twice(amqp_url: str, names: Names, fan_in: FanIn, workflow_id: str):
    count, threads_n = 200, 4
    rng = random.Random(7)
    indexes = list(range(count))
    rng.shuffle(indexes)
    duplicates = set(rng.sample(range(count), 40))
    outcomes: list[Ready | Pending | BaseException] = []
    barrier = threading.Barrier(threads_n)
    lock = threading.Lock()

    def reporter(mine: list[int]) -> None:
        try:
            with kombu.Connection(amqp_url) as connection:
                connection.connect()
                fan = FanIn(connection.connection, names=names)
                barrier.wait(timeout=30)
                for index in mine:
                    for _ in range(2 if index in duplicates else 1):
                        got = fan.report(workflow_id, index, count, "completed", {"i": index})
                        if isinstance(got, Ready):
                            fan.fire(got, [])  # as a worker does before its ack
                        with lock:
                            outcomes.append(got)
                fan.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
            with lock:
                outcomes.append(exc)

    fan_in.open(workflow_id, count)
    threads = [threading.Thread(target=reporter, args=(indexes[n::threads_n],)) for n in range(threads_n)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    elapsed = time.perf_counter() - started
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert not errors, errors
    ready = [o for o in outcomes if isinstance(o, Ready)]
    assert len(outcomes) == count + len(duplicates)
    assert len(ready) == 1, f"{len(ready)} Ready"
    assert ready[0].results == {str(i): {"i": i} for i in range(count)}
    print(
        f"\nfan-in: {len(outcomes)} reports from {threads_n} connections in {elapsed:.2f} s: {len(outcomes) / elapsed:.0f}/s"
    )


REPORTER = """
import sys, kombu
from ojs_kombu import Names
from ojs_kombu.amqp.fanin import FanIn, Ready
url, prefix, wf, count, start = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
with kombu.Connection(url) as connection:
    connection.connect()
    fan = FanIn(connection.connection, names=Names(prefix))
    for index in range(start, count):
        got = fan.report(wf, index, count, "completed", {"i": index})
        if isinstance(got, Ready):
            fan.fire(got, [])
        print(("READY" if isinstance(got, Ready) else "PENDING") + f" {index}", flush=True)
"""


def test_sigkilled_reporter_restarted_one_ready(amqp_url: str, prefix: str, fan_in: FanIn, workflow_id: str):
    count = 120
    fan_in.open(workflow_id, count)
    args = [sys.executable, "-c", REPORTER, amqp_url, prefix, workflow_id, str(count)]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    first = subprocess.Popen([*args, "0"], stdout=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    assert first.stdout is not None
    while len(lines) < 50:
        line = first.stdout.readline()
        assert line, "the reporter ended early"
        lines.append(line.split()[0])
    first.send_signal(signal.SIGKILL)  # it may have appended the 51st record without printing it
    first.wait(timeout=10)
    assert first.returncode == -signal.SIGKILL
    # Restarted like a redelivery: from the last job it announced, so one report at least is repeated.
    done = subprocess.run([*args, "49"], capture_output=True, text=True, env=env, timeout=120, check=True)
    lines += [line.split()[0] for line in done.stdout.splitlines()]
    assert lines.count("READY") == 1
    assert lines[-1] == "READY"  # the last job's report saw every index


def _derived(workflow_id: str, n: int) -> str:
    # A callback id derived from the workflow id (the next session's rule may differ; any fixed id will do here).
    return workflow_id[:-1] + "0123456789abcdef"[n]


def _outcome(state: str, entry: object):
    from ojs_kombu.model.workflow import Outcome

    if state == "failed":
        return Outcome("failed", error=entry["error"])  # type: ignore[index]
    return Outcome("completed", entry)


def test_stream_deleted_under_a_reader(fan_in: FanIn, names: Names, amqp_url: str):
    wf = new_job_id()
    fan_in.open(wf, 3)
    assert fan_in.report(wf, 0, 3, "completed", 0) == Pending(wf, 1, 3)  # its reader stays open
    with kombu.Connection(amqp_url) as connection:
        connection.connect()
        other = FanIn(connection.connection, names=names)
        other.cleanup(wf)  # a cancelled workflow, cleaned up elsewhere
        other.close()
    with pytest.raises(NotFoundError):
        fan_in.report(wf, 1, 3, "completed", 1)
    assert not _exists(amqp_url, names.fan_in_stream(wf))
    fan_in.open(wf, 3)  # the same object can use it again
    assert fan_in.report(wf, 1, 3, "completed", 1) == Pending(wf, 1, 3)
    fan_in.cleanup(wf)


def test_readers_are_bounded_and_an_evicted_workflow_is_read_again(fan_in: FanIn):
    ids = [new_job_id() for _ in range(MAX_READERS + 2)]
    try:
        for wf in ids:
            fan_in.open(wf, 2)
            assert fan_in.report(wf, 0, 2, "completed", wf) == Pending(wf, 1, 2)
        assert len(fan_in._logs) == MAX_READERS  # the oldest were closed and forgotten
        ready = fan_in.report(ids[0], 1, 2, "completed", "last")  # read again from offset 0
        assert isinstance(ready, Ready) and ready.results == {"0": ids[0], "1": "last"}
    finally:
        for wf in ids:
            fan_in.cleanup(wf)
