"""A small client for the RabbitMQ management HTTP API: ``ojs-amqp status``, the dashboard, tests.

It uses only the standard library (the API is plain JSON over HTTP).  Every call
is scoped to one virtual host (``/`` by default).

The management API's counters (``messages``, ``messages_ready``,
``consumers`` ...) come from periodic statistics samples and lag behind the
broker by up to one sample interval (5 s by default, 1 s on a
:class:`~ojs_kombu.testing.broker.PrivateNode`); a queue declared a moment ago
has no counters at all yet.  Use :meth:`ManagementClient.wait_for_queue`
rather than asserting on one sample.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from ojs_kombu.amqp.urls import management_url_for, vhost_of
from ojs_kombu.errors import ManagementError

__all__ = ["ManagementClient", "ManagementError"]


def _quote(segment: str) -> str:
    # Names may contain "/", spaces, "->" (connection names) ...; the vhost "/" becomes "%2F".
    return quote(segment, safe="")


def _starts_with(prefix: str | None) -> Callable[[dict[str, Any]], bool]:
    return lambda item: prefix is None or str(item.get("name", "")).startswith(prefix)


#: How many times :meth:`ManagementClient.request` sends a GET that the broker answers 500.
GET_ATTEMPTS = 4


class ManagementClient:
    """Client for one virtual host of a RabbitMQ management API.

    ``base_url`` is the API's root, e.g. ``http://127.0.0.1:15672``.
    """

    def __init__(
        self,
        base_url: str,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        *,
        timeout: float = 10.0,
    ):
        self.base_url = base_url.rstrip("/")
        self.user = user
        self.vhost = vhost
        self.timeout = timeout
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        self._auth_header = f"Basic {token}"

    def __repr__(self) -> str:
        return f"ManagementClient({self.base_url!r}, user={self.user!r}, vhost={self.vhost!r})"

    # -- plumbing ---------------------------------------------------------

    def request(
        self, method: str, path: str, *, headers: dict[str, str] | None = None, body: dict[str, Any] | None = None
    ) -> Any:
        """Send ``method path`` (``path`` starts with ``/api``) and return the decoded JSON body.

        ``body``, when given, is sent as JSON.  Returns ``None`` for an empty
        body; raises :class:`ManagementError` for any non-2xx answer or
        transport failure.

        A ``GET`` answered 500 is asked again (up to :data:`GET_ATTEMPTS` times):
        RabbitMQ 3.10 fails a whole listing (``/api/queues``) with a ``badarg`` in
        ``rabbit_amqqueue_process:format/1`` when it meets a queue being declared,
        whose record has no process yet (``node(none)``); the next listing succeeds.
        """
        for attempt in range(1, GET_ATTEMPTS + 1):
            try:
                return self._request_once(method, path, headers=headers, body=body)
            except ManagementError as exc:
                if method != "GET" or exc.status != 500 or attempt == GET_ATTEMPTS:
                    raise
                time.sleep(0.05 * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _request_once(
        self, method: str, path: str, *, headers: dict[str, str] | None, body: dict[str, Any] | None
    ) -> Any:
        data = json.dumps(body).encode("utf-8") if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Authorization", self._auth_header)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                answer: bytes = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            raise ManagementError(
                f"{method} {path} -> HTTP {exc.code}: {detail}", status=exc.code, method=method, path=path
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ManagementError(
                f"{method} {self.base_url}{path} failed: {reason}", method=method, path=path
            ) from None
        return json.loads(answer) if answer.strip() else None

    def _get_or_none(self, path: str) -> Any:
        try:
            return self.request("GET", path)
        except ManagementError as exc:
            if exc.status == 404:
                return None
            raise

    def _delete(self, path: str, headers: dict[str, str] | None = None) -> bool:
        try:
            self.request("DELETE", path, headers=headers)
        except ManagementError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    @property
    def _vh(self) -> str:
        return _quote(self.vhost)

    # -- read -------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        """``GET /api/overview``: versions, listeners, global counters."""
        overview: dict[str, Any] = self.request("GET", "/api/overview")
        return overview

    def queue(self, name: str) -> dict[str, Any] | None:
        """The queue ``name`` (``durable``, ``arguments``, ``messages``, ``consumers`` ...), or ``None``.

        The counters are missing until the queue's first statistics sample.
        """
        queue: dict[str, Any] | None = self._get_or_none(f"/api/queues/{self._vh}/{_quote(name)}")
        return queue

    def exchange(self, name: str) -> dict[str, Any] | None:
        """The exchange ``name`` (``type``, ``durable``, ``arguments`` ...), or ``None``."""
        exchange: dict[str, Any] | None = self._get_or_none(f"/api/exchanges/{self._vh}/{_quote(name)}")
        return exchange

    def queues(self, prefix: str | None = None) -> list[dict[str, Any]]:
        """Every queue of the vhost, optionally only those whose name starts with ``prefix``."""
        queues: list[dict[str, Any]] = self.request("GET", f"/api/queues/{self._vh}")
        return list(filter(_starts_with(prefix), queues))

    def exchanges(self, prefix: str | None = None) -> list[dict[str, Any]]:
        """Every exchange of the vhost (the default exchange is named ``""``), optionally by ``prefix``."""
        exchanges: list[dict[str, Any]] = self.request("GET", f"/api/exchanges/{self._vh}")
        return list(filter(_starts_with(prefix), exchanges))

    def bindings(self, source: str | None = None, destination: str | None = None) -> list[dict[str, Any]]:
        """Bindings of the vhost, optionally only those from ``source`` and/or to ``destination``.

        Each binding has ``source``, ``destination``, ``destination_type``
        (``"queue"`` or ``"exchange"``), ``routing_key`` and ``arguments``.
        """
        return [
            b
            for b in self.request("GET", f"/api/bindings/{self._vh}")
            if (source is None or b["source"] == source) and (destination is None or b["destination"] == destination)
        ]

    def connections(self) -> list[dict[str, Any]]:
        """Client connections to the vhost; each has a ``name`` usable with :meth:`close_connection`."""
        connections: list[dict[str, Any]] = self.request("GET", f"/api/vhosts/{self._vh}/connections")
        return connections

    def channels(self) -> list[dict[str, Any]]:
        """Channels of the vhost; each has ``confirm`` (publisher confirms on), ``prefetch_count``,
        and ``connection_details``."""
        channels: list[dict[str, Any]] = self.request("GET", f"/api/vhosts/{self._vh}/channels")
        return channels

    def wait_for_queue(
        self,
        name: str,
        predicate: Callable[[dict[str, Any] | None], bool] = lambda q: q is not None,
        timeout: float = 15.0,
        interval: float = 0.25,
    ) -> dict[str, Any] | None:
        """Poll :meth:`queue` until ``predicate(queue_or_None)`` is true; return that sample.

        The management statistics lag, so use this rather than one
        :meth:`queue` call, e.g.
        ``wait_for_queue("q", lambda q: q is not None and q.get("messages") == 3)``.
        Raises :class:`TimeoutError` (with the last sample) when ``timeout`` passes.
        """
        deadline = time.monotonic() + timeout
        while True:
            sample = self.queue(name)
            if predicate(sample):
                return sample
            if time.monotonic() >= deadline:
                raise TimeoutError(f"queue {name!r} did not reach the expected state in {timeout}s; last: {sample!r}")
            time.sleep(interval)

    # -- write ------------------------------------------------------------

    def delete_queue(self, name: str) -> bool:
        """Delete the queue ``name``; return ``False`` if it did not exist."""
        return self._delete(f"/api/queues/{self._vh}/{_quote(name)}")

    def delete_exchange(self, name: str) -> bool:
        """Delete the exchange ``name``; return ``False`` if it did not exist."""
        return self._delete(f"/api/exchanges/{self._vh}/{_quote(name)}")

    def delete_by_prefix(self, prefix: str) -> int:
        """Delete every queue and exchange whose name starts with ``prefix``; return how many.

        ``prefix`` must not be empty, and the built-in ``amq.*`` exchanges are
        never touched (the broker refuses to delete them).
        """
        if not prefix:
            raise ValueError("delete_by_prefix needs a non-empty prefix")
        deleted = sum(self.delete_queue(q["name"]) for q in self.queues(prefix))
        deleted += sum(
            self.delete_exchange(e["name"]) for e in self.exchanges(prefix) if not e["name"].startswith("amq.")
        )
        return deleted

    def close_connection(self, name: str, reason: str = "closed by ojs_kombu") -> bool:
        """Force-close the client connection ``name`` (simulates a dropped connection).

        Returns ``False`` if no such connection exists.
        """
        return self._delete(f"/api/connections/{_quote(name)}", headers={"X-Reason": reason})

    # -- users, virtual hosts, permissions (node-wide) ----------------------------------------------

    def create_vhost(self, name: str) -> None:
        """Create the virtual host ``name`` (no-op if it exists).  No user gets permissions on it."""
        self.request("PUT", f"/api/vhosts/{_quote(name)}", body={})

    def delete_vhost(self, name: str) -> bool:
        """Delete the virtual host ``name`` and everything in it; ``False`` if it did not exist."""
        return self._delete(f"/api/vhosts/{_quote(name)}")

    def create_user(self, name: str, password: str, *, tags: str = "") -> None:
        """Create (or update) the user ``name``; no permissions on any virtual host yet."""
        self.request("PUT", f"/api/users/{_quote(name)}", body={"password": password, "tags": tags})

    def delete_user(self, name: str) -> bool:
        """Delete the user ``name``; ``False`` if it did not exist."""
        return self._delete(f"/api/users/{_quote(name)}")

    def set_permissions(
        self, user: str, *, configure: str = ".*", write: str = ".*", read: str = ".*", vhost: str | None = None
    ) -> None:
        """Grant ``user`` the permissions (regular expressions over resource names) on ``vhost``
        (default: this client's virtual host); ``"^$"`` denies all of a kind."""
        path = f"/api/permissions/{_quote(vhost if vhost is not None else self.vhost)}/{_quote(user)}"
        self.request("PUT", path, body={"configure": configure, "write": write, "read": read})


class Management(ManagementClient):
    """A :class:`ManagementClient` that knows where its URL came from, for the messages when it does not answer.

    Parameters:
        base_url, user, password, vhost: as for :class:`ManagementClient`.
        derived: the URL was derived from the broker URL (none was given).
    """

    def __init__(self, base_url: str, user: str, password: str, vhost: str, *, derived: bool) -> None:
        super().__init__(base_url, user, password, vhost, timeout=5.0)
        self.derived = derived

    def unreachable(self, exc: ManagementError) -> str:
        """What to say when the API did not answer: which URL was tried, why, and what to set."""
        if self.derived:
            origin = "derived from the broker URL"
            advice = "set --management-url or $OJS_MANAGEMENT_URL to its root (e.g. http://HOST:15672)"
        else:
            origin = "from --management-url or $OJS_MANAGEMENT_URL"
            advice = "check --management-url or $OJS_MANAGEMENT_URL"
        return f"the management API at {self.base_url} ({origin}) did not answer: {exc}; {advice}"


def management_client(management_url: str | None, broker_url: str) -> Management | None:
    """The management API client of a command or of the dashboard.

    Parameters:
        management_url: the API root given (``--management-url``, ``$OJS_MANAGEMENT_URL``); None:
            derived from the broker URL (:func:`~ojs_kombu.amqp.urls.management_url_for`: its
            first host, ``http``, port 15672, its user and password); ``""``: no management API.
        broker_url: the broker URL (or failover list); its vhost is the API's.

    Returns:
        The client (credentials: the management URL's own, else the broker URL's, else
        guest/guest), or None for ``""``.

    Raises:
        ValidationError: the broker URL names no host (only when the URL is derived).
    """
    derived = management_url is None
    if management_url is None:
        management_url = management_url_for(broker_url)
    if not management_url:
        return None
    parts = urlsplit(management_url)
    broker = urlsplit(broker_url.split(";")[0].strip())
    user = unquote(parts.username or broker.username or "guest")
    password = unquote(parts.password or broker.password or "guest")
    host = (f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or "") + (
        f":{parts.port}" if parts.port else ""
    )
    base = urlunsplit((parts.scheme, host, parts.path, "", ""))  # without the credentials
    return Management(base, user, password, vhost_of(broker_url), derived=derived)
