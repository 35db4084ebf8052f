"""Broker URLs: which one to use, and how to show it without its password."""

from __future__ import annotations

import os

from kombu.connection import Connection

DEFAULT_URL = "amqp://guest:guest@localhost:5672//"


def resolve_url(url: str | None) -> str:
    """The broker URL: ``url``, else ``$OJS_AMQP_URL``, else the local default."""
    return url or os.environ.get("OJS_AMQP_URL") or DEFAULT_URL


def safe_url(url: str) -> str:
    """``url`` with any password masked, for logs and error messages."""
    if not url:
        return url
    masked: str = Connection(url).as_uri(include_password=False)
    return masked


__all__ = ["DEFAULT_URL", "resolve_url", "safe_url"]
