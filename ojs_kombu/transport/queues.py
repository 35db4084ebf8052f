"""What the transport learnt about a framework's queues: one :class:`QueueMap` per entity prefix.

Every connection of a prefix shares its map (a queue declared on one
connection is routed on another), and the map lives exactly as long as a kombu
connection (its transport) of that prefix does: the registry holds maps
weakly, so a process that talks to many prefixes over time does not keep
a map per prefix forever.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from ojs_kombu.wire.entities import QueueOptions


@dataclass(frozen=True)
class ExchangeDeclaration:
    """A framework's declaration of a direct exchange, held back until something needs the exchange.

    Attributes:
        type: the exchange type (``"direct"``).
        durable, auto_delete, arguments: as the framework declared them.
    """

    type: str
    durable: bool
    auto_delete: bool
    arguments: dict[str, Any] | None


@dataclass
class QueueMap:
    """The job queues of one prefix.

    Attributes:
        queues: framework queue name -> OJS queue name.
        options: OJS queue -> the options it is declared with (from the framework's ``x-*`` arguments).
        arguments: framework queue name -> the arguments it was declared with (to make it a
            plain queue again, see :meth:`Channel.queue_bind <ojs_kombu.transport.channel.Channel.queue_bind>`).
        bindings: ``(exchange, routing_key)`` -> the framework queue bound with it (direct exchanges only).
        exchange_types: exchange name -> type, as declared through the transport.
        deferred_exchanges: durable direct exchanges a framework declared and nothing used yet
            (a task exchange such as Celery's ``celery``: job queues are routed through
            ``ojs.exchange.direct`` instead, so it is only declared when a plain queue is bound
            to it or a message is published to it as it is).
    """

    queues: dict[str, str] = field(default_factory=dict)
    options: dict[str, QueueOptions] = field(default_factory=dict)
    arguments: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    bindings: dict[tuple[str, str], str] = field(default_factory=dict)
    exchange_types: dict[str, str] = field(default_factory=dict)
    deferred_exchanges: dict[str, ExchangeDeclaration] = field(default_factory=dict)

    def forget(self, name: str) -> None:
        """Stop treating framework queue ``name`` as a job queue (its bindings go too)."""
        self.queues.pop(name, None)
        self.arguments.pop(name, None)
        for key in [k for k, v in self.bindings.items() if v == name]:
            del self.bindings[key]


_QUEUE_MAPS: weakref.WeakValueDictionary[str, QueueMap] = weakref.WeakValueDictionary()
_QUEUE_MAPS_LOCK = threading.Lock()


def queue_map(prefix: str) -> QueueMap:
    """The :class:`QueueMap` of ``prefix``, shared by everyone who holds it.

    Parameters:
        prefix: the entity prefix (``""`` for none).

    Returns:
        The live map of ``prefix``, or a new one.  The caller keeps it alive
        (a :class:`~ojs_kombu.transport.transport.Transport` holds its own).
    """
    with _QUEUE_MAPS_LOCK:
        found = _QUEUE_MAPS.get(prefix)
        if found is None:
            found = _QUEUE_MAPS[prefix] = QueueMap()
        return found


def live_prefixes() -> list[str]:
    """The prefixes that currently have a map (for tests and diagnostics)."""
    with _QUEUE_MAPS_LOCK:
        return list(_QUEUE_MAPS.keys())


__all__ = ["ExchangeDeclaration", "QueueMap", "live_prefixes", "queue_map"]
