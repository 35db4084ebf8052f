"""The dashboard as people read it and leave it open (issue 29 item 6), in headless Chromium over a real broker:
values and times as a user reads them, live updates (and the manual refresh without scripts), cancel only
where it acts, the errors from before a replay said so."""

from __future__ import annotations

import re
import threading
import time
import uuid

import pytest
import requests
from dashboard_pages import visit
from selenium.webdriver.common.by import By
from support import wait_until
from test_dashboard import consumers, shown

from ojs_kombu import Worker, current_job

pytestmark = pytest.mark.timeout(90)

PYTHON_VALUES = re.compile(r"\b(None|True|False)\b|\+00:00|\d \d\d:\d\d:\d\d")
AGE = r"(just now|\d+ (s|min|h|d) ago)"
ISO_AGE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z " + AGE)


@pytest.fixture
def worker(amqp_url, prefix):
    """A running Worker on queue ``dash``: ``ok`` returns, ``fail`` always raises, ``block`` runs until cancelled."""
    w = Worker(amqp_url, queues=("dash",), prefix=prefix, grace_period=2, concurrency=2)
    w.blocking = threading.Event()

    def fail(*args):
        raise RuntimeError("always-fails")

    def block():
        job = current_job()
        w.blocking.set()
        while not job.cancelled.is_set():
            time.sleep(0.05)

    w.handler("ok", lambda *args: None)
    w.handler("fail", fail)
    w.handler("block", block)
    w.start()
    assert w.wait_until_ready()
    yield w
    w.stop()


def read(browser, css: str) -> str | None:
    """The text of ``css`` read in one script call: a live update may replace the element between a
    ``find_element`` and its ``.text``."""
    return browser.execute_script("const e = document.querySelector(arguments[0]); return e && e.innerText", css)


def dead_count(client, names, queue: str = "dash") -> int:
    counts = client.queue_counts([names.dead_letter_queue(queue)])[names.dead_letter_queue(queue)]
    return counts.ready if counts is not None else 0


def state_of(client, job_id: str, state: str) -> bool:
    info = client.info(job_id, queue="dash", timeout=1)
    return info is not None and info.state == state


def test_pages_show_no_python_values_and_times_as_the_cli_prints_them(browser, serve, worker, client, names, tmp_path):
    done = client.enqueue("ok", [1], queue="dash")
    client.enqueue("fail", [2], queue="dash", retry={"max_attempts": 1})
    running = client.enqueue("block", [], queue="dash")
    assert worker.blocking.wait(10)
    wait_until(lambda: state_of(client, done.id, "completed"), message="the ok job completed")
    wait_until(lambda: dead_count(client, names) == 1, message="the failed job dead-lettered")
    served = serve()
    pages = ("/", "/queues/dash", "/queues/dash/dead", "/workers", f"/jobs?id={done.id}&queue=dash",
             f"/jobs?id={running.id}&queue=dash", f"/jobs?id={uuid.uuid4()}&queue=dash")  # fmt: skip
    for path in pages:
        text = visit(browser, served, path, tmp_path, "read-" + re.sub(r"\W+", "-", path).strip("-")[:40])
        assert not PYTHON_VALUES.search(text), (path, PYTHON_VALUES.search(text))

    visit(browser, served, "/", tmp_path, "read-overview")
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="dash"] .paused').text == "running"
    visit(browser, served, "/workers", tmp_path, "read-workers")
    since = browser.find_element(By.CSS_SELECTOR, "#workers td.since").text
    assert ISO_AGE.fullmatch(since), since
    visit(browser, served, f"/jobs?id={done.id}&queue=dash", tmp_path, "read-job-completed")
    assert ISO_AGE.fullmatch(browser.find_element(By.CSS_SELECTOR, '#info tr[data-field="started_at"] td').text)
    assert ISO_AGE.fullmatch(browser.find_element(By.CSS_SELECTOR, '#info tr[data-field="finished_at"] td').text)
    assert browser.find_element(By.CSS_SELECTOR, '#info tr[data-field="error"] td').text == "–"
    visit(browser, served, "/queues/dash/dead", tmp_path, "read-dead")
    assert ISO_AGE.fullmatch(browser.find_element(By.CSS_SELECTOR, "#letters td.dead-at").text)
    client.cancel(running.id, queue="dash")  # its handler returns: the worker stops at once
    wait_until(lambda: state_of(client, running.id, "cancelled"), message="the blocking job cancelled")


def test_cancel_is_offered_only_where_it_can_act(browser, serve, worker, client, tmp_path):
    done = client.enqueue("ok", [], queue="dash")
    retrying = client.enqueue("fail", [], queue="dash", retry={"max_attempts": 3, "initial_interval": "PT60S"})
    waiting = client.enqueue("ok", [], queue="nobody.consumes")
    running = client.enqueue("block", [], queue="dash")
    assert worker.blocking.wait(10)
    wait_until(lambda: state_of(client, done.id, "completed"), message="the ok job completed")
    wait_until(lambda: state_of(client, retrying.id, "retryable"), message="the failing job waiting for a retry")
    served = serve()

    def offered(job_id: str, queue: str = "dash") -> bool:
        visit(browser, served, f"/jobs?id={job_id}&queue={queue}", tmp_path, f"cancel-{job_id[-6:]}")
        return bool(browser.find_elements(By.ID, "cancel"))

    assert offered(running.id) and offered(retrying.id)
    assert offered(waiting.id, "nobody.consumes")  # no worker knows it: it waits, a cancel drops it
    assert "may be waiting in its queue" in browser.find_element(By.ID, "unknown").text
    assert not offered(done.id)
    assert browser.find_element(By.ID, "not-cancellable").text == "Nothing to cancel: the job is completed."
    client.cancel(running.id, queue="dash")
    wait_until(lambda: state_of(client, running.id, "cancelled"), message="the running job cancelled")
    assert not offered(running.id)
    assert browser.find_element(By.ID, "not-cancellable").text == "Nothing to cancel: the job is cancelled."


def test_a_job_and_its_dead_letter_say_which_errors_came_before_a_replay(
    browser, serve, worker, client, names, amqp_url, tmp_path
):
    retry = {"max_attempts": 2, "initial_interval": "PT0.1S", "jitter": False}
    job = client.enqueue("fail", [], queue="dash", retry=retry)
    wait_until(lambda: dead_count(client, names) == 1, message="the job dead-lettered")
    served = serve()
    visit(browser, served, "/queues/dash/dead", tmp_path, "replay-before")
    assert browser.find_elements(By.CSS_SELECTOR, "#letters .replayed") == []  # never replayed: nothing to say
    assert len(browser.find_elements(By.CSS_SELECTOR, "#letters ul.history li")) == 1

    client.pause("dash")  # the replayed job waits: the job page shows the outcome from before the replay
    wait_until(lambda: consumers(amqp_url, names.job_queue("dash")) == 0, message="the queue paused")
    browser.find_element(By.ID, "replay").click()
    shown(browser, "h1", "Confirm: replay")
    assert browser.find_elements(By.ID, "live") == []  # the answer to a POST cannot be fetched again: not live
    browser.find_element(By.ID, "confirm").click()
    shown(browser, "#done", "replay:1")
    visit(browser, served, f"/jobs?id={job.id}&queue=dash", tmp_path, "replay-job-waiting")
    assert browser.find_element(By.CSS_SELECTOR, '#info tr[data-field="state"] td').text == "discarded"
    assert browser.find_element(By.CSS_SELECTOR, '#info tr[data-field="error"] th').text == "error before the replay"
    note = browser.find_element(By.ID, "before-replay").text
    assert re.fullmatch(f"This outcome and its error are from before the replay at {ISO_AGE.pattern}: "
                        "the replayed job has not started yet.", note), note  # fmt: skip
    assert browser.find_elements(By.ID, "cancel")  # the replayed job waits: a cancel still acts

    client.resume("dash")
    wait_until(lambda: (letters := client.dead_letters("dash")) and len(letters[0].job.errors or ()) >= 2,
               timeout=20, message="the replayed job dead-lettered again")  # fmt: skip
    replayed_at = client.dead_letters("dash")[0].job.meta["ojs.last_replayed_at"]
    visit(browser, served, f"/jobs?id={job.id}&queue=dash", tmp_path, "replay-job-after")
    assert browser.find_elements(By.ID, "before-replay") == []  # the outcome is the replayed run's
    assert ISO_AGE.fullmatch(browser.find_element(By.CSS_SELECTOR, '#info tr[data-field="replayed_at"] td').text)

    visit(browser, served, "/queues/dash/dead", tmp_path, "replay-after")
    row = browser.find_element(By.CSS_SELECTOR, f'#letters tr[data-id="{job.id}"]')
    note, since_note = (p.text for p in row.find_elements(By.CSS_SELECTOR, ".replayed"))
    assert re.fullmatch(f"errors before replay at {re.escape(replayed_at)} {AGE}:", note), note
    assert since_note == "since the replay:"
    before = row.find_elements(By.CSS_SELECTOR, "ul.before-replay li")
    since = row.find_elements(By.CSS_SELECTOR, "ul.since-replay li")
    assert len(before) == 1 and len(since) >= 1
    assert all("always-fails" in li.text and "attempt 1" in li.text for li in before)
    visit(browser, served, "/queues/dash", tmp_path, "replay-queue")  # the queue page's letters say it too
    note = browser.find_element(By.CSS_SELECTOR, f'#letters tr[data-id="{job.id}"] .replayed').text
    assert re.fullmatch(f"errors before replay at {re.escape(replayed_at)} {AGE}:", note), note


def test_an_open_page_updates_itself_keeping_scroll_focus_and_selection(
    browser, serve, worker, client, names, tmp_path
):
    served = serve(refresh=0.5)
    client.declare_queue("live")
    visit(browser, served, "/", tmp_path, "live-before")
    assert read(browser, 'tr[data-queue="live"] .ready') == "0"
    browser.execute_script(
        "window.__sameDocument = true; document.getElementById('overview-live').__sameRegion = true;"
        "document.body.style.paddingBottom = '3000px'; window.scrollTo(0, 400);"
    )
    for i in range(3):
        client.enqueue("nobody.handles", [i], queue="live")
    wait_until(lambda: read(browser, 'tr[data-queue="live"] .ready') == "3",
               timeout=20, message="the ready count updated without a reload")  # fmt: skip
    browser.save_screenshot(str(tmp_path / "live-after.png"))
    assert browser.execute_script(
        "return [window.__sameDocument, document.getElementById('overview-live').__sameRegion, window.scrollY]"
    ) == [True, True, 400]
    assert read(browser, "#live").startswith("live · updated ")

    # the dead letters page: a selection and a filter being typed survive the updates
    first = client.enqueue("no.handler", ["x"], queue="dash")  # no handler: dead-lettered with an error
    wait_until(lambda: dead_count(client, names) == 1, message="the first dead letter")
    visit(browser, served, "/queues/dash/dead", tmp_path, "live-dead-before")
    browser.find_element(By.CSS_SELECTOR, f'input[name="id"][value="{first.id}"]').click()
    field = browser.find_element(By.CSS_SELECTOR, '#filter input[name="error"]')
    field.click()
    field.send_keys("typed")
    second = client.enqueue("no.handler", ["y"], queue="dash")
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, f'#letters tr[data-id="{second.id}"]'),
               timeout=20, message="the new dead letter shown without a reload")  # fmt: skip
    browser.save_screenshot(str(tmp_path / "live-dead-after.png"))
    assert browser.execute_script(
        "return Array.from(document.querySelectorAll('#letters input[name=id]')).map(b => [b.value, b.checked])"
    ) == [[first.id, True], [second.id, False]]
    assert browser.execute_script("return document.activeElement.name") == "error"
    assert field.get_attribute("value") == "typed"


def test_live_updates_in_token_and_read_only_mode(browser, serve, client, tmp_path):
    token = uuid.uuid4().hex
    served = serve(token=token, read_only=True, refresh=0.5)
    assert requests.get(served.base + "/static/live.js").status_code == 401  # the script is behind the token too
    script = requests.get(served.base + "/static/live.js", headers={"Authorization": f"Bearer {token}"})
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    client.declare_queue("live")
    browser.delete_all_cookies()
    visit(browser, served, f"/?token={token}", tmp_path, "live-token")
    client.enqueue("nobody.handles", [], queue="live")
    wait_until(lambda: read(browser, 'tr[data-queue="live"] .ready') == "1",
               timeout=20, message="the ready count updated with the token cookie")  # fmt: skip
    assert "token=" not in browser.current_url
    assert browser.find_elements(By.CSS_SELECTOR, 'form[method="post"]') == []
    browser.delete_all_cookies()  # the next update is refused: the page says so and stops
    wait_until(lambda: "no longer authorized" in read(browser, "#live"), timeout=20,
               message="the refused update said")  # fmt: skip


def test_without_scripts_the_page_is_complete_and_refreshes_by_hand(scriptless_browser, serve, client, tmp_path):
    served = serve(refresh=0.5)
    client.declare_queue("live")
    visit(scriptless_browser, served, "/", tmp_path, "noscript")
    assert scriptless_browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="live"] .ready').text == "0"
    assert scriptless_browser.find_element(By.ID, "live").text == ""  # nothing claims to be live
    client.enqueue("nobody.handles", [], queue="live")
    scriptless_browser.find_element(By.ID, "refresh").click()
    wait_until(lambda: scriptless_browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="live"] .ready').text == "1",
               message="the count after the manual refresh")  # fmt: skip


def test_an_open_error_page_gives_way_to_the_page_once_the_cause_is_gone(browser, serve, client, tmp_path):
    served = serve(refresh=0.5)
    text = visit(browser, served, "/queues/later/dead", tmp_path, "live-error")
    assert "NotFoundError" in text
    browser.execute_script("window.__sameDocument = true;")
    client.declare_queue("later")  # and its dead letter queue
    shown(browser, "#letters", "No dead letters.")
    assert browser.execute_script("return window.__sameDocument") is True
    assert browser.title.startswith("Dead letters of later")
    assert read(browser, "#live").startswith("live · updated ")
