"""Workflows without a broker (ojs-workflows.md): definitions, the state machine, parent_results, limits, wire form."""

from __future__ import annotations

import json

import jsonschema
import pytest

import ojs_kombu
from ojs_kombu import InvalidWorkflowError, Job, ResultTooLargeError, ValidationError, WorkflowStateError
from ojs_kombu.model.body import MAX_ENVELOPE_BYTES
from ojs_kombu.model.workflow import (
    MAX_INLINE_RESULTS_BYTES,
    MAX_NESTING_DEPTH,
    MAX_RESULT_BYTES,
    STEP_TRANSITIONS,
    WORKFLOW_TRANSITIONS,
    Batch,
    Chain,
    FanInRef,
    Group,
    Outcome,
    WorkflowContext,
    batch,
    chain,
    check_result,
    check_step_transition,
    check_transition,
    depth,
    evaluate,
    fit_parent_results,
    group,
    job_count,
    node_at,
    workflow_from_dict,
    workflow_to_dict,
)
from tools.schema import registry

WORKFLOW_SCHEMA_ID = "https://openjobspec.org/schemas/v1/workflow.json"


def job(kind: str, *args: object) -> Job:
    return Job.create(kind, list(args))


def done(result: object = None) -> Outcome:
    return Outcome("completed", result)


def failed(message: str = "boom") -> Outcome:
    return Outcome("failed", error={"code": "handler_error", "message": message})


# --------------------------------------------------------------------------- building


def test_builders_are_exported_from_the_package():
    assert ojs_kombu.chain is chain and ojs_kombu.group is group and ojs_kombu.batch is batch


def test_chain_group_batch_objects():
    a, b = job("a.run"), job("b.run")
    c = chain(a, b, name="pipeline")
    assert isinstance(c, Chain) and c.steps == (a, b) and c.name == "pipeline" and c.type == "chain"
    g = group([a, b])
    assert isinstance(g, Group) and g.jobs == (a, b) and g.id != c.id
    on_done = job("batch.report")
    bt = batch([a, b], on_complete=on_done)
    assert isinstance(bt, Batch) and bt.callbacks == {"on_complete": on_done}
    assert len({c.id, g.id, bt.id}) == 3  # UUIDv7 ids, each its own


def test_job_specs_are_members():
    spec = {"type": "email.send", "args": ["a@example.com"], "options": {"queue": "email", "timeout_ms": 1500}}
    g = group([spec, job("b.run")])
    first = g.jobs[0]
    assert isinstance(first, Job)
    assert (first.type, first.args, first.queue, first.timeout) == ("email.send", ["a@example.com"], "email", 2)


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: chain(), "steps"),  # §4.2: at least one step
        (lambda: group([]), "jobs"),  # §5.2
        (lambda: batch([job("a.run")]), "callbacks"),  # §6.2: at least one callback
        (lambda: batch([]), "jobs"),
        (lambda: group([{"type": "a.run"}]), "jobs[0].args"),  # §3.2: args REQUIRED
        (lambda: group([{"type": "Bad Type", "args": []}]), "jobs[0].type"),
        (lambda: group([{"type": "a.run", "args": [], "options": {"colour": 1}}]), "jobs[0].options.colour"),
        (lambda: group([42]), "jobs[0]"),
        (lambda: group(job("a.run")), "jobs"),  # a single job, not a list
        (lambda: batch([job("a.run")], on_complete=group([job("b.run")])), "callbacks.on_complete"),
        (lambda: chain(job("a.run"), id="not-a-uuid"), "id"),
    ],
)
def test_invalid_definitions_are_refused_when_built(build, field):
    with pytest.raises(InvalidWorkflowError) as info:
        build()
    assert info.value.field == field
    assert info.value.code == "invalid_workflow"
    assert isinstance(info.value, ValidationError)


def test_allowed_compositions_and_refused_ones():
    a = job("a.run")
    # §10.1: the six compositions listed.
    chain(a, group([a]))
    chain(a, batch([a], on_complete=a))
    group([chain(a, a)])
    group([batch([a], on_success=a)])
    batch([chain(a, a)], on_failure=a)
    batch([group([a])], on_complete=a)
    for build in (
        lambda: chain(chain(a)),
        lambda: group([group([a])]),
        lambda: batch([batch([a], on_complete=a)], on_complete=a),
    ):
        with pytest.raises(InvalidWorkflowError, match="not a composition of the spec"):
            build()


def test_nesting_depth_three_levels_then_refused():
    a = job("a.run")
    three = chain(a, group([chain(a, a)]))  # §10.2: a chain containing a group containing chains
    assert depth(three) == MAX_NESTING_DEPTH == 3
    with pytest.raises(InvalidWorkflowError, match="nests 4 workflow levels"):
        group([chain(a, group([chain(a, a)]))])


def test_job_count_includes_nested_jobs_not_callbacks():
    a = job("a.run")
    assert job_count(chain(a, group([a, chain(a, a)]), a)) == 5
    assert job_count(batch([a, a], on_complete=a, on_failure=a)) == 2


# --------------------------------------------------------------------------- the spec's JSON form


def test_spec_examples_read_and_round_trip():
    order = {
        "type": "chain",
        "name": "order-processing",
        "steps": [
            {
                "type": "order.validate",
                "args": [{"order_id": "ord_123"}],
                "options": {"queue": "orders", "retry": {"max_attempts": 3}},
            },
            {"type": "payment.charge", "args": [], "options": {"queue": "payments", "timeout_ms": 30000}},
            {"type": "inventory.reserve", "args": []},
            {"type": "notification.send", "args": []},
        ],
    }
    wf = workflow_from_dict(order)
    assert isinstance(wf, Chain) and wf.name == "order-processing" and len(wf.steps) == 4
    assert wf.steps[0].queue == "orders" and wf.steps[1].timeout == 30  # type: ignore[union-attr]
    again = workflow_from_dict(workflow_to_dict(wf))
    assert again == wf  # ids, jobs and names kept
    etl = {
        "type": "chain",
        "steps": [
            {"type": "data.extract", "args": []},
            {"type": "group", "name": "parallel-transforms", "jobs": [{"type": "transform.csv", "args": []}]},
            {"type": "data.load", "args": []},
        ],
    }
    nested = workflow_from_dict(etl)
    assert isinstance(nested.steps[1], Group) and nested.steps[1].name == "parallel-transforms"  # type: ignore[union-attr]
    bulk = {
        "type": "batch",
        "jobs": [{"type": "email.send", "args": ["user1@example.com", "welcome"]}],
        "callbacks": {
            "on_complete": {"type": "batch.report", "args": []},
            "on_failure": {"type": "batch.alert", "args": []},
        },
    }
    b = workflow_from_dict(bulk)
    assert isinstance(b, Batch) and set(b.callbacks) == {"on_complete", "on_failure"}


def test_to_dict_validates_against_the_workflow_schema():
    validator = jsonschema.Draft202012Validator({"$ref": WORKFLOW_SCHEMA_ID}, registry=registry())
    a = job("a.run", 1)
    for wf in (chain(a, group([a, chain(a, a)])), batch([a], on_complete=a, on_failure=a)):
        errors = list(validator.iter_errors(workflow_to_dict(wf)))
        assert not errors, errors


@pytest.mark.parametrize(
    "data, field",
    [
        ({"type": "dag", "steps": []}, "$.type"),
        ({"type": "chain"}, "$.steps"),
        ({"type": "chain", "steps": []}, "$.steps"),
        ({"type": "batch", "jobs": [{"type": "a.run", "args": []}]}, "$.callbacks"),
        ({"type": "batch", "jobs": [{"type": "a.run", "args": []}], "callbacks": {}}, "$.callbacks"),
        (
            {
                "type": "batch",
                "jobs": [{"type": "a.run", "args": []}],
                "callbacks": {"on_done": {"type": "a.run", "args": []}},
            },
            "$.callbacks",
        ),
        ({"type": "group", "jobs": [{"type": "a.run", "args": "x"}]}, "$.jobs[0].args"),
    ],
)
def test_invalid_json_names_the_path(data, field):
    with pytest.raises(InvalidWorkflowError) as info:
        workflow_from_dict(data)
    assert info.value.field == field


# --------------------------------------------------------------------------- chains (§4, §7.2, §9.2)


def test_chain_enqueues_one_step_at_a_time_with_all_earlier_results():
    steps = [job("order.validate"), job("payment.charge"), job("inventory.reserve"), job("notification.send")]
    wf = chain(*steps)
    status = evaluate(wf, {})
    assert status.state == "pending"
    assert [(r.path, r.parent_results) for r in status.runnable] == [((0,), {})]  # §4.3.1: only step 0
    assert status.steps == {(0,): "waiting", (1,): "waiting", (2,): "waiting", (3,): "waiting"}
    outcomes = {(0,): Outcome("active")}
    assert evaluate(wf, outcomes).state == "running" and evaluate(wf, outcomes).runnable == ()
    order = {"order_id": "ord_123", "total": 99.99}
    outcomes = {(0,): done(order)}
    status = evaluate(wf, outcomes)
    assert [(r.path, r.parent_results) for r in status.runnable] == [((1,), {"0": order})]
    outcomes = {(0,): done(order), (1,): done({"charge_id": "ch_abc123"}), (2,): Outcome("pending")}
    status = evaluate(wf, outcomes)
    assert status.runnable == () and status.steps[(2,)] == "pending" and status.steps[(3,)] == "waiting"
    outcomes[(2,)] = done({"reservation_id": "res_xyz"})
    (step3,) = evaluate(wf, outcomes).runnable
    assert step3.parent_results == {"0": order, "1": {"charge_id": "ch_abc123"}, "2": {"reservation_id": "res_xyz"}}
    assert step3.job is steps[3]
    outcomes[(3,)] = done({"notification_id": "notif_001"})
    status = evaluate(wf, outcomes)
    assert status.state == "completed" and status.result == {"notification_id": "notif_001"}
    assert (status.job_count, status.completed_count, status.failed_count) == (4, 4, 0)


def test_chain_failure_cancels_the_rest():
    wf = chain(job("a.run"), job("b.run"), job("c.run"), job("d.run"))
    status = evaluate(wf, {(0,): done(1), (1,): failed()})
    assert status.state == "failed"
    assert status.runnable == ()  # §9.2.3: nothing more enqueued
    assert status.steps == {(0,): "completed", (1,): "failed", (2,): "cancelled", (3,): "cancelled"}
    assert status.failed_paths == ((1,),)
    assert (status.completed_count, status.failed_count) == (1, 1)


def test_a_retrying_step_is_not_a_failure():
    wf = chain(job("a.run"), job("b.run"))
    status = evaluate(wf, {(0,): Outcome("active")})  # attempt 1 failed, a retry is pending or running
    assert status.state == "running" and status.failed_count == 0


# --------------------------------------------------------------------------- groups (§5, §9.3)


def test_group_enqueues_all_and_fails_only_when_all_ended():
    wf = group([job("export.csv"), job("export.pdf"), job("export.xlsx")])
    status = evaluate(wf, {})
    assert [r.path for r in status.runnable] == [(0,), (1,), (2,)]  # §5.3.1: all at once
    status = evaluate(wf, {(0,): done("csv"), (1,): failed(), (2,): Outcome("active")})
    assert status.state == "running"  # §9.3.2: running until every job ended
    assert status.runnable == ()
    status = evaluate(wf, {(0,): done("csv"), (1,): failed(), (2,): done("xlsx")})
    assert status.state == "failed" and status.failed_paths == ((1,),)
    status = evaluate(wf, {(0,): done("csv"), (1,): done("pdf"), (2,): done("xlsx")})
    assert status.state == "completed" and status.result == {"0": "csv", "1": "pdf", "2": "xlsx"}


def test_group_inside_chain_passes_results_by_job_index():
    wf = chain(job("data.extract"), group([job("export.csv"), job("export.pdf"), job("export.xlsx")]), job("data.load"))
    status = evaluate(wf, {(0,): done({"report_id": "rpt_456"})})
    # §10.3: every job of the group receives the extract result.
    assert [(r.path, r.parent_results) for r in status.runnable] == [
        ((1, i), {"0": {"report_id": "rpt_456"}}) for i in range(3)
    ]
    outcomes = {
        (0,): done({"report_id": "rpt_456"}),
        (1, 0): done({"path": "/exports/rpt_456.csv"}),
        (1, 1): done({"path": "/exports/rpt_456.pdf"}),
        (1, 2): done({"path": "/exports/rpt_456.xlsx"}),
    }
    (load,) = evaluate(wf, outcomes).runnable
    assert load.path == (2,)
    assert load.parent_results == {  # §7.3, verbatim
        "0": {"report_id": "rpt_456"},
        "1": {
            "0": {"path": "/exports/rpt_456.csv"},
            "1": {"path": "/exports/rpt_456.pdf"},
            "2": {"path": "/exports/rpt_456.xlsx"},
        },
    }


def test_failed_group_stops_the_chain():
    wf = chain(group([job("a.run"), job("b.run")]), job("c.run"))
    status = evaluate(wf, {(0, 0): failed(), (0, 1): done(1)})
    assert status.state == "failed" and status.steps[(1,)] == "cancelled" and status.runnable == ()


def test_chain_inside_group():
    wf = group([chain(job("a.run"), job("b.run")), job("c.run")])
    status = evaluate(wf, {})
    assert [r.path for r in status.runnable] == [(0, 0), (1,)]
    status = evaluate(wf, {(0, 0): done("A"), (1,): done("C")})
    assert [(r.path, r.parent_results) for r in status.runnable] == [((0, 1), {"0": "A"})]
    status = evaluate(wf, {(0, 0): done("A"), (0, 1): done("B"), (1,): done("C")})
    assert status.state == "completed" and status.result == {"0": "B", "1": "C"}  # a chain's result: its last step's


# --------------------------------------------------------------------------- batches (§6, §7.4, §9.4, §12.3)


def bulk_email() -> Batch:
    return batch(
        [job("email.send", f"user{i}@example.com") for i in (1, 2, 3)],
        on_complete=job("batch.report"),
        on_success=job("batch.celebrate"),
        on_failure=job("batch.alert"),
    )


def test_batch_all_succeed_fires_on_complete_and_on_success():
    wf = bulk_email()
    assert [r.path for r in evaluate(wf, {}).runnable] == [(0,), (1,), (2,)]
    results = [{"message_id": f"msg_00{i}", "status": "sent"} for i in (1, 2, 3)]
    outcomes = {(i,): done(results[i]) for i in range(3)}
    status = evaluate(wf, outcomes)
    assert [r.path for r in status.runnable] == [("on_complete",), ("on_success",)]  # scenario A
    assert all(r.parent_results == {str(i): results[i] for i in range(3)} for r in status.runnable)
    assert status.steps[("on_failure",)] == "cancelled"
    assert status.state == "running"  # §8.3: running while callbacks run
    outcomes[("on_complete",)] = done()
    outcomes[("on_success",)] = done()
    assert evaluate(wf, outcomes).state == "completed"


def test_batch_one_failure_fires_on_complete_and_on_failure_with_every_result():
    wf = bulk_email()
    outcomes = {(0,): done({"message_id": "msg_001"}), (1,): done({"message_id": "msg_002"}), (2,): failed("bounced")}
    status = evaluate(wf, outcomes)
    assert [r.path for r in status.runnable] == [("on_complete",), ("on_failure",)]  # scenario B
    expected = {
        "0": {"message_id": "msg_001"},
        "1": {"message_id": "msg_002"},
        "2": {"error": {"code": "handler_error", "message": "bounced"}},
    }
    assert all(r.parent_results == expected for r in status.runnable)  # §7.4: ALL results
    assert status.steps[("on_success",)] == "cancelled"
    outcomes[("on_complete",)] = done()
    outcomes[("on_failure",)] = done()
    status = evaluate(wf, outcomes)
    assert status.state == "completed"  # §12.3 B: the callbacks succeeded
    assert (status.completed_count, status.failed_count) == (2, 1)


def test_batch_fails_when_a_callback_fails():
    wf = batch([job("a.run")], on_complete=job("b.run"))
    assert evaluate(wf, {(0,): done(1), ("on_complete",): failed()}).state == "failed"  # §9.5


def test_batch_callbacks_wait_for_every_job():
    wf = bulk_email()
    status = evaluate(wf, {(0,): done(1), (1,): failed(), (2,): Outcome("active")})
    assert status.runnable == () and status.steps[("on_complete",)] == "waiting"


def test_batch_inside_chain_advances_after_its_callbacks():
    wf = chain(batch([job("a.run"), job("b.run")], on_complete=job("c.run")), job("d.run"))
    outcomes = {(0, 0): done("A"), (0, 1): done("B")}
    (callback,) = evaluate(wf, outcomes).runnable
    assert callback.path == (0, "on_complete") and callback.parent_results == {"0": "A", "1": "B"}
    outcomes[(0, "on_complete")] = done("C")
    (last,) = evaluate(wf, outcomes).runnable
    assert last.path == (1,) and last.parent_results == {"0": {"0": "A", "1": "B"}}


# --------------------------------------------------------------------------- cancel and transitions (§8, §11.3)


def test_cancel_lets_active_jobs_finish_and_cancels_the_rest():
    wf = group([job("a.run"), job("b.run"), job("c.run")])
    status = evaluate(wf, {(0,): Outcome("active"), (1,): Outcome("pending")}, cancelled=True)
    assert status.state == "cancelled" and status.runnable == ()
    assert status.steps == {(0,): "active", (1,): "cancelled", (2,): "cancelled"}


def test_cancelling_a_terminal_workflow_keeps_its_state():
    wf = chain(job("a.run"))
    assert evaluate(wf, {(0,): done(1)}, cancelled=True).state == "completed"


def test_workflow_transitions_are_the_specs():
    assert check_transition("pending", "running") == "running"
    assert check_transition("pending", "cancelled") == "cancelled"
    for target in ("completed", "failed", "cancelled"):
        assert check_transition("running", target) == target
    allowed = {(a, b) for a, targets in WORKFLOW_TRANSITIONS.items() for b in targets}
    assert len(allowed) == 5  # §8.2 lists five
    for current in WORKFLOW_TRANSITIONS:
        for requested in WORKFLOW_TRANSITIONS:
            if (current, requested) not in allowed:
                with pytest.raises(WorkflowStateError) as info:
                    check_transition(current, requested)
                assert (info.value.current, info.value.requested) == (current, requested)


def test_step_transitions():
    assert check_step_transition("waiting", "pending") == "pending"
    assert check_step_transition("active", "pending") == "pending"  # a retry
    for terminal in ("completed", "failed", "cancelled"):
        assert STEP_TRANSITIONS[terminal] == frozenset()
        with pytest.raises(WorkflowStateError):
            check_step_transition(terminal, "active")
    with pytest.raises(WorkflowStateError):
        check_step_transition("waiting", "completed")


def test_outcome_for_an_unknown_path_is_refused():
    wf = chain(job("a.run"))
    with pytest.raises(ValidationError):
        evaluate(wf, {(3,): done()})
    with pytest.raises(ValidationError):
        node_at(wf, (0, 1))
    with pytest.raises(ValidationError):
        node_at(wf, ("on_complete",))


# --------------------------------------------------------------------------- results (§7.5)


def test_result_limit_is_64_kib_and_documented():
    assert MAX_RESULT_BYTES == 65536  # never below the spec's 64 KB floor
    assert check_result("x" * (MAX_RESULT_BYTES - 2)) == MAX_RESULT_BYTES  # the quotes count
    with pytest.raises(ResultTooLargeError) as info:
        check_result("x" * MAX_RESULT_BYTES)
    assert (info.value.size, info.value.limit, info.value.code) == (
        MAX_RESULT_BYTES + 2,
        MAX_RESULT_BYTES,
        "result_too_large",
    )
    assert "result_ref" in str(info.value)
    with pytest.raises(ValidationError):
        check_result({1, 2})  # not JSON


def test_inline_parent_results_keep_the_newest():
    assert MAX_INLINE_RESULTS_BYTES < MAX_ENVELOPE_BYTES
    big = "x" * (MAX_RESULT_BYTES - 2)
    results = {str(i): big for i in range(12)}
    fitted = fit_parent_results(results)
    assert fitted is not None and "11" in fitted and "0" not in fitted
    assert list(fitted) == sorted(fitted, key=int)
    assert len(json.dumps(fitted)) <= MAX_INLINE_RESULTS_BYTES
    small = {"0": 1, "1": 2}
    assert fit_parent_results(small) == small
    assert fit_parent_results({}) == {}
    assert fit_parent_results({"0": "x" * 100}, limit=50) is None


# --------------------------------------------------------------------------- wire form


def test_context_round_trips_through_meta():
    wf = chain(job("a.run"), job("b.run"))
    context = WorkflowContext(
        wf.id, (1, 2, "on_complete"), {"0": 1}, fan_in=FanInRef(wf.id, 2, 3), continuation=workflow_to_dict(wf)
    )
    meta = {"workflow": json.loads(json.dumps(context.to_meta()))}
    assert WorkflowContext.from_meta(meta) == context
    carried = Job.create("b.run", [], meta=meta)  # the envelope carries it as any meta
    assert WorkflowContext.from_meta(Job.from_json(carried.to_json()).meta) == context
    assert WorkflowContext.from_meta({}) is None and WorkflowContext.from_meta(None) is None


@pytest.mark.parametrize(
    "data, field",
    [
        ("x", "meta.workflow"),
        ({"path": []}, "meta.workflow.id"),
        ({"id": "w", "path": [-1]}, "meta.workflow.path"),
        ({"id": "w", "path": [True]}, "meta.workflow.path"),
        ({"id": "w", "path": [], "parent_results": []}, "meta.workflow.parent_results"),
        ({"id": "w", "path": [], "fan_in": {"id": "g", "index": 3, "count": 3}}, "meta.workflow.fan_in.index"),
        ({"id": "w", "path": [], "fan_in": {"id": "g", "index": 0}}, "meta.workflow.fan_in.count"),
    ],
)
def test_bad_context_names_the_field(data, field):
    with pytest.raises(ValidationError) as info:
        WorkflowContext.from_meta({"workflow": data})
    assert info.value.field == field


def test_fan_in_entity_names():
    from ojs_kombu import Names

    wf = "019539a4-0001-7000-8000-000000000001"
    assert Names().fan_in_stream(wf) == f"ojs.workflow.{wf}"  # outside ojs.queue.: no job queue collides
    assert Names("tenant1").fan_in_stream(wf) == f"tenant1.ojs.workflow.{wf}"
    assert Names("tenant1").lock_queue(Names.fan_in_lock_key(wf)) == f"tenant1.ojs.lock.fanin.{wf}"
