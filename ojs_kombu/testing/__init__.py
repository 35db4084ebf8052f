"""Test and demo support: a real RabbitMQ broker on demand, and a management API client.

* :func:`provision_broker` yields a :class:`BrokerHandle` for the broker named by
  ``OJS_AMQP_URL``, a Docker container, or a :class:`PrivateNode` started from the
  local ``rabbitmq-server`` beside any other broker, and tears down what it started.
* :class:`ManagementClient` inspects and cleans up queues, exchanges, bindings and
  connections through the management HTTP API (standard library only).
* ``python -m ojs_kombu.testing.broker {start,stop,url,run}`` does the same from a shell.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .broker import (
        BrokerError,
        BrokerHandle,
        PrivateNode,
        ensure_rabbitmq_installed,
        mask_url,
        provision_broker,
    )
    from .management import ManagementClient, ManagementError

# Imported lazily (PEP 562) so that `python -m ojs_kombu.testing.broker` does not load the
# module twice (runpy warns when a package has already imported the module it runs).
_EXPORTS = {
    "BrokerError": ".broker",
    "BrokerHandle": ".broker",
    "PrivateNode": ".broker",
    "ensure_rabbitmq_installed": ".broker",
    "mask_url": ".broker",
    "provision_broker": ".broker",
    "ManagementClient": ".management",
    "ManagementError": ".management",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Load the public names of :mod:`.broker` and :mod:`.management` on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
