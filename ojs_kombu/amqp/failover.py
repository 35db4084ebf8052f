"""Failover across the nodes of a cluster: which URL to connect to next, and how long to wait first.

One policy for every connection the library opens and re-opens itself (the
:class:`~ojs_kombu.client.Client`'s pool, a worker's consumer, its beacon, the
Dramatiq broker's consumers), DESIGN §9 and §16:

* on a connection loss or a failed attempt, move to the next URL of the list;
* try every node back to back, and only after a full rotation has failed wait
  :func:`~ojs_kombu.policy.backoff.reconnect_delay` (``min(2**(n-1), 60)`` s ±25 %,
  ``n`` = the number of failed rotations in a row);
* a lost connection counts as the failure of its node, so with a single URL the
  first reconnect waits ~1 s, as before failover existed.

:class:`Rotation` is the pure policy; :class:`Failover` applies it to kombu
connections: it points each one at the URL to try, with TLS options naming that
URL's host (kombu would keep the first host's ``server_hostname`` for every node).
:class:`ConnectionSettings` is how a component reaches the broker, built once and
passed whole (URL(s), heartbeat, TLS, transport options, connection name): each
connection it needs is ``settings.failover(...)``.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from kombu.connection import Connection

from ojs_kombu.amqp.connection import DEFAULT_HEARTBEAT, connect_once, make_connection, tls_options, tls_wanted
from ojs_kombu.amqp.urls import safe_url, split_urls
from ojs_kombu.errors import ValidationError
from ojs_kombu.policy.backoff import reconnect_delay

logger = logging.getLogger(__name__)

# Attributes set on the kombu connections a Failover points: the index of their URL.
_INDEX = "_ojs_failover_index"


class Rotation:
    """The failover policy over ``size`` nodes: the node to try next and the wait before it.

    Thread-safe: the connections of a pool share one rotation; a failure reported
    for a node the rotation has already moved past (another connection found it
    dead first) neither moves it again nor counts.

    Parameters:
        size: the number of nodes (>= 1).
        rand: a function returning a float in [0, 1), for the back-off's jitter.

    Raises:
        ValidationError: ``size`` < 1.
    """

    def __init__(self, size: int, *, rand: Callable[[], float] = random.random):
        if size < 1:
            raise ValidationError(f"a rotation needs at least one node, got {size}")
        self.size = size
        self._rand = rand
        self._index = 0
        self._failures = 0  # consecutive failures since the last success
        self._lock = threading.Lock()

    @property
    def index(self) -> int:
        """The node to connect to next (0-based)."""
        return self._index

    @property
    def failures(self) -> int:
        """Failed attempts and lost connections since the last success."""
        return self._failures

    def failed(self, index: int | None = None) -> float:
        """Record that node ``index`` (default: the current one) failed or was lost; move on.

        Parameters:
            index: the node that failed; if the rotation has moved past it already, nothing changes.

        Returns:
            Seconds to wait before the next attempt: 0 within a rotation, the §9 back-off
            for the number of failed rotations once every node has failed in a row.
        """
        with self._lock:
            if index is not None and index != self._index:
                return 0.0  # stale: that node's failure was counted by whoever saw it first
            self._failures += 1
            self._index = (self._index + 1) % self.size
            if self._failures % self.size:
                return 0.0
            return reconnect_delay(self._failures // self.size, rand=self._rand)

    def succeeded(self) -> None:
        """A connection is up: the next failure starts a new rotation, without back-off."""
        with self._lock:
            self._failures = 0


class Failover:
    """The broker URLs of one client or consumer, applied to its kombu connections.

    Parameters:
        url: one URL or a ``;``-separated failover list (as :func:`~ojs_kombu.amqp.urls.resolve_url` makes it).
        heartbeat, ssl, transport_options, connection_name: as for
            :func:`~ojs_kombu.amqp.connection.make_connection`.
        rand: the back-off's jitter source (tests pin it).

    Raises:
        ValidationError: a bad failover list or ``ssl`` option.
    """

    def __init__(
        self,
        url: str,
        *,
        heartbeat: float,
        ssl: Any,
        transport_options: dict[str, Any] | None,
        connection_name: str,
        rand: Callable[[], float] = random.random,
    ):
        self.urls = tuple(split_urls(url))
        self.rotation = Rotation(len(self.urls), rand=rand)
        self._ssl = ssl
        self._tls = tls_wanted(self.urls[0], ssl)
        self._heartbeat = heartbeat
        self._transport_options = transport_options
        self._connection_name = connection_name
        if self._tls:
            tls_options(ssl, host=None)  # a bad ssl option fails here, not at the first connect

    @property
    def current(self) -> str:
        """The URL the next connection attempt goes to."""
        return self.urls[self.rotation.index]

    def connection(self) -> Connection:
        """A new, unconnected kombu connection to the current URL (clones of it follow the rotation too).

        Returns:
            The connection; :meth:`connect` opens it.
        """
        index = self.rotation.index
        conn = make_connection(
            self.urls[index],
            heartbeat=self._heartbeat,
            ssl=self._ssl,
            transport_options=self._transport_options,
            connection_name=self._connection_name,
        )
        setattr(conn, _INDEX, index)
        return conn

    def connect(self, conn: Connection, *, timeout: float | None = None) -> Any:
        """Point ``conn`` at the current URL, then make one attempt (:func:`connect_once`).

        Parameters:
            conn: a connection made by :meth:`connection` (or a clone of one), not connected.
            timeout: seconds the attempt may take.

        Returns:
            The py-amqp connection.

        Raises:
            as :func:`connect_once`; the caller reports a transient failure with :meth:`failed`.
        """
        self._point(conn)
        return connect_once(conn, timeout=timeout)

    def failed(self, conn: Connection) -> float:
        """``conn``'s attempt failed or its connection was lost: move to the next URL.

        Parameters:
            conn: the connection that failed.

        Returns:
            Seconds to wait before the next attempt (see :meth:`Rotation.failed`).
        """
        return self.rotation.failed(getattr(conn, _INDEX, None))

    def succeeded(self) -> None:
        """A connection is up (and ready): the next loss starts a fresh rotation."""
        self.rotation.succeeded()

    def _point(self, conn: Connection) -> None:
        if len(self.urls) == 1:
            return  # make_connection set it up for its one URL
        index = self.rotation.index
        target = self.urls[index]
        if getattr(conn, _INDEX, None) != index:
            if getattr(conn, _INDEX, None) is not None:
                logger.warning("switching to broker %s", safe_url(target))
            conn.switch(target)
            # kombu keeps the previous node's port when a URL names none: use the URL's (or the default).
            conn.port = urlsplit(target).port
            setattr(conn, _INDEX, index)
        if self._tls:
            # Per attempt: each node is verified against its own name.
            conn.ssl = tls_options(self._ssl, host=urlsplit(target).hostname)


@dataclass(frozen=True)
class ConnectionSettings:
    """How a component reaches the broker: built once from its caller's options, passed whole.

    Parameters:
        url: one URL or a ``;``-separated failover list (resolved: :func:`~ojs_kombu.amqp.urls.resolve_url`).
        heartbeat: AMQP heartbeat in seconds (0: none).
        ssl: TLS (as :class:`~ojs_kombu.client.Client` takes it).
        transport_options: passed to :class:`kombu.Connection`.
        connection_name: shown by the broker (management UI).
        pool_size: at most this many pooled connections (a :class:`~ojs_kombu.client.session.Session`'s).
    """

    url: str
    heartbeat: float = DEFAULT_HEARTBEAT
    ssl: Any = None
    transport_options: dict[str, Any] | None = None
    connection_name: str = "ojs_kombu"
    pool_size: int = 10

    def named(self, connection_name: str) -> ConnectionSettings:
        """The same settings for a connection named ``connection_name``."""
        return replace(self, connection_name=connection_name)

    def failover(self, *, connection_name: str | None = None, heartbeat: float | None = None) -> Failover:
        """A :class:`Failover` over these settings.

        Parameters:
            connection_name: the connection's name instead of :attr:`connection_name`.
            heartbeat: the heartbeat instead of :attr:`heartbeat` (0 for a connection nobody services).

        Raises:
            ValidationError: a bad failover list or ``ssl`` option.
        """
        return Failover(
            self.url,
            heartbeat=self.heartbeat if heartbeat is None else heartbeat,
            ssl=self.ssl,
            transport_options=self.transport_options,
            connection_name=self.connection_name if connection_name is None else connection_name,
        )


__all__ = ["ConnectionSettings", "Failover", "Rotation"]
