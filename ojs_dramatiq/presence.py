"""Worker presence (and opt-in job events) of Dramatiq workers on the events stream (DESIGN §14).

:class:`OjsPresence` is a middleware :class:`~ojs_dramatiq.broker.OjsBroker` adds
itself: when a Dramatiq worker boots it starts an :class:`ojs_kombu.runtime.presence.Beacon`
(every 5 s: worker id, host, pid, the OJS queues the worker consumes, its worker
threads, the messages they run), and stops it, with a last ``offline`` presence,
when the worker shuts down.  ``ojs_kombu.Client.workers()`` then lists Dramatiq
workers next to ``ojs_kombu.Worker`` ones.  With ``OjsBroker(events=True)`` the
broker's job lifecycle events go to the events stream too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

from ojs_kombu.runtime.lifecycle import JobEvent
from ojs_kombu.runtime.presence import Beacon


class OjsPresence(Middleware):
    """Starts a :class:`~ojs_kombu.runtime.presence.Beacon` per booted Dramatiq worker.

    Parameters:
        beacon_for: builds the beacon of a booted worker (``dramatiq.Worker``); the broker's.
    """

    def __init__(self, beacon_for: Callable[[Any], Beacon]):
        self._beacon_for = beacon_for
        self._beacons: dict[int, Beacon] = {}  # id(dramatiq worker) -> its beacon
        self._lock = threading.Lock()

    def after_worker_boot(self, broker: Broker, worker: Any) -> None:
        """Start the worker's beacon."""
        beacon = self._beacon_for(worker)
        with self._lock:
            self._beacons[id(worker)] = beacon
        beacon.start()

    def before_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        """Stop the worker's beacon (its last presence says ``offline``)."""
        with self._lock:
            beacon = self._beacons.pop(id(worker), None)
        if beacon is not None:
            beacon.stop()

    def offer(self, event: JobEvent) -> None:
        """A lifecycle subscriber (``OjsBroker(events=True)``): hand ``event`` to the running beacons."""
        with self._lock:
            beacons = list(self._beacons.values())
        for beacon in beacons:
            beacon.offer(event)


__all__ = ["OjsPresence"]
