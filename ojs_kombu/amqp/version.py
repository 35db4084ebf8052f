"""The RabbitMQ version of a connection's broker, for behaviour that differs between versions.

The broker tells it in the server properties of ``Connection.Start`` (``product`` and
``version``), which py-amqp keeps as ``Connection.server_properties``: no round trip.
"""

from __future__ import annotations

import re
from typing import Any

Version = tuple[int, int, int]
"""A version as ``(major, minor, patch)``, e.g. ``(4, 3, 6)``: compare it with tuples (``>= (4, 3)``)."""

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | bytes | None) -> Version | None:
    """``(major, minor, patch)`` of a version string such as ``"4.3.6"`` or ``"4.0.0-rc.1"``.

    Parameters:
        text: the version as the broker (or its management API) writes it.

    Returns:
        The version (a missing patch number is 0), or ``None`` when ``text`` does not start with one.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    match = _VERSION.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def rabbitmq_version(connection: Any) -> Version | None:
    """The RabbitMQ version of the broker at the other end of ``connection``.

    Parameters:
        connection: an open py-amqp ``Connection`` (anything with ``server_properties``; for a kombu
            connection, pass its ``.connection``).

    Returns:
        The version, or ``None`` when the server is not RabbitMQ (another AMQP 0-9-1 broker) or
        does not say.
    """
    properties = getattr(connection, "server_properties", None) or {}
    product = properties.get("product")
    if isinstance(product, bytes):
        product = product.decode("utf-8", "replace")
    if product != "RabbitMQ":
        return None
    return parse_version(properties.get("version"))


__all__ = ["Version", "parse_version", "rabbitmq_version"]
