"""What the dashboard shows of crons, limits and unique locks (issue 32 item 4), in headless Chromium over a
real broker: the Crons page with its leader and enable / disable (confirmed, CSRF-checked, refused read-only),
the permits of each limit key and the unique locks held, each updating itself while the page is open."""

from __future__ import annotations

import re
import threading
import uuid
from datetime import timedelta

import kombu
import pytest
import requests
from dashboard_pages import docs_shot, visit
from selenium.webdriver.common.by import By
from support import raw_channel, wait_until
from test_dashboard import shown
from test_dashboard_live import ISO_AGE, PYTHON_VALUES, read

from ojs_kombu import CronRegistry, CronScheduler, Names, Permits
from ojs_kombu.amqp.locks import Acquired, UniqueLocks
from ojs_kombu.wire.cron import CRON_TYPE_MARKER

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def crons(client, amqp_url, prefix):
    """Two crons, ``heartbeat`` (every 2 s, enabled) and ``nightly-report`` (disabled), and a running scheduler
    that is their leader and has fired ``heartbeat`` once."""
    client.register_cron("heartbeat", "@every 2s", "ping", [], queue="cronned", description="keeps the lights on")
    client.register_cron(
        "nightly-report", "0 3 * * *", "report.build", ["daily"], queue="reports", timezone="Europe/Paris",
        enabled=False,
    )  # fmt: skip
    scheduler = CronScheduler(amqp_url, prefix=prefix, scheduler_id=f"dash-{uuid.uuid4().hex[:6]}").start()
    registry = CronRegistry.connect(amqp_url, names=Names(prefix))
    wait_until(lambda: (lead := registry.leader()) is not None and lead.scheduler_id == scheduler.scheduler_id,
               timeout=30, message="the scheduler elected")  # fmt: skip
    wait_until(lambda: [c.run_count for c in client.crons() if c.name == "heartbeat"][0] >= 1, timeout=30,
               message="heartbeat fired")  # fmt: skip
    registry.close()
    yield scheduler
    scheduler.stop()


def markers(amqp_url: str, stream: str) -> int:
    """The catch-up markers in the cron stream, counted by a plain consumer (which publishes none)."""
    types: list[str] = []
    with raw_channel(amqp_url) as channel:
        channel.basic_qos(prefetch_count=1000)
        for method, properties, _ in channel.consume(stream, arguments={"x-stream-offset": "first"},
                                                     inactivity_timeout=1.0):  # fmt: skip
            if method is None:
                break
            types.append(properties.type)
            channel.basic_ack(method.delivery_tag)
    return types.count(CRON_TYPE_MARKER)


def updates(browser) -> int:
    return int(browser.execute_script("return document.body.dataset.updates || '0'"))


def cell(browser, name: str, css: str) -> str | None:
    return read(browser, f'#crons tr[data-cron="{name}"] {css}')


def test_the_crons_page_shows_runs_and_the_leader_and_disables_after_a_confirmation(
    browser, serve, client, crons, amqp_url, names, tmp_path
):
    served = serve(refresh=0.5)
    text = visit(browser, served, "/crons", tmp_path, "crons")
    assert "Crons" in browser.find_element(By.TAG_NAME, "nav").text
    leader = browser.find_element(By.ID, "leader")
    assert crons.scheduler_id in leader.text
    assert ISO_AGE.fullmatch(leader.find_element(By.CSS_SELECTOR, ".since").text)
    assert re.search(r":\d+$", leader.find_element(By.CSS_SELECTOR, ".host").text)
    next_run = cell(browser, "heartbeat", ".next")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (just now|in \d+ s|\d+ s ago)", next_run), next_run
    assert ISO_AGE.fullmatch(cell(browser, "heartbeat", ".last"))
    assert int(cell(browser, "heartbeat", ".runs")) >= 1
    last_job = browser.find_element(By.CSS_SELECTOR, '#crons tr[data-cron="heartbeat"] .last-job a')
    assert "queue=cronned" in last_job.get_attribute("href")
    assert cell(browser, "heartbeat", ".enabled") == "yes"
    assert cell(browser, "nightly-report", ".enabled") == "no"
    assert cell(browser, "nightly-report", ".next") == "–"  # disabled: no next run (CRON-28)
    assert cell(browser, "nightly-report", ".timezone") == "Europe/Paris"
    assert cell(browser, "nightly-report", ".expression") == "0 3 * * *"
    assert "keeps the lights on" in text
    assert not PYTHON_VALUES.search(text), PYTHON_VALUES.search(text)
    docs_shot(browser, "crons")

    # the runs count moves while the page is open, and the updates add nothing to the cron stream
    runs = int(cell(browser, "heartbeat", ".runs"))
    before, seen = markers(amqp_url, names.cron_stream), updates(browser)
    assert before >= 1  # the dashboard's own, when it started following
    wait_until(lambda: int(cell(browser, "heartbeat", ".runs") or 0) > runs and updates(browser) >= seen + 4,
               timeout=20, message="the run count updated without a reload")  # fmt: skip
    assert markers(amqp_url, names.cron_stream) == before

    # disable from the page: a confirmation, then the row flips
    browser.find_element(By.CSS_SELECTOR, '#crons tr[data-cron="heartbeat"] button.disable').click()
    shown(browser, "h1", "Confirm: disable cron heartbeat")
    browser.find_element(By.ID, "confirm").click()
    shown(browser, "#done", "disable:heartbeat")
    assert cell(browser, "heartbeat", ".enabled") == "no"
    assert [c.enabled for c in client.crons() if c.name == "heartbeat"] == [False]
    assert browser.find_elements(By.CSS_SELECTOR, '#crons tr[data-cron="heartbeat"] button.enable')

    # enabled elsewhere (the CLI, another dashboard): the open page shows it
    browser.get(served.base + "/crons")
    cron = [c for c in client.crons() if c.name == "nightly-report"][0]
    client.register_cron(cron.name, cron.cron, cron.type, cron.args, queue=cron.queue, timezone=cron.timezone,
                         enabled=True)  # fmt: skip
    wait_until(lambda: cell(browser, "nightly-report", ".enabled") == "yes", timeout=20,
               message="the enabled cron shown without a reload")  # fmt: skip
    assert re.fullmatch(r"\S+Z in \d+ (s|min|h)", cell(browser, "nightly-report", ".next") or "")


def test_cron_actions_are_guarded_like_the_others(browser, serve, client, crons, tmp_path):
    served = serve()
    session = requests.Session()
    session.get(served.base + "/crons")
    refused = session.post(served.base + "/crons/heartbeat/disable", data={"confirmed": "yes"})
    assert refused.status_code == 403  # no CSRF token
    token = session.cookies["ojs_csrf"]
    wrong = session.post(served.base + "/crons/heartbeat/disable", data={"csrf": token})
    assert wrong.status_code == 400  # not confirmed
    assert [c.enabled for c in client.crons() if c.name == "heartbeat"] == [True]

    read_only = serve(read_only=True)
    visit(browser, read_only, "/crons", tmp_path, "crons-read-only")
    assert browser.find_elements(By.CSS_SELECTOR, "#crons tr[data-cron]")
    assert browser.find_elements(By.CSS_SELECTOR, 'form[method="post"]') == []
    session = requests.Session()
    session.get(read_only.base + "/crons")
    answer = session.post(read_only.base + "/crons/heartbeat/disable",
                          data={"csrf": session.cookies["ojs_csrf"], "confirmed": "yes"})  # fmt: skip
    assert answer.status_code == 403
    assert [c.enabled for c in client.crons() if c.name == "heartbeat"] == [True]

    token = uuid.uuid4().hex
    guarded = serve(token=token)
    assert requests.get(guarded.base + "/crons").status_code == 401
    assert requests.get(guarded.base + "/limits").status_code == 401


def limit(browser, key: str) -> dict[str, str]:
    got = browser.execute_script(
        "const r = document.querySelector(`#limits tr[data-key='${arguments[0]}']`); if (!r) return null;"
        "return Object.fromEntries(['in-use','total','available','waiting','held']"
        ".map(c => [c, r.querySelector('.' + c).textContent]));",
        key,
    )
    return got or {}


def test_limits_show_permits_in_use_and_waiting_and_follow_a_release(browser, serve, amqp_url, names, tmp_path):
    served = serve(refresh=0.5)
    first, second = Permits(amqp_url, names=names), Permits(amqp_url, names=names)
    try:
        first.ensure("partner-api", 3)
        second.ensure("partner-api", 3)
        held = [first.acquire("partner-api", timeout=5), first.acquire("partner-api", timeout=5)]
        third = second.acquire("partner-api", timeout=5)
        assert all(held) and third is not None
        waiter: list = []
        thread = threading.Thread(target=lambda: waiter.append(second.acquire("partner-api", timeout=60)))
        thread.start()
        wait_until(lambda: second.waiting("partner-api") == 1, message="a waiter")
        visit(browser, served, "/limits", tmp_path, "limits")
        expected = {"in-use": "3", "total": "3", "available": "0", "waiting": "1", "held": "#0, #1, #2"}
        wait_until(lambda: limit(browser, "partner-api") == expected, timeout=20, message=f"the key shows {expected}")
        text = browser.find_element(By.TAG_NAME, "main").text
        assert not PYTHON_VALUES.search(text), PYTHON_VALUES.search(text)
        docs_shot(browser, "limits")

        held[0].release()  # the waiter takes it: still 3 in use, none waiting
        thread.join(10)
        assert waiter and waiter[0] is not None
        wait_until(lambda: limit(browser, "partner-api").get("waiting") == "0", timeout=20,
                   message="the waiter served, shown without a reload")  # fmt: skip
        held[1].release()
        waiter[0].release()
        wait_until(lambda: limit(browser, "partner-api") | {"held": ""} ==
                   {"in-use": "1", "total": "3", "available": "2", "waiting": "0", "held": ""},
                   timeout=20, message="the released permits shown without a reload")  # fmt: skip
        third.release()
    finally:
        first.close()
        second.close()


def test_unique_locks_held_are_counted_and_name_their_holder(browser, serve, amqp_url, names, tmp_path):
    served = serve(refresh=0.5)
    visit(browser, served, "/limits", tmp_path, "locks-none")
    assert read(browser, "#locks-count .count") == "0"
    keys = [uuid.uuid4().hex * 2 for _ in range(3)]
    with kombu.Connection(amqp_url) as connection:
        connection.connect()
        locks = UniqueLocks(connection.connection, names=names)
        try:
            holders = {key: str(uuid.uuid4()) for key in keys}
            for key, holder in holders.items():
                assert isinstance(locks.acquire(key, holder, timedelta(minutes=5)), Acquired)
            wait_until(lambda: read(browser, "#locks-count .count") == "3", timeout=20,
                       message="three locks counted without a reload")  # fmt: skip
            for key, holder in holders.items():
                wait_until(lambda key=key, holder=holder: read(browser, f'#locks tr[data-key="{key}"] .holder') == holder,
                           timeout=20, message=f"the holder of {key[:8]}")  # fmt: skip
            link = browser.find_element(By.CSS_SELECTOR, f'#locks tr[data-key="{keys[0]}"] .holder a')
            assert link.get_attribute("href").endswith(f"/jobs?id={holders[keys[0]]}")
            browser.save_screenshot(str(tmp_path / "locks.png"))
            assert locks.release(keys[0], holders[keys[0]])
            wait_until(lambda: read(browser, "#locks-count .count") == "2", timeout=20,
                       message="the released lock gone without a reload")  # fmt: skip
            assert browser.find_elements(By.CSS_SELECTOR, f'#locks tr[data-key="{keys[0]}"]') == []
            assert locks.holder(keys[1]) == holders[keys[1]]  # the dashboard's reads left the records in place
        finally:
            for key, holder in holders.items():
                locks.release(key, holder)
            locks.close()
