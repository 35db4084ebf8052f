"""The dashboard's overview and the management API: found from the broker URL, or said which URL failed (issue 29)."""

from __future__ import annotations

import html
import socket
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from ojs_kombu import Client
from ojs_kombu.amqp.management import management_client
from ojs_kombu.dashboard.app import create_app
from ojs_kombu.dashboard.server import DashboardServer


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def overview(broker_url: str, management_url: str | None, prefix: str) -> tuple[int, str]:
    """GET / of a dashboard served for ``broker_url`` with ``management_client(management_url, broker_url)``."""
    with Client(broker_url, prefix=prefix) as client:
        app = create_app(client, management_client(management_url, broker_url), sample_every=0)
        server = DashboardServer(app, port=0).start()
        try:
            return get(f"http://127.0.0.1:{server.port}/")
        finally:
            server.stop()


def test_overview_with_the_management_url_given_lists_the_queues(secret, broker, prefix):
    url, password = secret
    with Client(url, prefix=prefix) as client:
        client.declare_queue("shown")
    code, page = overview(url, broker.management_url, prefix)
    assert code == 200 and "shown" in page and password not in page


def test_overview_with_an_unanswering_derived_url_names_it_and_what_to_set(secret, prefix):
    url, password = secret
    host = urlsplit(url).hostname or ""
    with socket.socket() as probe:
        probe.settimeout(2)
        if probe.connect_ex((host, 15672)) == 0:
            pytest.skip(f"something answers on {host}:15672: the derived URL cannot be shown failing here")
    code, page = overview(url, None, prefix)
    text = html.unescape(page)
    assert code == 400 and f"the management API at http://{host}:15672 (derived from the broker URL)" in text
    assert "set --management-url or $OJS_MANAGEMENT_URL" in text and password not in page
