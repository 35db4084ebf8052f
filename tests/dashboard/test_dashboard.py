"""The web dashboard (issue 12 item 2) in headless Chromium, over a real broker and a running Worker."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import requests
from dashboard_pages import visit
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from support import raw_channel, wait_until

from ojs_kombu import Worker, current_job

pytestmark = pytest.mark.timeout(60)


def shown(browser, css: str, text: str = ""):
    """The element ``css`` once the page that a click loads shows it (containing ``text``).

    (A click on a submit button returns before the next page has loaded.)
    """

    def find():
        try:
            found = [e for e in browser.find_elements(By.CSS_SELECTOR, css) if text in e.text]
        except StaleElementReferenceException:  # found on the page being replaced
            return None
        except WebDriverException as exc:
            # The same race as ChromeDriver 150 words it when the node's document was replaced
            # between find_elements and .text ("unhandled inspector error": -32000).
            if "does not belong to the document" not in str(exc.msg):
                raise
            return None
        return found[0] if found else None

    return wait_until(find, message=f"{css} showing {text!r}")


def consumers(amqp_url: str, queue: str) -> int:
    """Consumers of ``queue`` right now (passive declare, exact)."""
    with raw_channel(amqp_url) as channel:
        return int(channel.queue_declare(queue, passive=True).method.consumer_count)


@pytest.fixture
def worker(amqp_url, prefix):
    """A running Worker on queue ``dash``; ``flaky`` fails its first two runs, then succeeds."""
    runs: list[int] = []
    lock = threading.Lock()

    def flaky(n):
        with lock:
            runs.append(n)
            if len(runs) <= 2:
                raise RuntimeError(f"flaky-run-{len(runs)}-failed")

    def block():
        job = current_job()
        w.blocking.set()
        try:
            while not job.cancelled.is_set():  # polled: a cancel may arrive while the handler sleeps
                time.sleep(0.05)
        finally:  # the worker may also raise Cancelled into the handler
            if job.cancelled.is_set():
                w.cancelled.set()

    w = Worker(amqp_url, queues=("dash",), prefix=prefix, grace_period=2, concurrency=1)
    w.blocking, w.cancelled = threading.Event(), threading.Event()
    w.handler("flaky", flaky)
    w.handler("block", block)
    w.start()
    assert w.wait_until_ready()
    w.runs = runs
    yield w
    w.stop()


def test_overview_dead_letters_and_replay_from_the_page(browser, serve, worker, client, names, tmp_path):
    for i in range(3):
        client.enqueue("idle", [i], queue="backlog")
    # two attempts: the first one's error is in the job's errors[] (recorded when it was retried), the
    # second, final one is the letter's error (recorded in the control stream before the Nack, joined on read)
    retry = {"max_attempts": 2, "initial_interval": "PT0.2S", "jitter": False}
    job = client.enqueue("flaky", [7], queue="dash", retry=retry)
    wait_until(lambda: (c := client.queue_counts([names.dead_letter_queue("dash")])[names.dead_letter_queue("dash")])
               and c.ready == 1, message="the failed job in the dead letter queue")  # fmt: skip
    served = serve()

    text = visit(browser, served, "/", tmp_path, "overview")
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="backlog"]')
    assert row.find_element(By.CLASS_NAME, "ready").text == "3"
    assert "dash" in text
    assert browser.find_elements(By.CSS_SELECTOR, 'tr[data-queue="backlog"] svg.spark polyline')

    visit(browser, served, "/queues/dash", tmp_path, "queue")
    text = visit(browser, served, "/queues/dash/dead", tmp_path, "dead-letters")
    letter = browser.find_element(By.CSS_SELECTOR, f'#letters tr[data-id="{job.id}"]')
    assert "flaky-run-1-failed" in letter.text and "flaky" in letter.text and "rejected" in letter.text
    assert "handler_error: flaky-run-2-failed" in letter.text  # the final failure, attempt 2

    browser.find_element(By.ID, "replay").click()
    shown(browser, "h1", "Confirm: replay")
    browser.save_screenshot(str(tmp_path / "confirm.png"))
    assert worker.runs == [7, 7]  # the confirmation step alone replays nothing
    browser.find_element(By.ID, "confirm").click()
    assert shown(browser, "#done").text == "Done: replay:1"
    wait_until(lambda: len(worker.runs) == 3, message="the replayed job ran again")
    assert worker.runs == [7, 7, 7]
    wait_until(lambda: client.queue_counts([names.dead_letter_queue("dash")])[names.dead_letter_queue("dash")].ready
               == 0, message="the dead letter queue empty")  # fmt: skip


def test_filter_select_and_purge_dead_letters_from_the_page(browser, serve, worker, client, names, tmp_path):
    dlq = names.dead_letter_queue("dash")
    kept = client.enqueue("no.handler.kept", [], queue="dash")  # no handler: republished to the DLQ with an error
    gone = [client.enqueue("no.handler.gone", [i], queue="dash") for i in range(2)]
    wait_until(lambda: (c := client.queue_counts([dlq])[dlq]) and c.ready == 3, message="three dead letters")
    served = serve()
    visit(browser, served, "/queues/dash/dead?type=no.handler.gone", tmp_path, "dead-filtered")
    shown_ids = {e.get_attribute("data-id") for e in browser.find_elements(By.CSS_SELECTOR, "#letters tr[data-id]")}
    assert shown_ids == {j.id for j in gone}
    browser.find_element(By.CSS_SELECTOR, f'input[name="id"][value="{gone[0].id}"]').click()
    browser.find_element(By.ID, "purge").click()
    assert gone[0].id in shown(browser, "p", "1 selected letter").text
    browser.save_screenshot(str(tmp_path / "confirm-purge.png"))
    browser.find_element(By.ID, "confirm").click()
    assert shown(browser, "#done").text == "Done: purge:1"
    left = {e.letter_id for e in client.dead_letters("dash", limit=None)}
    assert left == {kept.id, gone[1].id}


def test_pause_from_the_workers_page_stops_deliveries(browser, serve, worker, amqp_url, names, tmp_path):
    served = serve()
    assert consumers(amqp_url, names.job_queue("dash")) == 1

    def pause_button():
        browser.get(served.base + "/workers")
        return browser.find_elements(By.CSS_SELECTOR, 'tr[data-queue="dash"] button.pause')

    buttons = wait_until(pause_button, timeout=20, message="the worker's queue on the workers page")
    visit(browser, served, "/workers", tmp_path, "workers")
    browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="dash"] button.pause').click()
    assert buttons  # the page that showed the button
    wait_until(lambda: consumers(amqp_url, names.job_queue("dash")) == 0, message="no consumer after the pause")
    shown(browser, 'tr[data-queue="dash"] button.resume')
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="dash"] .paused').text == "paused"
    browser.save_screenshot(str(tmp_path / "workers-paused.png"))


def test_job_lookup_shows_info_and_cancels_the_running_job(browser, serve, worker, client, tmp_path):
    job = client.enqueue("block", [], queue="dash")
    assert worker.blocking.wait(10)
    served = serve()
    visit(browser, served, f"/jobs?id={job.id}&queue=dash", tmp_path, "job")
    assert browser.find_element(By.CSS_SELECTOR, '#info tr[data-field="state"] td').text == "active"
    assert browser.find_element(By.CSS_SELECTOR, '#info tr[data-field="type"] td').text == "block"
    browser.find_element(By.ID, "cancel").click()
    shown(browser, "#cancelled")
    assert worker.cancelled.wait(10)


def test_read_only_has_no_actions_and_refuses_a_forged_post(browser, serve, worker, client, tmp_path):
    client.enqueue("flaky", [1], queue="dash", retry={"max_attempts": 1})
    served = serve(read_only=True)
    for path, name in (("/", "ro-overview"), ("/queues/dash/dead", "ro-dead"), ("/workers", "ro-workers"),
                       ("/jobs?id=x&queue=dash", "ro-job")):  # fmt: skip
        visit(browser, served, path, tmp_path, name)
        assert browser.find_elements(By.CSS_SELECTOR, 'form[method="post"]') == []
        assert browser.find_elements(By.CSS_SELECTOR, "#replay, #purge, #cancel, button.pause, button.resume") == []
    session = requests.Session()
    session.get(served.base + "/")  # the CSRF cookie, so that only read-only mode can refuse
    csrf = session.cookies["ojs_csrf"]
    for path in ("/queues/dash/pause", "/queues/dash/dead/purge", "/jobs/cancel"):
        answer = session.post(served.base + path, data={"csrf": csrf, "confirmed": "yes", "id": "x", "queue": "dash"})
        assert answer.status_code == 403, path
    assert client.paused_queues(["dash"]) == {"dash": False}


def test_token_is_required_and_posts_need_the_csrf_token(browser, serve, tmp_path):
    token = uuid.uuid4().hex
    served = serve(token=token)
    assert requests.get(served.base + "/").status_code == 401
    assert requests.get(served.base + "/workers", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert requests.get(served.base + "/?token=wrong").status_code == 401
    assert requests.post(served.base + "/queues/dash/pause").status_code == 401
    assert requests.get(served.base + "/", headers={"Authorization": f"Bearer {token}"}).status_code == 200

    browser.delete_all_cookies()
    visit(browser, served, f"/?token={token}", tmp_path, "token-overview")
    assert "token=" not in browser.current_url
    cookie = browser.get_cookie("ojs_token")
    assert cookie is not None and cookie["httpOnly"] and cookie["value"] == token
    assert "OJS queues" in visit(browser, served, "/", tmp_path, "token-again")  # the cookie alone is enough

    auth = {"Authorization": f"Bearer {token}"}
    session = requests.Session()
    session.get(served.base + "/", headers=auth)
    assert session.post(served.base + "/queues/dash/pause", headers=auth, data={}).status_code == 403
    assert session.post(served.base + "/queues/dash/pause", headers=auth, data={"csrf": "forged"}).status_code == 403
    browser.delete_all_cookies()


def test_the_broker_password_appears_in_no_page(browser, serve, worker, secret, tmp_path):
    _, password = secret
    served = serve()
    for path in ("/", "/queues/dash", "/queues/dash/dead", "/workers", "/jobs?id=nope&queue=dash", "/queues/nope"):
        visit(browser, served, path, tmp_path, "pw-" + path.strip("/").replace("/", "-").split("?")[0])
        assert password not in browser.page_source
    assert requests.get(served.base + "/queues/nope/dead").status_code == 404  # an error page, not a crash
    assert requests.get(served.base + "/queues/dash/dead?limit=x").status_code == 400
