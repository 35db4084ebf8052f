"""AMQP I/O on kombu / py-amqp: connections, confirmed publishing, frame reading, declarations.

Every use of py-amqp internals lives in this subpackage.
"""

from ojs_kombu.amqp.connection import DEFAULT_HEARTBEAT, connect_once, make_connection, resolve_url, safe_url
from ojs_kombu.amqp.publisher import ConfirmedPublisher, PublishTicket
from ojs_kombu.amqp.topology import Topology

__all__ = [
    "DEFAULT_HEARTBEAT",
    "ConfirmedPublisher",
    "PublishTicket",
    "Topology",
    "connect_once",
    "make_connection",
    "resolve_url",
    "safe_url",
]
