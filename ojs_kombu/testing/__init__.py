"""Test and demo support: a real RabbitMQ broker on demand, and a management API client.

* :func:`provision_broker` yields a :class:`BrokerHandle` for the broker named by
  ``OJS_AMQP_URL``, a Docker container, or a :class:`PrivateNode` started from the
  local ``rabbitmq-server`` beside any other broker, and tears down what it started.
* :class:`ManagementClient` inspects and cleans up queues, exchanges, bindings and
  connections through the management HTTP API (standard library only).
* ``python -m ojs_kombu.testing.broker {start,stop,url,run}`` does the same from a shell.
"""

from .broker import (
    BrokerError,
    BrokerHandle,
    PrivateNode,
    ensure_rabbitmq_installed,
    mask_url,
    provision_broker,
)
from .management import ManagementClient, ManagementError

__all__ = [
    "BrokerError",
    "BrokerHandle",
    "ManagementClient",
    "ManagementError",
    "PrivateNode",
    "ensure_rabbitmq_installed",
    "mask_url",
    "provision_broker",
]
