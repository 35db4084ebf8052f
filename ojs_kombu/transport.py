"""The ``ojs://`` / ``ojss://`` kombu transports.

Importing :mod:`ojs_kombu` registers the aliases, so ``kombu.Connection("ojs://…")``
and Celery's ``broker_url="ojs://…"`` resolve to these classes; the config-only
path is ``broker_transport="ojs_kombu.transport:Transport"``.

For now the transports are py-amqp's, with the OJS defaults (heartbeat 60 s,
publisher confirms on); the Celery adapter fills in the OJS wire mapping.
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES, pyamqp

DEFAULT_HEARTBEAT = 60


class Transport(pyamqp.Transport):
    """``ojs://``: AMQP 0-9-1 over py-amqp with the binding's defaults."""

    driver_name = "ojs"

    def __init__(self, client, **kwargs):
        client.transport_options.setdefault("confirm_publish", True)
        if not client.heartbeat:
            client.heartbeat = DEFAULT_HEARTBEAT
        super().__init__(client, **kwargs)


class SSLTransport(Transport):
    """``ojss://``: the same over TLS (port 5671 by default)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.client.ssl:  # TLS on unless the caller passed its own ssl options
            self.client.ssl = True


def register_aliases() -> None:
    """Register ``ojs`` and ``ojss`` in kombu's transport alias table (idempotent)."""
    TRANSPORT_ALIASES.setdefault("ojs", "ojs_kombu.transport:Transport")
    TRANSPORT_ALIASES.setdefault("ojss", "ojs_kombu.transport:SSLTransport")


__all__ = ["SSLTransport", "Transport", "register_aliases"]
