"""The ``ojs://`` / ``ojss://`` kombu transports (see :mod:`ojs_kombu.transport.channel`).

``broker_transport="ojs_kombu.transport:Transport"`` names the transport class.
"""

from ojs_kombu.transport.channel import (
    Channel,
    Connection,
    QueueMap,
    Settings,
    SSLTransport,
    TaskCodec,
    Transport,
    queue_map,
    register_aliases,
)

__all__ = [
    "Channel",
    "Connection",
    "QueueMap",
    "SSLTransport",
    "Settings",
    "TaskCodec",
    "Transport",
    "queue_map",
    "register_aliases",
]
