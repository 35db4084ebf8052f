"""The continuation planner without a broker: workflows run to their end through an in-memory fan-in.

The simulator performs the planner's actions as the worker will: every ``meta.workflow`` goes
through JSON, a fan-in counts distinct indexes and answers Ready once, jobs run in a random order.
Each run is checked against the spec's examples and against :func:`evaluate`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from ojs_kombu import Job
from ojs_kombu.errors import ValidationError
from ojs_kombu.model.workflow import (
    FanInRef,
    Outcome,
    Path,
    Workflow,
    WorkflowContext,
    batch,
    chain,
    evaluate,
    group,
    workflow_to_dict,
)
from ojs_kombu.policy.workflow import Enqueue, Finished, OpenFanIn, Report, after_fan_in
from ojs_kombu.policy.workflow import advance_workflow as advance
from ojs_kombu.policy.workflow import start_workflow as start

Handler = Callable[[Job, dict[str, Any]], tuple[str, Any]]


@dataclass
class _FanIn:
    count: int
    continuation: dict[str, Any]
    records: dict[int, tuple[str, Any, Any]] = field(default_factory=dict)
    won: bool = False


@dataclass
class Run:
    finished: list[Finished] = field(default_factory=list)
    seen: dict[Path, dict[str, Any]] = field(default_factory=dict)  # parent_results each job ran with
    runs: list[Path] = field(default_factory=list)
    outcomes: dict[Path, Outcome] = field(default_factory=dict)
    opened: list[str] = field(default_factory=list)


def simulate(wf: Workflow, handler: Handler, *, seed: int = 0, duplicates: frozenset[Path] = frozenset()) -> Run:
    rng = random.Random(seed)
    run = Run()
    fans: dict[str, _FanIn] = {}
    pending: list[tuple[Path, Job, WorkflowContext]] = []

    def perform(actions: list) -> None:
        for action in actions:
            if isinstance(action, OpenFanIn):
                assert action.id not in fans, "a fan-in is opened once"
                fans[action.id] = _FanIn(action.count, action.continuation)
                run.opened.append(action.id)
            elif isinstance(action, Enqueue):
                assert action.path not in run.outcomes, f"{action.path} enqueued twice"
                if action.context.fan_in is not None:
                    assert action.context.fan_in.id in fans, "the fan-in exists before its jobs"
                wire = WorkflowContext.from_meta({"workflow": json.loads(json.dumps(action.context.to_meta()))})
                assert wire is not None
                run.outcomes[action.path] = Outcome("pending")
                pending.append((action.path, action.job, wire))
            elif isinstance(action, Report):
                fan = fans[action.fan_in.id]
                fan.records.setdefault(action.fan_in.index, (action.state, action.result, action.error))
                if len(fan.records) == fan.count and not fan.won:
                    fan.won = True
                    states = {i: record[0] for i, record in fan.records.items()}
                    results = {
                        str(i): ({"error": dict(r[2] or {})} if r[0] == "failed" else r[1])
                        for i, r in fan.records.items()
                    }
                    perform(after_fan_in(action, fan.continuation, states, results))
            elif isinstance(action, Finished):
                run.finished.append(action)

    perform(start(wf))
    while pending:
        path, job, context = pending.pop(rng.randrange(len(pending)))
        assert context.path == path
        run.seen[path] = context.parent_results
        run.runs.append(path)
        state, value = handler(job, context.parent_results)
        error = {"code": "handler_error", "message": str(value)} if state == "failed" else None
        result = value if state == "completed" else None
        run.outcomes[path] = Outcome(state, result, error)  # type: ignore[arg-type]
        times = 2 if path in duplicates else 1  # a redelivery after a lost ack reports again
        for _ in range(times):
            perform(advance(context, state, result, error))  # type: ignore[arg-type]
    return run


def job(kind: str, *args: Any) -> Job:
    return Job.create(kind, list(args))


def by_type(results: dict[str, Any], failing: frozenset[str] = frozenset()) -> Handler:
    def handle(j: Job, parent_results: dict[str, Any]) -> tuple[str, Any]:
        if j.type in failing:
            return "failed", f"{j.type} failed"
        return "completed", results.get(j.type, j.type)

    return handle


def test_spec_chain_order_processing():
    wf = chain(
        job("order.validate", {"order_id": "ord_123"}),
        job("payment.charge"),
        job("inventory.reserve"),
        job("notification.send"),
    )
    order = {"order_id": "ord_123", "total": 99.99, "currency": "USD", "items": 3}
    charge = {"charge_id": "ch_abc123", "amount": 99.99}
    reservation = {"reservation_id": "res_xyz", "items_reserved": 3}
    note = {"notification_id": "notif_001", "channel": "email"}
    handler = by_type(
        {"order.validate": order, "payment.charge": charge, "inventory.reserve": reservation, "notification.send": note}
    )
    run = simulate(wf, handler)
    assert run.runs == [(0,), (1,), (2,), (3,)]  # one at a time, in order
    assert run.seen == {  # §12.1's trace
        (0,): {},
        (1,): {"0": order},
        (2,): {"0": order, "1": charge},
        (3,): {"0": order, "1": charge, "2": reservation},
    }
    assert run.finished == [Finished(wf.id, "completed", note)]


def test_spec_etl_with_fan_out():
    wf = chain(
        job("data.extract"),
        group([job("transform.csv"), job("transform.pdf"), job("transform.xlsx")]),
        job("data.load"),
    )
    results = {
        "data.extract": {"report_id": "rpt_456"},
        **{f"transform.{x}": {"path": f"/exports/rpt_456.{x}"} for x in ("csv", "pdf", "xlsx")},
    }
    for seed in range(5):
        run = simulate(wf, by_type(results), seed=seed)
        assert all(run.seen[(1, i)] == {"0": {"report_id": "rpt_456"}} for i in range(3))
        assert run.seen[(2,)] == {
            "0": {"report_id": "rpt_456"},
            "1": {
                "0": {"path": "/exports/rpt_456.csv"},
                "1": {"path": "/exports/rpt_456.pdf"},
                "2": {"path": "/exports/rpt_456.xlsx"},
            },
        }
        assert run.runs[-1] == (2,) and run.finished[0].state == "completed"
        assert run.opened == [wf.steps[1].id]  # opened when the group's turn came


def bulk(on_success: bool = True) -> Workflow:
    return batch(
        [job("email.send", f"user{i}@example.com") for i in (1, 2, 3)],
        on_complete=job("batch.report"),
        on_success=job("batch.celebrate") if on_success else None,
        on_failure=job("batch.alert"),
    )


def test_spec_batch_scenarios():
    wf = bulk()
    a = simulate(wf, by_type({}), seed=3)
    assert sorted(p for p in a.runs if isinstance(p[-1], str)) == [("on_complete",), ("on_success",)]
    assert a.finished == [Finished(wf.id, "completed", {"0": "email.send", "1": "email.send", "2": "email.send"})]

    def user3_bounces(j: Job, _: dict[str, Any]) -> tuple[str, Any]:
        return ("failed", "bounced") if j.args == ["user3@example.com"] else ("completed", "sent")

    b = simulate(wf, user3_bounces, seed=4)
    callbacks = sorted(p for p in b.runs if isinstance(p[-1], str))
    assert callbacks == [("on_complete",), ("on_failure",)]  # scenario B
    everything = {"0": "sent", "1": "sent", "2": {"error": {"code": "handler_error", "message": "bounced"}}}
    assert b.seen[("on_failure",)] == b.seen[("on_complete",)] == everything  # §7.4: all results
    assert b.finished[0].state == "completed"  # the callbacks succeeded (§12.3 B)
    assert evaluate(wf, b.outcomes).state == "completed"


def test_batch_fails_when_its_callback_fails():
    wf = bulk()
    run = simulate(wf, by_type({}, failing=frozenset({"batch.celebrate"})))
    assert run.finished[0].state == "failed"
    assert evaluate(wf, run.outcomes).state == "failed"


def test_batch_with_nothing_to_fire_ends_completed():
    wf = batch([job("a.run"), job("b.run")], on_success=job("c.run"))
    run = simulate(wf, by_type({}, failing=frozenset({"a.run"})))
    assert ("on_success",) not in run.runs and run.finished[0].state == "completed"
    assert evaluate(wf, run.outcomes).state == "completed"


def test_failed_step_stops_the_chain():
    wf = chain(job("a.run"), group([job("b.run"), job("c.run")]), job("d.run"))
    run = simulate(wf, by_type({}, failing=frozenset({"b.run"})))
    assert (2,) not in run.runs  # §9.2
    assert (1, 1) in run.runs  # §9.3: the other job of the group ran
    assert run.finished[0].state == "failed"
    assert evaluate(wf, run.outcomes).state == "failed"


def test_three_levels_in_random_orders_each_job_once():
    wf = chain(
        job("s.first"),
        group([chain(job("g.a"), job("g.b")), batch([job("b.x"), job("b.y")], on_complete=job("b.done")), job("g.c")]),
        job("s.last"),
    )
    for seed in range(8):
        run = simulate(wf, by_type({}), seed=seed, duplicates=frozenset({(1, 1, 0), (1, 2)}))
        assert len(run.runs) == len(set(run.runs)) == 8
        assert run.seen[(1, 0, 1)] == {"0": "g.a"}  # the nested chain's own scope
        assert run.seen[(1, 0, 0)] == {"0": "s.first"}  # its step 0 inherits the group's
        assert run.seen[(1, 1, "on_complete")] == {"0": "b.x", "1": "b.y"}
        assert run.seen[(2,)] == {"0": "s.first", "1": {"0": "g.b", "1": {"0": "b.x", "1": "b.y"}, "2": "g.c"}}
        assert run.runs[-1] == (2,)
        assert run.finished == [Finished(wf.id, "completed", "s.last")]
        assert evaluate(wf, run.outcomes).state == "completed"


def test_advance_refuses_what_is_not_an_end():
    wf = chain(job("a.run"))
    (enqueue,) = start(wf)
    assert isinstance(enqueue, Enqueue)
    with pytest.raises(ValidationError):
        advance(enqueue.context, "active")
    with pytest.raises(ValidationError):
        advance(WorkflowContext(wf.id, (0,)), "completed")  # no continuation
    with pytest.raises(ValidationError):
        after_fan_in(
            Report(FanInRef(wf.id, 0, 1), (), "completed"), workflow_to_dict(wf), {}, {}
        )  # the root is no member
