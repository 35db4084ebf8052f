"""The completion hook of workflows on a real broker, driven by hand: the test plays the worker.

Each job is taken from its queue, "run" by the test, and handed to ``WorkflowHook.on_terminal``
as a worker's Settler would (before the ack); the hook publishes what follows.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
from support import get_messages, message_count, wait_until

from ojs_kombu import Client, Job, Names, batch, chain, group
from ojs_kombu.amqp.connection import make_connection
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.errors import NotFoundError, OjsError
from ojs_kombu.model.workflow import WorkflowContext
from ojs_kombu.runtime.control import RunningEntry
from ojs_kombu.runtime.processing import RunningJob
from ojs_kombu.runtime.workflow import WorkflowHook, WorkflowRunner
from ojs_kombu.wire.codec import decode


@pytest.fixture
def hook(amqp_url: str, names: Names) -> Iterator[WorkflowHook]:
    # No sweep jobs (each would declare the test prefix's scheduling cascade: ~1 s to delete after the
    # test); the sweep is tested in test_dramatiq_worker.py and test_transport_settle.py.
    h = WorkflowHook(lambda: kombu.Connection(amqp_url), Topology(names), sweep_after=None)
    yield h
    h.close()


def take(amqp_url: str, names: Names, queue: str, count: int) -> list[Job]:
    """Take ``count`` jobs from ``queue`` (acked: the test settles them itself)."""
    got = get_messages(amqp_url, names.job_queue(queue), count)
    assert len(got) == count, f"{len(got)} of {count} jobs arrived on {queue}"
    return [decode(body, {"message_id": props.message_id}, props.headers) for _, props, body in got]


def parent_results(job: Job) -> dict[str, Any]:
    context = WorkflowContext.from_meta(job.meta)
    assert context is not None
    return context.parent_results


def test_chain_passes_results_and_reads_completed(amqp_url, client: Client, names: Names, hook: WorkflowHook):
    w = chain(*(Job.create("step.run", [i], queue="wfq") for i in range(3)), name="three")
    assert client.enqueue_workflow(w) == w.id
    assert client.workflow(w.id).state == "pending"
    for index in range(3):
        (job,) = take(amqp_url, names, "wfq", 1)
        assert job.args == [index]
        assert parent_results(job) == {str(i): {"step": i} for i in range(index)}
        hook.on_terminal(job, "completed", {"step": index})
    assert message_count(amqp_url, names.job_queue("wfq")) == 0
    info = client.workflow(w.id)
    assert info.state == "completed"
    assert [s.state for s in info.steps] == ["completed"] * 3
    assert info.result == {"step": 2}
    assert info.completed_count == 3
    assert info.to_dict()["steps"][1]["result"] == {"step": 1}


def test_a_failed_step_stops_the_chain(amqp_url, client: Client, names: Names, hook: WorkflowHook):
    w = chain(*(Job.create("step.run", [i], queue="wfq") for i in range(3)))
    client.enqueue_workflow(w)
    (job,) = take(amqp_url, names, "wfq", 1)
    hook.on_terminal(job, "completed", 1)
    (job,) = take(amqp_url, names, "wfq", 1)
    hook.on_terminal(job, "failed", error={"code": "handler_error", "message": "boom"})
    info = client.workflow(w.id)
    assert info.state == "failed"
    assert [s.state for s in info.steps] == ["completed", "failed", "cancelled"]
    assert info.errors[0]["job_id"] == job.id
    assert message_count(amqp_url, names.job_queue("wfq")) == 0


def test_batch_callback_once_with_every_result_and_duplicates(amqp_url, client, names, hook):
    members = [Job.create("member.run", [i], queue="wfq") for i in range(5)]
    w = batch(
        members,
        on_complete=Job.create("batch.done", [], queue="cbq"),
        on_failure=Job.create("batch.bad", [], queue="cbq"),
    )
    client.enqueue_workflow(w)
    jobs = take(amqp_url, names, "wfq", 5)
    for job in jobs:
        hook.on_terminal(job, "completed", job.args[0] * 10)
    hook.on_terminal(jobs[0], "completed", "again")  # a job run twice reports twice: counted once
    (callback,) = take(amqp_url, names, "cbq", 1)
    assert callback.type == "batch.done"
    assert parent_results(callback) == {str(i): i * 10 for i in range(5)}
    assert client.workflow(w.id).state == "running"  # the callback has not ended yet
    hook.on_terminal(callback, "completed", None)
    info = client.workflow(w.id)
    assert info.state == "completed"
    assert info.step("on_failure").state == "cancelled"
    assert message_count(amqp_url, names.job_queue("cbq")) == 0


def test_group_in_chain_and_failure_fires_on_failure(amqp_url, client, names, hook, management):
    inner = batch(
        [Job.create("member.run", [i], queue="wfq") for i in range(3)],
        on_complete=Job.create("batch.done", [], queue="cbq"),
        on_failure=Job.create("batch.bad", [], queue="cbq"),
    )
    w = chain(Job.create("first", [], queue="wfq"), inner, group([Job.create("last", [], queue="wfq")]))
    client.enqueue_workflow(w)
    (first,) = take(amqp_url, names, "wfq", 1)
    hook.on_terminal(first, "completed", "r0")
    jobs = take(amqp_url, names, "wfq", 3)
    assert all(parent_results(job) == {"0": "r0"} for job in jobs)
    hook.on_terminal(jobs[0], "completed", 0)
    hook.on_terminal(jobs[1], "failed", error={"code": "handler_error", "message": "no"})
    hook.on_terminal(jobs[2], "cancelled")
    callbacks = sorted(take(amqp_url, names, "cbq", 2), key=lambda job: job.type)
    assert [c.type for c in callbacks] == ["batch.bad", "batch.done"]
    results = parent_results(callbacks[0])
    assert results["0"] == 0 and results["1"]["error"]["code"] == "handler_error"
    assert results["2"]["error"]["code"] == "cancelled"
    for callback in callbacks:
        hook.on_terminal(callback, "completed", "cb")
    (last,) = take(amqp_url, names, "wfq", 1)
    assert last.type == "last"
    assert parent_results(last)["0"] == "r0"
    hook.on_terminal(last, "completed", "end")
    info = client.workflow(w.id)
    assert info.state == "completed"
    assert info.failed_count == 2
    # the fan-in streams are deleted once the workflow ended; its record stays
    assert management.queue(names.workflow_log_stream(w.id)) is not None
    for fan_id in (inner.id, f"{inner.id}.callbacks", w.steps[2].id):
        assert management.queue(names.fan_in_stream(fan_id)) is None


def test_unknown_workflow_is_not_found(client: Client):
    with pytest.raises(NotFoundError):
        client.workflow("0195f000-0000-7000-8000-000000000000")


def test_a_job_outside_workflows_costs_nothing(hook: WorkflowHook):
    hook.on_terminal(Job.create("plain", []), "completed", 1)
    assert hook._runner is None


def test_the_hook_survives_its_connection_being_closed(amqp_url, client, names, management):
    name = f"wf-hook-{uuid.uuid4().hex[:8]}"
    hook = WorkflowHook(
        lambda: make_connection(amqp_url, heartbeat=0, ssl=None, transport_options=None, connection_name=name),
        Topology(names),
        sweep_after=None,  # as the fixture's hook
    )
    try:
        w = chain(*(Job.create("step.run", [i], queue="wfq") for i in range(3)))
        client.enqueue_workflow(w)
        (job,) = take(amqp_url, names, "wfq", 1)
        hook.on_terminal(job, "completed", 0)

        def named() -> list[dict[str, Any]]:
            return [
                c for c in management.connections() if c.get("client_properties", {}).get("connection_name") == name
            ]

        wait_until(lambda: bool(named()), timeout=15, interval=0.2, message="the hook's connection listed")
        first = hook._connection
        # The broker sends Connection.Close; the hook's idle connection reads it on its next call.
        assert management.close_connection(named()[0]["name"])
        for index in (1, 2):  # the first call meets the closed connection, and is made again on a new one
            (job,) = take(amqp_url, names, "wfq", 1)
            assert parent_results(job)[str(index - 1)] == index - 1
            hook.on_terminal(job, "completed", index)
        assert hook._connection is not first  # replaced
        assert client.workflow(w.id).state == "completed"
    finally:
        hook.close()


def test_reports_queued_behind_the_lock_go_out_together(amqp_url, client, names, hook, monkeypatch):
    """Jobs that end while a report holds the lock are reported in one ``ended_many``: each caller
    returns once its own report is confirmed, a duplicate counts once, the callback fires once,
    and a bad job (its fan-in is gone) fails alone, in its own thread."""
    members = [Job.create("member.run", [i], queue="wfq") for i in range(6)]
    w = batch(members, on_complete=Job.create("batch.done", [], queue="cbq"))
    client.enqueue_workflow(w)
    jobs = take(amqp_url, names, "wfq", 6)
    meta = {
        **jobs[1].meta,
        "workflow": {**jobs[1].meta["workflow"], "fan_in": {"id": str(uuid.uuid4()), "index": 1, "count": 2}},
    }
    bad = jobs[1].model_copy(update={"meta": meta})
    calls: list[int] = []
    runner_ended_many = WorkflowRunner.ended_many
    monkeypatch.setattr(
        WorkflowRunner, "ended_many", lambda self, ended: (calls.append(len(ended)), runner_ended_many(self, ended))[1]
    )
    errors: dict[str, BaseException] = {}

    def report(job: Job) -> None:
        try:
            hook.on_terminal(job, "completed", job.args[0] * 10)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors[job.id if job is not bad else "bad"] = exc

    threads = [threading.Thread(target=report, args=(job,)) for job in [*jobs, jobs[0], bad]]
    with hook._lock:  # a report in progress: every job that ends meanwhile queues up
        for thread in threads:
            thread.start()
        wait_until(lambda: len(hook._queue) == len(threads), timeout=10)
    for thread in threads:
        thread.join(30)
    assert list(errors) == ["bad"] and isinstance(errors["bad"], NotFoundError)  # its fan-in does not exist
    assert calls[0] == len(threads)  # together first; then one by one, as the bad job failed them
    (callback,) = take(amqp_url, names, "cbq", 1)
    assert parent_results(callback) == {str(i): i * 10 for i in range(6)}
    hook.on_terminal(callback, "completed", None)
    info = client.workflow(w.id)
    assert info.state == "completed" and info.completed_count == 6
    assert message_count(amqp_url, names.job_queue("cbq")) == 0


def test_callback_reads_results_over_the_inline_budget_from_the_fan_in(amqp_url, client, names, hook):
    """§7.5: ten 60 KB results (over the 512 KiB inline budget together) are not carried by the
    callback's envelope; ``current_job().parent_results`` reads them from the batch's fan-in."""
    members = [Job.create("member.run", [i], queue="wfq") for i in range(10)]
    w = batch(members, on_complete=Job.create("batch.done", [], queue="cbq"))
    client.enqueue_workflow(w)
    jobs = take(amqp_url, names, "wfq", 10)
    results = {job.args[0]: {"i": job.args[0], "blob": "x" * 60_000} for job in jobs}
    for job in jobs:
        hook.on_terminal(job, "completed", results[job.args[0]])
    (callback,) = take(amqp_url, names, "cbq", 1)
    context = WorkflowContext.from_meta(callback.meta)
    assert context is not None and context.results_from == w.id and context.parent_results == {}
    running = RunningJob.of(callback, 1, RunningEntry(callback.id, "cbq", threading.get_ident()), hook.results)
    assert running.parent_results == {str(i): results[i] for i in range(10)}
    with pytest.raises(OjsError, match="only a Worker"):
        _ = RunningJob.of(callback, 1, RunningEntry(callback.id, "cbq", 0)).parent_results
    hook.on_terminal(callback, "completed", None)
    assert client.workflow(w.id).state == "completed"
