"""Worker presence (and opt-in job events) of Celery workers on the events stream (DESIGN §14).

:class:`PresenceStep` is a worker bootstep :class:`ojs_celery.Celery` adds: while a
worker runs it publishes its presence every 5 s through an
:class:`ojs_kombu.runtime.presence.Beacon` on a connection of its own (worker id,
host, pid, the OJS queues it consumes, its concurrency and the tasks it runs), and a
last ``offline`` presence when it stops, so ``ojs_kombu.Client.workers()`` lists
Celery workers next to ``ojs_kombu.Worker`` and Dramatiq ones.  With the setting
``ojs_events = True`` the worker's job lifecycle events (:mod:`ojs_celery.lifecycle`)
go to the events stream too (``Client.events``).  Only for a broker on ``ojs://``.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from ojs_kombu.amqp.failover import ConnectionSettings
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.model.naming import ojs_queue_for
from ojs_kombu.runtime.presence import Beacon
from ojs_kombu.transport.state import ConnectionState

from .lifecycle import worker_activity, worker_lifecycle

logger = logging.getLogger(__name__)

#: Setting: also publish the worker's job lifecycle events to the events stream.
EVENTS_SETTING = "ojs_events"
_SCHEMES = {"ojs": "amqp", "ojss": "amqps", "amqp": "amqp", "amqps": "amqps", "pyamqp": "amqp"}


def beacon_url(connection: Any) -> str:
    """The AMQP URL of the app's broker connection, for the beacon's own connection.

    Parameters:
        connection: a kombu ``Connection`` of the app (``app.connection_for_write()``).

    Returns:
        ``amqp://`` (``amqps://`` for ``ojss``) with the connection's host, credentials and vhost.
    """
    uri: str = connection.as_uri(include_password=True)
    scheme, _, rest = uri.partition("://")
    return f"{_SCHEMES.get(scheme, 'amqp')}://{rest}"


class PresenceStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """Worker bootstep: a presence beacon while the worker runs (see the module docstring)."""

    label = "OJS presence"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any):
        super().__init__(worker, **kwargs)
        self.beacon: Beacon | None = None

    def start(self, worker: Any) -> None:
        """Start the beacon (nothing on a broker that is not ``ojs://``)."""
        app = worker.app
        with app.pool.acquire(block=True) as connection:
            state = getattr(connection.connection, "ojs", None)
            if not isinstance(state, ConnectionState):
                return  # a stock AMQP transport: no OJS control plane
            url = beacon_url(connection)
            names = state.names
        queues = sorted({ojs_queue_for(name) for name in app.amqp.queues.consume_from or app.amqp.queues})
        lifecycle = worker_lifecycle()
        self.beacon = Beacon(
            ConnectionSettings(
                url,
                ssl=app.conf.broker_use_ssl or None,
                connection_name=f"ojs_celery worker {lifecycle.worker_id} events",
            ),
            names,
            Topology(names),
            worker_id=lifecycle.worker_id,
            queues=queues,
            concurrency=int(worker.concurrency or 1),
            active=worker_activity().active_jobs,
        )
        if app.conf.get(EVENTS_SETTING):
            lifecycle.subscribe(self.beacon.offer)
        self.beacon.start()

    def stop(self, worker: Any) -> None:
        """Stop the beacon (its last presence says ``offline``)."""
        beacon, self.beacon = self.beacon, None
        if beacon is not None:
            beacon.stop()

    terminate = stop


__all__ = ["EVENTS_SETTING", "PresenceStep", "beacon_url"]
