"""Broker URLs: which ones to use, how to check a failover list, and how to show them without passwords."""

from __future__ import annotations

import os
from collections.abc import Sequence
from urllib.parse import urlsplit

from kombu.connection import Connection

from ojs_kombu.errors import ValidationError

DEFAULT_URL = "amqp://guest:guest@localhost:5672//"

#: URL schemes that mean TLS.
TLS_SCHEMES = frozenset({"amqps", "ojss"})

#: A URL, a ``;``-separated failover list of URLs, or a list/tuple of URLs.
BrokerUrls = str | Sequence[str]


def _masked(entry: str) -> str:
    """``entry`` with the password replaced by ``**``, even when it is not a well-formed URL."""
    scheme, sep, rest = entry.partition("://")
    if not sep:
        scheme, rest = "", entry
    if "@" not in rest:
        return entry
    userinfo, _, hostpart = rest.rpartition("@")  # rpartition: a password may hold an unescaped '@'
    if ":" not in userinfo:
        return entry
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:**@{hostpart}"


def _check_entry(entry: str, position: int) -> str:
    """The scheme of one failover entry; a malformed entry is a ValidationError naming it (no password)."""
    where = f"broker URL #{position} ({_masked(entry)!r})"
    if not entry:
        raise ValidationError(f"broker URL #{position} of the failover list is empty", field="url")
    scheme, sep, _ = entry.partition("://")
    if not sep or not scheme.isidentifier():
        raise ValidationError(
            f"{where} is not a URL: expected scheme://[user:password@]host[:port][/vhost]", field="url"
        )
    try:
        parts = urlsplit(entry)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0-65535
    except ValueError as exc:
        raise ValidationError(f"{where} is malformed: {exc}", field="url") from None
    if not parts.hostname:
        raise ValidationError(f"{where} names no host", field="url")
    return scheme.lower()


def split_urls(url: BrokerUrls) -> list[str]:
    """The URLs of a failover list, checked.

    Parameters:
        url: one URL, a ``;``-separated list (``"amqp://n1;amqp://n2"``) or a list/tuple of URLs.

    Returns:
        The URLs, in order (a single URL: a list of one, as given).

    Raises:
        ValidationError: an empty list, an empty or malformed entry, or entries mixing TLS
            (``amqps``/``ojss``) and plain schemes, or different transports; the message names
            the entry without its password.
    """
    if isinstance(url, str):
        text = url.strip()
        entries = [part.strip() for part in text.split(";")] if ";" in text else [text]
    elif isinstance(url, Sequence) and all(isinstance(u, str) for u in url):
        entries = [u.strip() for u in url]
    else:
        raise ValidationError(
            f"the broker URL must be a string or a list of strings, not {type(url).__name__} "
            f"of {', '.join(sorted({type(u).__name__ for u in url})) if isinstance(url, Sequence) else '-'}",
            field="url",
        )
    if not entries or entries == [""]:
        raise ValidationError("the broker URL list is empty", field="url")
    if len(entries) == 1:
        return entries  # a single URL is kombu's to parse, as before
    schemes = [_check_entry(entry, i) for i, entry in enumerate(entries, 1)]
    for i, scheme in enumerate(schemes[1:], 2):
        if scheme != schemes[0]:
            kind = "mixes TLS and plain" if (scheme in TLS_SCHEMES) != (schemes[0] in TLS_SCHEMES) else "mixes"
            raise ValidationError(
                f"the failover list {kind} schemes: broker URL #{i} ({_masked(entries[i - 1])!r}) is {scheme}://, "
                f"#1 is {schemes[0]}://; every node must be reached the same way",
                field="url",
            )
    return entries


def resolve_url(url: BrokerUrls | None) -> str:
    """The broker URL: ``url``, else ``$OJS_AMQP_URL``, else the local default.

    Parameters:
        url: a URL, a ``;``-separated failover list or a list/tuple of URLs (see :func:`split_urls`).

    Returns:
        One URL, or the failover list joined with ``;``.

    Raises:
        ValidationError: a bad failover list (see :func:`split_urls`).
    """
    if url is None or (isinstance(url, str) and not url):
        url = os.environ.get("OJS_AMQP_URL") or DEFAULT_URL
    return ";".join(split_urls(url))


def safe_url(url: str) -> str:
    """``url`` (or each URL of a ``;`` failover list) with any password masked, for logs and error messages."""
    if not url:
        return url
    if ";" in url:
        return ";".join(safe_url(part) if part.strip() else part for part in url.split(";"))
    try:
        masked: str = Connection(url).as_uri(include_password=False)
    except Exception:  # noqa: BLE001 - a URL kombu cannot parse is still shown, without its password
        return _masked(url)
    return masked


__all__ = ["DEFAULT_URL", "TLS_SCHEMES", "BrokerUrls", "resolve_url", "safe_url", "split_urls"]
