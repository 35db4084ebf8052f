"""Broker URLs and kombu connections: one way to build and open them (DESIGN §9)."""

from __future__ import annotations

from typing import Any

from kombu.connection import Connection

from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.urls import DEFAULT_URL, resolve_url, safe_url

#: AMQP heartbeat in seconds (DESIGN §9).
DEFAULT_HEARTBEAT = 60


def make_connection(
    url: str, *, heartbeat: float, ssl: Any, transport_options: dict[str, Any] | None, connection_name: str
) -> Connection:
    """An unconnected kombu connection; ``connection_name`` shows in the management UI
    unless ``transport_options`` already carry ``client_properties``."""
    options = dict(transport_options or {})
    options.setdefault("client_properties", {"connection_name": connection_name})
    return Connection(url, heartbeat=heartbeat, ssl=ssl, transport_options=options)


def connect_once(conn: Connection, *, timeout: float | None = None) -> Any:
    """Make one connection attempt, without kombu's own retries and sleeps.

    The caller owns the back-off (DESIGN §9); kombu's ``connect()`` would add a
    fixed 2 s retry of its own to every attempt.  After a failure the next URL
    of a failover list is selected for the next attempt.

    Parameters:
        conn: the kombu connection to open.
        timeout: seconds the TCP connect and AMQP handshake may take (default: the
            connection's ``connect_timeout``, 5 s); a retry budget passes what is left of it.

    Returns:
        The py-amqp connection.

    Raises:
        AccessRefusedError: the broker refused the login or the virtual host (permanent).
        OSError, amqp.ConnectionError: a transient failure, for the caller's back-off.
    """
    if timeout is not None:
        conn.connect_timeout = max(0.05, timeout)  # type: ignore[assignment]  # kombu: int default, float use
    with map_exceptions(url=conn.as_uri()):
        try:
            return conn.ensure_connection(max_retries=0, reraise_as_library_errors=False)
        except conn.recoverable_connection_errors:
            conn.maybe_switch_next()
            raise


__all__ = ["DEFAULT_HEARTBEAT", "DEFAULT_URL", "connect_once", "make_connection", "resolve_url", "safe_url"]
