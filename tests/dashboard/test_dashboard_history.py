"""The dashboard's history (issue 32 items 2 and 3) in headless Chromium over a real broker and a Worker
with events on: the charts count what ran, a restarted dashboard still does (the events stream keeps
the history), and a job's page tells its story in order, through retries, its dead letter and a replay."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from dashboard_pages import docs_shot, visit
from selenium.webdriver.common.by import By
from support import wait_until
from test_dashboard import shown
from test_dashboard_live import dead_count

from ojs_kombu import Worker, current_job

pytestmark = pytest.mark.timeout(120)

QUICK_RETRY = {"max_attempts": 2, "initial_interval": "PT0.2S"}


@pytest.fixture
def worker(amqp_url, prefix):
    """A Worker on ``dash`` publishing its job events: ``ok`` returns, ``flaky`` raises until ``healed`` is set."""
    w = Worker(amqp_url, queues=("dash",), prefix=prefix, grace_period=2, concurrency=2, events=True)
    w.healed = threading.Event()

    def flaky(*args):
        if not w.healed.is_set():
            raise RuntimeError("flaky-failure")

    def block():
        job = current_job()
        while not job.cancelled.is_set():
            time.sleep(0.05)

    w.handler("ok", lambda *args: None)
    w.handler("flaky", flaky)
    w.handler("block", block)
    w.start()
    assert w.wait_until_ready()
    yield w
    w.stop()


def totals(browser) -> dict[str, str]:
    """The chart's totals as its data attributes say, read in one script call (a live update may replace it)."""
    found: dict[str, str] | None = browser.execute_script(
        "const c = document.getElementById('chart'); if (!c) return null; const o = {};"
        "for (const a of c.getAttributeNames()) if (a.startsWith('data-total-')) o[a.slice(11)] = c.getAttribute(a);"
        "return o;"
    )
    return found or {}


N, K = 5, 2
EXPECTED = {"succeeded": str(N), "failed": str(2 * K), "retried": str(K), "deadlettered": str(K)}


def test_the_chart_counts_what_ran_and_a_restarted_dashboard_still_does(browser, serve, worker, client, names):
    served = serve(refresh=1)
    browser.get(served.base + "/")
    browser.find_element(By.CSS_SELECTOR, "#chart details summary").click()  # the numbers, kept open by updates
    for i in range(N):
        client.enqueue("ok", [i], queue="dash")
    for i in range(K):
        client.enqueue("flaky", [i], queue="dash", retry=QUICK_RETRY)
    wait_until(lambda: dead_count(client, names) == K, timeout=30, message="the flaky jobs dead-lettered")
    # the open page updates itself: no navigation
    wait_until(lambda: totals(browser) == EXPECTED, timeout=30, message=f"the chart shows {EXPECTED}")
    assert browser.execute_script("return [document.querySelector('#chart details').open, document.activeElement.tagName]") == [True, "SUMMARY"]  # fmt: skip
    bars = browser.find_elements(By.CSS_SELECTOR, "#chart svg g.bar")
    assert len(bars) == 60  # one per minute of the last hour
    failed = sum(int(b.get_attribute("data-failed")) for b in bars)
    assert failed == 2 * K
    table = {c.get_attribute("data-event"): c.get_attribute("textContent") for c in
             browser.find_elements(By.CSS_SELECTOR, "#chart table.chart-data tr.totals td[data-event]")}  # fmt: skip
    assert table == {"succeeded": str(N), "retried": str(K), "failed": str(2 * K), "dead-lettered": str(K)}
    runs = browser.execute_script("return document.querySelector('#timings tr[data-queue=dash] .runs').textContent")
    assert runs == str(N + 2 * K)  # every attempt timed, from its started to its end
    docs_shot(browser, "overview")
    browser.execute_cdp_cmd(
        "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
    )
    try:
        docs_shot(browser, "overview-dark")
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})

    served.stop()
    again = serve(refresh=1)  # a new dashboard: nothing in memory, the history read back from the stream
    browser.get(again.base + "/")
    wait_until(lambda: totals(browser) == EXPECTED, timeout=30, message="the restarted dashboard's chart")
    browser.get(again.base + "/?span=week")
    wait_until(lambda: totals(browser) == EXPECTED, timeout=30, message="the per hour chart")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart svg g.bar")) == 168
    browser.get(again.base + "/queues/dash")
    wait_until(lambda: totals(browser) == EXPECTED, timeout=30, message="the queue's chart")
    docs_shot(browser, "queue")
    browser.get(again.base + "/workers")
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#workers tr[data-worker]"), message="the worker listed")
    assert browser.find_element(By.CSS_SELECTOR, "#workers td.busy").text == "0 of 2"  # its handler threads in use
    docs_shot(browser, "workers")


def kinds(browser) -> list[tuple[str, str | None]]:
    got = browser.execute_script(
        "return Array.from(document.querySelectorAll('#timeline li'))"
        ".map(li => [li.dataset.kind, li.dataset.attempt || null]);"
    )
    return [tuple(k) for k in got or []]


def test_a_job_page_tells_its_story_in_order(browser, serve, worker, client, names, tmp_path):
    job = client.enqueue("flaky", [1], queue="dash", retry=QUICK_RETRY)
    wait_until(lambda: dead_count(client, names) == 1, timeout=30, message="the job dead-lettered")
    served = serve(refresh=1)
    first = [("enqueued", None), ("started", "1"), ("failed", "1"), ("retried", "1"), ("started", "2"),
             ("failed", "2"), ("dead-lettered", "2")]  # fmt: skip
    browser.get(f"{served.base}/jobs?id={job.id}")  # no queue given: found by the search
    wait_until(lambda: kinds(browser) == first, timeout=30, message=f"the timeline {first}")
    text = visit(browser, served, f"/jobs?id={job.id}", tmp_path, "story-dead")
    assert "flaky-failure" in text and browser.find_element(By.ID, "dead-letter")
    assert (
        "after the retry was scheduled"
        in browser.find_element(By.CSS_SELECTOR, '#timeline li[data-kind=started][data-attempt="2"]').text
    )
    trace = browser.find_element(By.CSS_SELECTOR, '#timeline li[data-kind=failed][data-attempt="2"] pre.backtrace')
    assert "flaky-failure" in trace.get_attribute("textContent")  # the final failure's backtrace, from the dead letter
    docs_shot(browser, "job")

    worker.healed.set()
    assert [e.letter_id for e in client.dead_letters("dash")] == [job.id]
    client.replay_dead_letters("dash")
    then = first + [("replayed", None), ("started", "1"), ("succeeded", "1")]
    wait_until(lambda: kinds(browser) == then, timeout=30, message=f"the timeline {then}")  # the page updated itself


def test_a_framework_id_finds_its_job(browser, serve, worker, client, names, tmp_path):
    job = client.enqueue(
        "flaky", [1], queue="dash", retry={"max_attempts": 1}, meta={"dramatiq": {"message_id": "DRAMA-1"}}
    )
    wait_until(lambda: dead_count(client, names) == 1, timeout=30, message="the job dead-lettered")
    served = serve(refresh=1)
    browser.get(f"{served.base}/jobs?id=drama-1")
    wait_until(
        lambda: ("dead-lettered", "1") in kinds(browser), timeout=30, message="the story found by the Dramatiq id"
    )
    assert job.id in browser.find_element(By.ID, "resolved").text
    browser.get(f"{served.base}/queues/dash/dead")
    assert browser.find_elements(By.CSS_SELECTOR, f'#letters tr[data-id="{job.id}"]')
    docs_shot(browser, "dead-letters")


def test_the_overview_says_when_scheduled_jobs_come_due(browser, serve, client):
    client.enqueue("later", [], queue="dash", scheduled_at=datetime.now(UTC) + timedelta(minutes=30))
    served = serve(refresh=1)
    browser.get(served.base + "/")
    due = shown(browser, "#coming-due", "within 1 h: 1")
    assert "within 1 min: 0" in due.text and "after 1 day: 0" in due.text
    assert browser.find_element(By.ID, "scheduled").text == "1"


def test_a_cancelled_job_s_story_and_the_dark_scheme(browser, serve, worker, client):
    job = client.enqueue("block", [], queue="dash")
    served = serve(refresh=1)
    browser.get(f"{served.base}/jobs?id={job.id}&queue=dash")
    wait_until(lambda: ("started", "1") in kinds(browser), timeout=30, message="the job started")
    client.cancel(job.id, queue="dash")
    wait_until(lambda: kinds(browser)[-2:] == [("started", "1"), ("cancelled", "1")], timeout=30,
               message="the story ends cancelled")  # fmt: skip
    light = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
    browser.execute_cdp_cmd(
        "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
    )
    try:
        browser.get(served.base + "/")
        assert browser.execute_script("return getComputedStyle(document.body).backgroundColor") == "rgb(20, 23, 28)"
        assert light == "rgb(255, 255, 255)"
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
