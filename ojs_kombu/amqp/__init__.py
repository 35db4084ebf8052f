"""AMQP I/O on kombu / py-amqp: connections, confirmed publishing, frame reading, one ordered write path
per connection (:mod:`ojs_kombu.amqp.outbox`), declarations, unique locks, workflow fan-in; and the
broker's management HTTP API (:mod:`ojs_kombu.amqp.management`).

Every use of py-amqp internals lives in this subpackage, and so does the one
place where py-amqp / kombu exceptions become :mod:`ojs_kombu.errors`
(:mod:`ojs_kombu.amqp.errors`).
"""

from ojs_kombu.amqp.connection import DEFAULT_HEARTBEAT, connect_once, make_connection, resolve_url, safe_url
from ojs_kombu.amqp.errors import is_permanent, map_exception, map_exceptions, raise_if_permanent
from ojs_kombu.amqp.failover import ConnectionSettings
from ojs_kombu.amqp.fanin import FanIn, Pending, Ready
from ojs_kombu.amqp.info import INFO_SETTLE_WINDOW, ask_info, best_answer, publish_control
from ojs_kombu.amqp.locks import Acquired, Held, UniqueLocks
from ojs_kombu.amqp.management import ManagementClient
from ojs_kombu.amqp.outbox import Outbox, outbox
from ojs_kombu.amqp.permits import Permit, Permits, PermitState
from ojs_kombu.amqp.publisher import ConfirmedPublisher, PublishTicket
from ojs_kombu.amqp.topology import OnConflict, Topology
from ojs_kombu.amqp.version import parse_version, rabbitmq_version

__all__ = [
    "DEFAULT_HEARTBEAT",
    "INFO_SETTLE_WINDOW",
    "Acquired",
    "ask_info",
    "best_answer",
    "publish_control",
    "ConfirmedPublisher",
    "ConnectionSettings",
    "FanIn",
    "ManagementClient",
    "Held",
    "OnConflict",
    "Outbox",
    "Pending",
    "Permit",
    "PermitState",
    "Permits",
    "PublishTicket",
    "Ready",
    "Topology",
    "UniqueLocks",
    "connect_once",
    "is_permanent",
    "make_connection",
    "outbox",
    "map_exception",
    "map_exceptions",
    "parse_version",
    "rabbitmq_version",
    "raise_if_permanent",
    "resolve_url",
    "safe_url",
]
