"""The Prometheus endpoint (``serve_metrics``): loopback by default, typed errors, a port freed on stop."""

from __future__ import annotations

import errno
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from ojs_kombu.errors import MetricsServerError, ValidationError
from ojs_kombu.observability.server import MetricsServer, serve_metrics


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("ojs_test_things", "Things", registry=registry).inc(3)
    return registry


@pytest.fixture
def server(registry: CollectorRegistry) -> Iterator[MetricsServer]:
    running = serve_metrics(0, registry=registry)
    yield running
    running.stop()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


def test_serves_the_registry_on_loopback_by_default(server: MetricsServer) -> None:
    assert server.host == "127.0.0.1"
    assert server.url == f"http://127.0.0.1:{server.port}/metrics"
    assert "ojs_test_things_total 3.0" in scrape(server.url)


def test_a_port_in_use_is_a_typed_error(server: MetricsServer, registry: CollectorRegistry) -> None:
    with pytest.raises(MetricsServerError, match=f"127.0.0.1:{server.port}") as caught:
        serve_metrics(server.port, registry=registry)
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno.EADDRINUSE


def test_stop_frees_the_port(registry: CollectorRegistry) -> None:
    first = serve_metrics(0, registry=registry)
    port = first.port
    scrape(first.url)  # a served connection: its TIME_WAIT must not keep the port either
    first.stop()
    first.stop()  # a second stop does nothing

    with pytest.raises(urllib.error.URLError):
        scrape(first.url)
    again = serve_metrics(port, registry=registry)  # what a restarted worker does
    try:
        assert "ojs_test_things_total 3.0" in scrape(again.url)
    finally:
        again.stop()


def test_an_unknown_host_is_a_typed_error(registry: CollectorRegistry) -> None:
    with pytest.raises(MetricsServerError, match="no-such-host.invalid"):
        serve_metrics(0, "no-such-host.invalid", registry=registry)


@pytest.mark.parametrize("port", [-1, 65536, "9100", 1.5, True])
def test_a_port_that_is_not_a_port_number_is_refused(port: object) -> None:
    with pytest.raises(ValidationError, match="metrics port"):
        serve_metrics(port)  # type: ignore[arg-type]


def test_the_listener_is_not_reachable_on_other_interfaces(server: MetricsServer) -> None:
    """Bound to 127.0.0.1, not the wildcard: the port is free on another address of the host."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("127.0.0.2", server.port))  # fails with EADDRINUSE if the server held 0.0.0.0
    finally:
        probe.close()
