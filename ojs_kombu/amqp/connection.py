"""Broker URLs and kombu connections: one way to build and open them (DESIGN §9)."""

from __future__ import annotations

import os
from typing import Any

import kombu

#: AMQP heartbeat in seconds (DESIGN §9).
DEFAULT_HEARTBEAT = 60

DEFAULT_URL = "amqp://guest:guest@localhost:5672//"


def resolve_url(url: str | None) -> str:
    """The broker URL: ``url``, else ``$OJS_AMQP_URL``, else the local default."""
    return url or os.environ.get("OJS_AMQP_URL") or DEFAULT_URL


def safe_url(url: str) -> str:
    """``url`` with any password masked, for logs and error messages."""
    return kombu.Connection(url).as_uri(include_password=False) if url else url


def make_connection(
    url: str, *, heartbeat: float, ssl: Any, transport_options: dict[str, Any] | None, connection_name: str
) -> kombu.Connection:
    """An unconnected kombu connection; ``connection_name`` shows in the management UI
    unless ``transport_options`` already carry ``client_properties``."""
    options = dict(transport_options or {})
    options.setdefault("client_properties", {"connection_name": connection_name})
    return kombu.Connection(url, heartbeat=heartbeat, ssl=ssl, transport_options=options)


def connect_once(conn: kombu.Connection) -> Any:
    """Make one connection attempt, without kombu's own retries and sleeps.

    The caller owns the back-off (DESIGN §9); kombu's ``connect()`` would add a
    fixed 2 s retry of its own to every attempt.  After a failure the next URL
    of a failover list is selected for the next attempt.
    """
    try:
        return conn.ensure_connection(max_retries=0, reraise_as_library_errors=False)
    except conn.recoverable_connection_errors:
        conn.maybe_switch_next()
        raise


__all__ = ["DEFAULT_HEARTBEAT", "DEFAULT_URL", "connect_once", "make_connection", "resolve_url", "safe_url"]
