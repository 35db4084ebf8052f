"""Flower's queue views over ``ojs://``: the broker page and ``/api/queues/length`` show the job queues.

Flower picks the client that reads queue lengths from the broker URL's scheme, knows only
``amqp``, ``redis`` and ``sentinel``, and has no way to register another: on ``ojs://`` its
broker page and ``/api/queues/length`` answer ``'amqp' broker is not supported``.
:func:`install` teaches Flower's factory (``flower.utils.broker.Broker``, which every
Flower view calls) the ``ojs://`` and ``ojss://`` schemes: they get :class:`OjsBroker`,
every other URL Flower's own client, as before.  Flower's files are not changed.

:class:`ojs_celery.Celery` installs it in the Flower process by itself (when Flower, having
loaded the app, imports its modules), so ``celery -A proj flower`` needs no option.

:class:`OjsBroker` reports each queue Flower asks for (the workers' ``active_queues``, else
``task_default_queue`` and ``task_queues``) under its Celery name, read from the OJS job
queue the transport maps it to (``Reports_High`` -> ``{prefix}.ojs.queue.reports-high``),
or from the plain AMQP queue of that name when it is not a job queue:

* ``messages_ready`` and ``consumers``: exact and current, from a passive ``Queue.Declare``
  over the broker URL (no management API needed);
* ``messages_unacknowledged`` and ``idle_since``: from the management API (its statistics lag
  up to 5 s), at Flower's ``--broker_api`` when given, else ``$OJS_MANAGEMENT_URL``, else the
  broker URL's host on port 15672 with its credentials; unknown (``None``) when it does not answer;
* ``messages``: ready + unacknowledged (just the ready ones when unacknowledged is unknown).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ojs_kombu.amqp.management import management_client
from ojs_kombu.amqp.urls import redact
from ojs_kombu.client import Client
from ojs_kombu.errors import ManagementError, OjsError, ValidationError
from ojs_kombu.model.naming import Names, ojs_queue_for

logger = logging.getLogger(__name__)

#: The broker URL schemes :class:`OjsBroker` serves.
SCHEMES = frozenset({"ojs", "ojss"})

#: Seconds a read of the queues may spend reaching the broker (Flower's own client allows 1 s to connect, 2 s in all).
READ_TIMEOUT = 2.0

# The path of Flower's --broker_api up to its "/api" segment is the management API's root.
_API_PATH = re.compile(r"^(?P<root>.*?)/api(?:/.*)?$")

# Management API roots already reported unreachable: said once per process, not on every page view.
_reported: set[str] = set()


def management_root(broker_api: str) -> str:
    """The management API's root of a Flower ``--broker_api`` URL.

    Parameters:
        broker_api: Flower's form, ``http://user:password@host:15672/api/`` (a path before
            ``/api`` is kept: a management UI served under a path prefix).

    Returns:
        The root, ``http://user:password@host:15672/`` (credentials kept).
    """
    parts = urlsplit(broker_api)
    match = _API_PATH.match(parts.path)
    path: str = match["root"] if match else parts.path
    return urlunsplit((parts.scheme, parts.netloc, path or "/", "", ""))


class OjsBroker:
    """Flower's broker client for ``ojs://`` / ``ojss://``: the queues' counts under their Celery names.

    Flower makes one per request, as it does its own clients; see the module documentation
    for where each number comes from.

    Parameters:
        broker_url: the app's broker URL with its password (``ojs://user:password@host:5672/vhost``).
        http_api: Flower's ``--broker_api`` (``http://user:password@host:15672/api/``), or None.
        broker_options: the app's ``broker_transport_options`` (``prefix``, ``passthrough_queues``).
        broker_use_ssl: the app's ``broker_use_ssl`` (``ojss://``), as the transport takes it.
    """

    def __init__(
        self,
        broker_url: str,
        http_api: str | None = None,
        *,
        broker_options: Mapping[str, Any] | None = None,
        broker_use_ssl: Any = None,
        **_: Any,
    ) -> None:
        options = broker_options or {}
        self.broker_url = broker_url
        self.names = Names(options.get("prefix") or "")
        self.passthrough = frozenset(options.get("passthrough_queues") or ())
        self.ssl = broker_use_ssl or None
        #: The management API's root; None: derived from the broker URL; "": none.
        self.management_url = management_root(http_api) if http_api else os.environ.get("OJS_MANAGEMENT_URL")
        self._management_origin = (
            "Flower's --broker_api"
            if http_api
            else "$OJS_MANAGEMENT_URL"
            if self.management_url is not None
            else "derived from the broker URL"
        )

    def amqp_queues(self, name: str) -> list[str]:
        """The AMQP queues that may hold Celery queue ``name``'s messages, the OJS job queue first.

        Parameters:
            name: a Celery queue name.

        Returns:
            ``[{prefix}.ojs.queue.{mapped}, name]``; just ``[name]`` for a passthrough queue
            or a name no OJS queue name maps to.
        """
        if name in self.passthrough:
            return [name]
        try:
            return [self.names.job_queue(ojs_queue_for(name)), name]
        except ValidationError:
            return [name]

    async def queues(self, names: Iterable[str]) -> list[dict[str, Any]]:
        """Flower's call: the queues ``names`` that exist, read in Flower's executor (the reads block).

        Parameters:
            names: Celery queue names.

        Returns:
            See :meth:`read`.
        """
        wanted = list(names)
        return await asyncio.get_running_loop().run_in_executor(None, self.read, wanted)

    def read(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """The queues ``names`` that exist, as Flower shows RabbitMQ's.

        Parameters:
            names: Celery queue names.

        Returns:
            One dict per existing queue, in order: ``name`` (the Celery name), ``messages``,
            ``messages_ready``, ``messages_unacknowledged``, ``consumers``, ``idle_since`` and
            ``queue`` (the AMQP queue read).  An empty list when the broker cannot be reached
            (logged), as Flower's own RabbitMQ client does.
        """
        candidates = {name: self.amqp_queues(name) for name in dict.fromkeys(names)}
        try:
            with Client(
                self.broker_url,
                prefix=self.names.prefix,
                ssl=self.ssl,
                publish_timeout=READ_TIMEOUT,
                pool_size=1,
                connection_name="ojs_celery flower",
            ) as client:
                counts = client.queue_counts(q for found in candidates.values() for q in found)
        except OjsError as exc:
            logger.error("Flower: the broker's queues could not be read: %s", redact(str(exc)))
            return []
        present = {
            name: next((q for q in found if counts.get(q) is not None), None) for name, found in candidates.items()
        }
        stats = self._statistics({q for q in present.values() if q is not None})
        rows = []
        for name, queue in present.items():
            count = counts.get(queue) if queue is not None else None
            if queue is None or count is None:
                continue
            stat = stats.get(queue, {})
            unacked = stat.get("messages_unacknowledged")
            rows.append(
                {
                    "name": name,
                    "messages": count.ready + (unacked or 0),
                    "messages_ready": count.ready,
                    "messages_unacknowledged": unacked,
                    "consumers": count.consumers,
                    "idle_since": stat.get("idle_since"),
                    "queue": queue,
                }
            )
        return rows

    def _statistics(self, queues: set[str]) -> dict[str, dict[str, Any]]:
        """The management API's record of each of ``queues`` it knows; ``{}`` when it does not answer."""
        if not queues:
            return {}
        try:
            management = management_client(self.management_url, self.broker_url)
        except ValidationError:
            return {}
        if management is None:
            return {}
        try:
            return {q["name"]: q for q in management.queues() if q.get("name") in queues}
        except ManagementError as exc:
            if management.base_url not in _reported:
                _reported.add(management.base_url)
                logger.warning(
                    "Flower: the management API at %s (%s) did not answer: %s; Unacked and Idle since stay "
                    "empty (set Flower's --broker_api to http://USER:PASSWORD@HOST:PORT/api/)",
                    management.base_url,
                    self._management_origin,
                    redact(str(exc)),
                )
            return {}


def _ojs_broker_new(stock_new: Any) -> Any:
    """A ``__new__`` for Flower's ``Broker`` factory that serves :data:`SCHEMES` with :class:`OjsBroker`."""

    def __new__(cls: type, broker_url: str, *args: Any, **kwargs: Any) -> Any:
        if urlsplit(broker_url).scheme.lower() in SCHEMES:
            return OjsBroker(broker_url, *args, **kwargs)
        return stock_new(cls, broker_url, *args, **kwargs)

    __new__.ojs_stock_new = stock_new  # type: ignore[attr-defined]
    return __new__


def install() -> None:
    """Make Flower read ``ojs://`` / ``ojss://`` brokers' queues with :class:`OjsBroker` (idempotent).

    Flower's ``Broker`` factory class (``flower.utils.broker``) gets a ``__new__`` that hands
    these schemes to :class:`OjsBroker` and every other URL to Flower's own ``__new__``;
    every view that calls the factory sees it, whichever module imported it.

    Raises:
        ImportError: Flower is not installed.
    """
    from flower.utils.broker import Broker

    if not hasattr(Broker.__new__, "ojs_stock_new"):
        Broker.__new__ = staticmethod(_ojs_broker_new(Broker.__new__))


def install_if_loaded(**_: Any) -> bool:
    """:func:`install` when Flower is already imported (a Flower process); a receiver of Celery's ``import_modules``.

    Returns:
        Whether Flower was there.
    """
    if "flower.utils.broker" not in sys.modules:
        return False
    install()
    return True


__all__ = ["READ_TIMEOUT", "SCHEMES", "OjsBroker", "install", "install_if_loaded", "management_root"]
