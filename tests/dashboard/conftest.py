"""The dashboard served by uvicorn in a thread, a broker user with a distinctive password, one headless Chromium."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from dashboard_pages import Served
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from ojs_kombu import Client
from ojs_kombu.amqp.management import ManagementClient, management_client
from ojs_kombu.dashboard.app import create_app
from ojs_kombu.dashboard.server import DashboardServer
from ojs_kombu.testing.broker import BrokerHandle
from tools.browser import ensure_browser_installed


def _chromium(*, scripts: bool) -> webdriver.Chrome:
    chromium, chromedriver = ensure_browser_installed()
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    if not scripts:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.implicitly_wait(0)
    return driver


@pytest.fixture(scope="session")
def browser() -> Iterator[webdriver.Chrome]:
    """One headless Chromium for the session, driven through Selenium."""
    driver = _chromium(scripts=True)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def scriptless_browser() -> Iterator[webdriver.Chrome]:
    """A headless Chromium with JavaScript turned off (the dashboard without its live updates)."""
    driver = _chromium(scripts=False)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def secret(broker: BrokerHandle, management: ManagementClient) -> Iterator[tuple[str, str]]:
    """``(amqp URL, password)`` of a user created for the session, whose password is a string found nowhere else."""
    user, password = f"dash-{uuid.uuid4().hex[:8]}", f"Pw{uuid.uuid4().hex}Zq"
    management.create_user(user, password, tags="monitoring")
    management.set_permissions(user)
    parts = urlsplit(broker.url)
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port}"
    yield urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")), password
    management.delete_user(user)


@pytest.fixture
def serve(
    secret: tuple[str, str], prefix: str, broker: BrokerHandle, caplog: pytest.LogCaptureFixture
) -> Iterator[Callable[..., Served]]:
    """Start the dashboard (``serve(read_only=..., token=..., refresh=...)``) on a free port for the test's prefix."""
    url, password = secret
    started: list[tuple[DashboardServer, Client]] = []
    caplog.set_level(logging.DEBUG)

    def start(*, read_only: bool = False, token: str | None = None, refresh: float = 5.0) -> Served:
        client = Client(url, prefix=prefix)
        management = management_client(broker.management_url, url)
        app = create_app(client, management, read_only=read_only, token=token, sample_every=0.5, refresh=refresh)
        server = DashboardServer(app, port=0).start()
        started.append((server, client))
        served = Served(f"http://127.0.0.1:{server.port}", password)
        served.stop = server.stop
        return served

    yield start
    for server, client in started:
        server.stop()
        client.close()
    assert password not in caplog.text, "the broker password was logged"
