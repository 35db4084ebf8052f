"""The workflow graph of the dashboard (pure: no broker, no browser): its layout, states, links and escaping."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ojs_kombu import Job, batch, chain, group
from ojs_kombu.dashboard.wfgraph import graph, step_states
from ojs_kombu.dashboard.workflows import workflow_ids
from ojs_kombu.model.workflow import workflow_to_dict
from ojs_kombu.model.workflow_info import workflow_info

SVG = "{http://www.w3.org/2000/svg}"


def test_a_chain_is_a_row_a_group_a_column_and_a_batch_its_members_then_its_callbacks():
    first = Job.create("fetch.page", [], queue="wf")
    w = chain(
        first,
        group([Job.create("resize", [i], queue="img") for i in range(2)], name="thumbs <&>"),
        batch([Job.create("member", [i], queue="wf") for i in range(15)],
              on_complete=Job.create("report", [], queue="cb"), on_failure=Job.create("alert", [], queue="cb")),
    )  # fmt: skip
    records = [
        {"kind": "definition", "workflow": workflow_to_dict(w), "at": "2026-01-01T00:00:00.000Z"},
        {"kind": "step", "path": [0], "state": "completed", "result": 1, "attempt": 1},
        {"kind": "step", "path": [1, 0], "state": "failed", "error": {"code": "handler_error", "message": "x"}},
    ]
    info = workflow_info(records)
    running = {info.step(1, 1).job_id}
    states = step_states(info, running)
    svg = str(graph(info, states, link=lambda step, job: f"/jobs?id={step.job_id}&queue={job.queue}"))

    root = ET.fromstring(svg)  # well-formed: the name's "<&>" and the links' "&" are escaped
    links = {a.get("data-path"): a for a in root.iter(f"{SVG}a")}
    assert len(links) == 1 + 2 + 15 + 2  # every job and callback, once
    assert links["0"].get("href") == f"/jobs?id={first.id}&queue=wf"
    assert {p: links[p].get("data-state") for p in ("0", "1.0", "1.1", "2.0", "2.on_complete")} == {
        "0": "completed", "1.0": "failed", "1.1": "active", "2.0": "waiting", "2.on_complete": "waiting",
    }  # fmt: skip
    assert "fetch.page (wf): completed" in links["0"].get("aria-label")  # the state is written out, not only a colour

    def box(path: str) -> tuple[float, float]:
        rect = links[path].find(f"{SVG}rect")
        return float(rect.get("x")), float(rect.get("y"))

    assert box("0")[0] < box("1.0")[0] == box("1.1")[0] < box("2.0")[0] < box("2.on_complete")[0]  # a row
    assert box("1.0")[1] < box("1.1")[1]  # a column
    assert box("2.on_complete")[0] == box("2.on_failure")[0] and box("2.on_complete")[1] < box("2.on_failure")[1]
    assert links["2.14"].find(f"{SVG}rect").get("class") == "cell st-waiting"  # 15 members: a grid of cells
    labels = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "frame-label"]
    assert labels == ["group thumbs <&>", "batch"]


def test_workflow_ids_are_the_record_streams_newest_first():
    head = "p.ojs.workflow."
    old, new = "01900000-0000-7000-8000-000000000000", "01950000-0000-7000-8000-000000000000"
    queues = [{"name": f"{head}{old}.log"}, {"name": f"{head}{new}.log"}, {"name": f"{head}{new}"},
              {"name": f"{head}not-a-uuid.log"}, {"name": f"q.ojs.workflow.{old}.log"}]  # fmt: skip
    assert workflow_ids(queues, head) == [new, old]
