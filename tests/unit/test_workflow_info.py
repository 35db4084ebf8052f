"""``workflow_info``: a workflow's records folded into its state (ojs-workflows.md §11.2), no broker."""

from __future__ import annotations

import pytest

from ojs_kombu import Job, batch, chain
from ojs_kombu.errors import ValidationError
from ojs_kombu.model.workflow import workflow_to_dict
from ojs_kombu.model.workflow_info import workflow_info


def _definition(w):
    return {"kind": "definition", "workflow": workflow_to_dict(w), "at": "2026-11-27T10:00:00Z"}


def test_a_chain_from_pending_to_completed():
    w = chain(*(Job.create("s", [i]) for i in range(3)), name="c")
    info = workflow_info([_definition(w)])
    assert (info.state, info.name, info.type) == ("pending", "c", "chain")
    assert [s.state for s in info.steps] == ["pending", "waiting", "waiting"]  # step 0 is enqueued
    records = [_definition(w)] + [
        {"kind": "step", "path": [i], "state": "completed", "result": i * 10, "attempt": 1, "at": "t"} for i in range(2)
    ]
    info = workflow_info(records)
    assert info.state == "running"
    assert [s.state for s in info.steps] == ["completed", "completed", "pending"]
    records.append({"kind": "step", "path": [2], "state": "completed", "result": 20})
    records.append({"kind": "step", "path": [2], "state": "failed", "error": {"code": "x"}})  # a rerun: the first wins
    records.append({"kind": "finished", "state": "completed", "at": "2026-11-27T10:00:05Z"})
    info = workflow_info(records)
    assert info.state == "completed" and info.result == 20
    assert info.completed_at == "2026-11-27T10:00:05Z" and info.created_at == "2026-11-27T10:00:00Z"
    enqueued = [{**_definition(w), "at": None}, {"kind": "enqueued", "at": "2026-11-27T10:00:01Z"}]
    assert workflow_info(enqueued).created_at == "2026-11-27T10:00:01Z"  # as WorkflowRunner.start records it
    data = info.to_dict()
    assert data["metadata"] == {
        "job_count": 3,
        "completed_count": 3,
        "failed_count": 0,
        "created_at": "2026-11-27T10:00:00Z",
        "completed_at": "2026-11-27T10:00:05Z",
    }
    assert data["steps"][2] == {
        "index": 2,
        "path": [2],
        "type": "s",
        "state": "completed",
        "job_id": w.steps[2].id,
        "result": 20,
    }


def test_a_failed_batch_member_and_its_error_report():
    w = batch([Job.create("m", [i]) for i in range(2)], on_failure=Job.create("alert", []))
    error = {"code": "handler_error", "message": "boom", "attempt": 3}
    records = [
        _definition(w),
        {"kind": "step", "path": [0], "state": "completed", "result": 1},
        {"kind": "step", "path": [1], "state": "failed", "error": error, "attempt": 3},
    ]
    info = workflow_info(records)
    assert info.state == "running"
    assert info.step("on_failure").state == "pending"
    assert info.errors == ({"job_id": w.jobs[1].id, "code": "handler_error", "message": "boom", "attempt": 3},)
    assert info.to_dict()["failed_job_ids"] == [w.jobs[1].id]
    with pytest.raises(KeyError):
        info.step(5)


def test_records_without_a_definition_are_refused():
    with pytest.raises(ValidationError):
        workflow_info([{"kind": "step", "path": [0], "state": "completed"}])


def test_a_cancel_ends_the_workflow_and_every_job_that_had_not_ended():
    w = chain(*(Job.create("s", [i]) for i in range(3)))
    cancelled_job = {"code": "cancelled", "message": "the job was cancelled"}
    records = [
        _definition(w),
        {"kind": "step", "path": [0], "state": "completed", "result": 0, "attempt": 1},
        {"kind": "cancelled", "at": "2026-11-27T10:00:03Z"},
        {"kind": "step", "path": [1], "state": "failed", "error": cancelled_job},  # dropped by the worker
        {"kind": "finished", "state": "failed", "at": "2026-11-27T10:00:04Z"},  # the planner's end, after
    ]
    info = workflow_info(records)
    assert (info.state, info.completed_at, info.result) == ("cancelled", "2026-11-27T10:00:03Z", None)
    assert [s.state for s in info.steps] == ["completed", "cancelled", "cancelled"]
    assert (info.completed_count, info.failed_count, info.errors) == (1, 0, ())
    assert info.to_dict()["metadata"]["cancelled_at"] == "2026-11-27T10:00:03Z"
    finished_first = [*records[:2], records[4], records[2]]  # it ended before the cancel was recorded
    assert workflow_info(finished_first).state == "failed"


def test_error_report_names_the_failed_chain_step_and_the_failed_callback():
    """§9.6: a chain's ``failed_step_index``; §9.4: a failed callback is recorded with its type."""
    w = chain(Job.create("s", [0]), batch([Job.create("m", [0])], on_complete=Job.create("done", [])))
    error = {"code": "handler_error", "message": "boom", "attempt": 2}
    records = [
        _definition(w),
        {"kind": "step", "path": [0], "state": "completed", "result": 1},
        {"kind": "step", "path": [1, 0], "state": "completed", "result": 2},
        {"kind": "step", "path": [1, "on_complete"], "state": "failed", "error": error, "attempt": 2},
        {"kind": "finished", "state": "failed", "at": "t"},
    ]
    info = workflow_info(records)
    assert info.state == "failed" and info.failed_step_index == 1
    callback_id = w.steps[1].callbacks["on_complete"].id
    assert info.errors == (
        {"job_id": callback_id, "code": "handler_error", "message": "boom", "attempt": 2, "callback": "on_complete"},
    )
    data = info.to_dict()
    assert data["failed_step_index"] == 1 and data["failed_job_ids"] == [callback_id]
    group_like = workflow_info(records[:1] + [{"kind": "step", "path": [0], "state": "failed", "error": error}])
    assert group_like.failed_step_index == 0 and "callback" not in group_like.errors[0]
    only_batch = batch([Job.create("m", [0])], on_complete=Job.create("done", []))
    failed_member = {"kind": "step", "path": [0], "state": "failed", "error": error}
    assert workflow_info([_definition(only_batch), failed_member]).failed_step_index is None  # chains only
