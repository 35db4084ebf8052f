"""Unique jobs end to end (issue 30 item 1): the Client takes the lock before the publish, the worker frees it
when the job ends; on_conflict modes; no orphaned lock; a duplicate stays refused through retries and a
SIGKILLed worker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from support import enqueue_at_once, message_count, wait_until

from ojs_kombu import Client, Discard, DuplicateJobError, Job, RetryPolicy, UniquePolicy, ValidationError
from ojs_kombu.policy import job_unique_key

UNIQUE = UniquePolicy(keys=["type", "args"], period="PT1H")


def accepted_eventually(client: Client, type_: str, args: list, *, timeout: float = 15.0, **options) -> Job:
    """Enqueue until the lock is free (the worker frees it just after the ack)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.enqueue(type_, args, unique=UNIQUE, **options)
        except DuplicateJobError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_16_clients_at_once_one_accepted_15_duplicates_and_it_runs_once(amqp_url, prefix, client, worker_factory):
    def warm_up(own: Client) -> None:
        own.enqueue("u.noop", [0], queue="default")  # connected, channels open: only the race remains

    accepted, refused = enqueue_at_once(lambda: Client(amqp_url, prefix=prefix), "u.once", UNIQUE, warm_up=warm_up)
    assert len(accepted) == 1 and len(refused) == 15
    assert {exc.existing_id for exc in refused} == {accepted[0].id}
    assert {exc.key for exc in refused} == {job_unique_key(accepted[0])}

    runs: list[str] = []
    worker = worker_factory()
    worker.handler("u.noop", lambda _: None)
    worker.handler("u.once", lambda _: runs.append("ran"))
    worker.start()
    wait_until(lambda: runs, timeout=20, message="the unique job to run")
    again = accepted_eventually(client, "u.once", [42])  # released after completion
    wait_until(lambda: len(runs) == 2, timeout=20, message="the second job to run")
    assert again.id != accepted[0].id
    assert message_count(amqp_url, worker.names.job_queue("default")) == 0


def test_reject_is_the_default_and_other_keys_are_independent(client):
    first = client.enqueue("u.rej", [1], unique=UniquePolicy(keys=["type", "args"]))
    with pytest.raises(DuplicateJobError) as info:
        client.enqueue("u.rej", [1], unique=UniquePolicy(keys=["type", "args"]))
    assert info.value.existing_id == first.id
    client.enqueue("u.rej", [2], unique=UniquePolicy(keys=["type", "args"]))  # another key
    client.enqueue("u.rej", [1])  # no policy: not checked


def test_ignore_returns_the_existing_id_and_publishes_nothing(client, names):
    first = client.enqueue("u.ign", [1], unique=UNIQUE)
    again = client.enqueue("u.ign", [1], unique=UNIQUE.model_copy(update={"on_conflict": "ignore"}))
    assert again.id == first.id
    [result] = client.enqueue_many(
        [Job.create("u.ign", [1], unique={"keys": ["type", "args"], "on_conflict": "ignore"})]
    )
    assert result.ok and result.deduplicated and result.existing_id == first.id and result.job.id == first.id
    assert message_count(client.url, names.job_queue("default")) == 1


def test_enqueue_many_refuses_the_duplicates_of_its_own_batch(client, names):
    jobs = [Job.create("u.many", [i % 2], unique=UNIQUE) for i in range(4)]
    results = client.enqueue_many(jobs)
    assert [r.ok for r in results] == [True, True, False, False]
    assert isinstance(results[2].error, DuplicateJobError) and results[2].error.existing_id == jobs[0].id
    assert isinstance(results[3].error, DuplicateJobError) and results[3].error.existing_id == jobs[1].id
    assert message_count(client.url, names.job_queue("default")) == 2


def test_replace_cancels_the_existing_job_and_runs_the_new_one(client, worker_factory):
    replace = UniquePolicy(keys=["type", "args"], args_keys=["user"], on_conflict="replace")
    old = client.enqueue("u.rep", [{"user": 7, "v": "old"}], unique=replace)
    new = client.enqueue("u.rep", [{"user": 7, "v": "new"}], unique=replace)
    assert new.id != old.id
    with pytest.raises(DuplicateJobError) as info:  # the new job holds the key now
        client.enqueue("u.rep", [{"user": 7, "v": "x"}], unique=replace.model_copy(update={"on_conflict": "reject"}))
    assert info.value.existing_id == new.id
    runs: list[str] = []
    worker = worker_factory()
    worker.handler("u.rep", lambda arg: runs.append(arg["v"]))
    worker.start()
    wait_until(lambda: runs, timeout=20, message="the new job to run")
    time.sleep(0.5)  # the cancelled one, acked unrun, never shows up
    assert runs == ["new"]


def test_replace_except_schedule_keeps_the_existing_schedule(client):
    policy = UniquePolicy(keys=["type"], on_conflict="replace_except_schedule")
    old = client.enqueue("u.res", [1], unique=policy, scheduled_at=timedelta(minutes=30))
    new = client.enqueue("u.res", [2], unique=policy)
    assert new.id != old.id
    assert new.scheduled_at == old.scheduled_at
    assert new.args == [2]


def test_a_failed_publish_frees_the_lock(client):
    with pytest.raises(ValidationError):  # refused after the lock was taken: scheduled beyond the cascade
        client.enqueue("u.fail", [1], unique=UNIQUE, scheduled_at=timedelta(days=365 * 50))
    client.enqueue("u.fail", [1], unique=UNIQUE)  # the lock was freed


@pytest.mark.parametrize("outcome", ["completed", "dead-lettered", "discarded", "cancelled"])
def test_the_lock_is_freed_when_the_job_ends(client, worker_factory, outcome):
    started = threading.Event()
    proceed = threading.Event()

    def handler(_):
        started.set()
        proceed.wait(10)
        if outcome == "dead-lettered":
            raise RuntimeError("fails for good")
        if outcome == "discarded":
            raise Discard("not wanted")

    worker = worker_factory()
    worker.handler("u.end", handler)
    worker.start()
    job = client.enqueue("u.end", [1], unique=UNIQUE, retry=RetryPolicy(max_attempts=1))
    assert started.wait(20)
    with pytest.raises(DuplicateJobError):  # running: held
        client.enqueue("u.end", [1], unique=UNIQUE)
    if outcome == "cancelled":
        client.cancel(job.id, queue="default")
    proceed.set()
    again = accepted_eventually(client, "u.end", [1])
    assert again.id != job.id


def test_a_job_waiting_for_its_retry_keeps_the_lock(client, worker_factory):
    attempts: list[int] = []

    def flaky(_):
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")

    worker = worker_factory()
    worker.handler("u.retry", flaky)
    worker.start()
    job = client.enqueue(
        "u.retry", [1], unique=UNIQUE, retry=RetryPolicy(max_attempts=3, initial_interval="PT3S", jitter=False)
    )
    wait_until(lambda: attempts, timeout=20, message="the first attempt")
    time.sleep(0.5)  # in its retry queue now
    with pytest.raises(DuplicateJobError) as info:
        client.enqueue("u.retry", [1], unique=UNIQUE)
    assert info.value.existing_id == job.id
    wait_until(lambda: len(attempts) == 2, timeout=20, message="the retry")
    accepted_eventually(client, "u.retry", [1])


WORKER = """
import sys, time
from pathlib import Path
from ojs_kombu import Worker
worker = Worker(sys.argv[1], prefix=sys.argv[2], concurrency=1)
def slow(_):
    Path(sys.argv[3]).write_text("started")
    time.sleep(600)
worker.handler("u.kill", slow)
worker.run()
"""


def test_a_sigkilled_worker_leaves_the_lock_held_until_the_redelivered_job_completes(
    amqp_url, prefix, client, worker_factory, tmp_path: Path
):
    marker = tmp_path / "started"
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, amqp_url, prefix, str(marker)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        job = client.enqueue(
            "u.kill", [1], unique=UNIQUE, retry=RetryPolicy(max_attempts=3, initial_interval="PT1S", jitter=False)
        )
        wait_until(marker.exists, timeout=30, message="the job to start in the worker process")
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    with pytest.raises(DuplicateJobError) as info:  # the killed worker's job is not over
        client.enqueue("u.kill", [1], unique=UNIQUE)
    assert info.value.existing_id == job.id
    runs: list[int] = []
    release = threading.Event()

    def finish(_):
        runs.append(1)
        release.wait(10)

    worker = worker_factory()
    worker.handler("u.kill", finish)
    worker.start()
    wait_until(lambda: runs, timeout=30, message="the redelivered job to run again")
    with pytest.raises(DuplicateJobError):  # running again: still held
        client.enqueue("u.kill", [1], unique=UNIQUE)
    release.set()
    accepted_eventually(client, "u.kill", [1])


def test_the_async_client_forwards_the_policy(amqp_url, prefix):
    from ojs_kombu import AsyncClient

    async def scenario() -> tuple[Job, DuplicateJobError]:
        async with AsyncClient(amqp_url, prefix=prefix) as client:
            first = await client.enqueue("u.aio", [1], unique=UNIQUE)
            try:
                await client.enqueue("u.aio", [1], unique=UNIQUE)
            except DuplicateJobError as exc:
                return first, exc
            raise AssertionError("the duplicate was accepted")

    first, exc = asyncio.run(scenario())
    assert exc.existing_id == first.id


def test_a_job_without_a_handler_is_dead_lettered_and_frees_its_lock(client, worker_factory):
    worker = worker_factory()
    worker.handler("u.other", lambda _: None)
    worker.start()
    first = client.enqueue("u.nohandler", [1], unique=UNIQUE)
    assert accepted_eventually(client, "u.nohandler", [1]).id != first.id
