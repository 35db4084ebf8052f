"""The Workflows pages of the dashboard (issue 32 item 4) in headless Chromium over a real broker and a Worker:
the list of recent workflows, each workflow's graph with its steps' states updating without a reload, every
step a link reached with the keyboard, and cancelling a workflow from its page."""

from __future__ import annotations

import threading

import pytest
from dashboard_pages import docs_shot, visit
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from support import wait_until
from test_dashboard import shown
from test_dashboard_live import ISO_AGE, PYTHON_VALUES, read

from ojs_kombu import Job, RetryPolicy, Worker, batch, chain, current_job, group

pytestmark = pytest.mark.timeout(120)


def states(browser, workflow_id: str) -> dict[str, str]:
    """The graph's steps and their states (read in one script call: a live update may replace the graph)."""
    return browser.execute_script(
        "if (!location.pathname.endsWith(arguments[0])) return {};"
        "const s = {}; document.querySelectorAll('.wfgraph a[data-path]').forEach("
        "a => { s[a.dataset.path] = a.dataset.state; }); return s;",
        workflow_id,
    )


def test_the_workflow_graph_shows_each_steps_state_and_updates_itself(
    browser, serve, client, amqp_url, prefix, tmp_path
):
    gate = threading.Event()
    worker = Worker(amqp_url, queues=("wfdash",), prefix=prefix, grace_period=2, concurrency=4, presence_interval=1)
    worker.handler("fetch.page", lambda: gate.wait(30) and "page")
    worker.handler("resize", lambda n: n * 10)

    def member(n: int) -> int:
        if n == 2:
            raise ValueError("member 2 fails")
        return n

    worker.handler("member", member)
    worker.handler("report", lambda: "reported")
    held_stopped = threading.Event()

    def hold() -> None:
        try:
            while not current_job().cancelled.wait(0.05):
                pass
        finally:
            held_stopped.set()

    worker.handler("hold", hold)
    worker.start()
    try:
        assert worker.wait_until_ready()
        job = lambda kind, *args, **kw: Job.create(kind, list(args), queue="wfdash", **kw)  # noqa: E731
        nightly = chain(
            job("fetch.page"),
            group([job("resize", i) for i in range(3)], name="thumbnails"),
            batch([job("member", i, retry=RetryPolicy(max_attempts=1)) for i in range(4)],
                  on_complete=job("report"), on_success=job("report")),
            name="nightly",
        )  # fmt: skip
        wide = batch([job("resize", i) for i in range(30)], on_complete=job("report"), name="wide")
        client.enqueue_workflow(nightly)
        served = serve(refresh=0.5)

        # the list: both, newest first, with their state
        text = visit(browser, served, "/workflows", tmp_path, "workflows")
        assert "Workflows" in browser.find_element(By.TAG_NAME, "nav").text
        client.enqueue_workflow(wide)
        wait_until(lambda: listed(browser) == [wide.id, nightly.id],
                   timeout=15, message="the new workflow listed without a reload")  # fmt: skip
        wait_until(lambda: row_state(browser, wide.id) == "completed", timeout=20, message="wide completed")
        assert row_state(browser, nightly.id) in ("pending", "running")  # its first step waits for the gate
        assert not PYTHON_VALUES.search(text)
        docs_shot(browser, "workflows")

        # the chain's graph: a row, its first step under way, the rest waiting
        # (elements are read and clicked in one script call: a live update may replace them in between)
        browser.execute_script("document.querySelector(`#workflows tr[data-workflow='${arguments[0]}'] a`).click()",
                               nightly.id)  # fmt: skip
        wait_until(lambda: states(browser, nightly.id).get("0") in ("pending", "active"), timeout=10,
                   message="the chain's page")  # fmt: skip
        seen = states(browser, nightly.id)
        assert len(seen) == 1 + 3 + 4 + 2 and {seen[p] for p in seen if p != "0"} == {"waiting"}
        browser.execute_script("window.notReloaded = true")
        updates = int(browser.execute_script("return document.body.dataset.updates || '0'"))
        wait_until(lambda: states(browser, nightly.id).get("0") == "active", timeout=15,
                   message="the first step shown running (the worker's presence)")  # fmt: skip

        gate.set()  # the chain runs to its end; the open page follows
        final = {"0": "completed", **{f"1.{i}": "completed" for i in range(3)},
                 **{f"2.{i}": "failed" if i == 2 else "completed" for i in range(4)},
                 "2.on_complete": "completed", "2.on_success": "cancelled"}  # fmt: skip
        wait_until(lambda: states(browser, nightly.id) == final, timeout=20, message="the graph's final states")
        assert browser.execute_script("return window.notReloaded === true")
        assert int(browser.execute_script("return document.body.dataset.updates")) > updates
        assert read(browser, "#state") == "completed"  # a batch fails only when a callback fails
        assert "member 2 fails" in read(browser, '#steps tr[data-path="2.2"][data-state="failed"]')
        assert ISO_AGE.search(read(browser, "#summary"))  # when it was enqueued
        label = browser.execute_script(
            "return document.querySelector('.wfgraph a[data-path=\"0\"]').getAttribute('aria-label')"
        )
        assert "fetch.page (wfdash): completed" in label
        assert served.password not in browser.page_source
        docs_shot(browser, "workflow")

        # keyboard: Tab reaches the graph's steps in order, Enter opens the step's story
        browser.find_element(By.TAG_NAME, "body").click()
        reached = []
        for _ in range(40):
            ActionChains(browser).send_keys(Keys.TAB).perform()
            path = browser.execute_script("const a = document.activeElement; return a && a.dataset && a.dataset.path")
            if path:
                reached.append(path)
            if len(reached) == 2:
                break
        assert reached == ["0", "1.0"]
        ActionChains(browser).send_keys(Keys.ENTER).perform()
        wait_until(lambda: "/jobs?id=" in browser.current_url, timeout=10, message="the step's story opened")
        assert nightly.steps[1].jobs[0].id in browser.current_url and "queue=wfdash" in browser.current_url

        # a big batch is a grid of cells, every one completed
        browser.get(f"{served.base}/workflows/{wide.id}")
        cells = browser.find_elements(By.CSS_SELECTOR, ".wfgraph rect.cell")
        assert len(cells) == 30
        assert set(states(browser, wide.id).values()) == {"completed"}
        assert not browser.find_elements(By.ID, "cancel-workflow")  # it ended: nothing to cancel

        # cancel a running workflow from its page, after a confirmation
        held = chain(job("hold"), job("report"), name="held")
        client.enqueue_workflow(held)
        browser.get(f"{served.base}/workflows/{held.id}")
        wait_until(lambda: states(browser, held.id).get("0") in ("pending", "active"), timeout=10,
                   message="the held chain's page")  # fmt: skip
        browser.execute_script("document.getElementById('cancel-workflow').click()")
        shown(browser, "h1", f"Confirm: cancel workflow {held.id}")
        browser.find_element(By.ID, "confirm").click()
        shown(browser, "#cancelled", "Workflow cancelled.")
        assert read(browser, "#state") == "cancelled"
        assert states(browser, held.id) == {"0": "cancelled", "1": "cancelled"}
        assert held_stopped.wait(10)  # the running step got the normal cancel
        assert client.workflow(held.id).state == "cancelled"
    finally:
        gate.set()
        worker.stop()


def listed(browser) -> list[str]:
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('#workflows tr[data-workflow]'), r => r.dataset.workflow)"
    )


def row_state(browser, workflow_id: str) -> str | None:
    return browser.execute_script(
        "const r = document.querySelector(`#workflows tr[data-workflow='${arguments[0]}']`);"
        "return r && r.dataset.state",
        workflow_id,
    )
