"""One message delivered to a consumer of the binding, as the settle path sees it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.headers import strip_death_headers


@dataclass
class Delivery:
    """One message delivered to the consumer, as handed to a handler thread."""

    body: bytes
    properties: dict[str, Any]
    headers: dict[str, Any]
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    queue: str
    generation: int
    received: float = field(default_factory=time.monotonic)

    def outgoing(self, headers: dict[str, Any] | None = None) -> OutgoingMessage:
        """This message for a republish: same body and properties, ``x-death*`` stripped."""
        table = strip_death_headers(self.headers)
        if headers:
            table.update(headers)
        properties = {k: v for k, v in self.properties.items() if k != "application_headers"}
        return OutgoingMessage(self.body, properties, table)


__all__ = ["Delivery"]
