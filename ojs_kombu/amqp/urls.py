"""Broker URLs: which ones to use, how to check a failover list, and how to show them without passwords."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from kombu.connection import Connection

from ojs_kombu.errors import ValidationError

DEFAULT_URL = "amqp://guest:guest@localhost:5672//"

#: What a password is replaced with, in every URL and message the package shows.
MASK = "***"

#: The management API's port when the broker URL does not say otherwise (RabbitMQ's default).
DEFAULT_MANAGEMENT_PORT = 15672

# ``scheme://user:password@``: the password runs from the userinfo's first ':' to the last '@' before
# the path (greedy: a password may hold an unescaped '@').
_URL_USERINFO = re.compile(
    r"(?P<head>\b[a-z][a-z0-9+.\-]*://[^:/@\s]*:)[^\s/]*@",
    re.IGNORECASE,
)

#: URL schemes that mean TLS.
TLS_SCHEMES = frozenset({"amqps", "ojss"})

#: A URL, a ``;``-separated failover list of URLs, or a list/tuple of URLs.
BrokerUrls = str | Sequence[str]


def _masked(entry: str) -> str:
    """``entry`` with the password replaced by :data:`MASK`, even when it is not a well-formed URL."""
    scheme, sep, rest = entry.partition("://")
    if not sep:
        scheme, rest = "", entry
    if "@" not in rest:
        return entry
    userinfo, _, hostpart = rest.rpartition("@")  # rpartition: a password may hold an unescaped '@'
    if ":" not in userinfo:
        return entry
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:{MASK}@{hostpart}"


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` without passwords: the one masking of the package, for logs, errors and pages.

    Every URL's password becomes :data:`MASK` (``amqp://guest:***@host:5672//``, the user
    kept); elsewhere, each of ``secrets`` becomes :data:`MASK` too.  A URL's user name is
    left alone even when it equals a password (``guest:guest``), so a URL always reads
    ``user:***@``.

    Parameters:
        text: any text bound for a log, a terminal or a page.
        secrets: passwords to hide where they appear outside a URL (e.g. quoted by an error).

    Returns:
        The text, safe to show.
    """
    hidden = sorted({s for s in secrets if s}, key=len, reverse=True)

    def outside(part: str) -> str:
        for secret in hidden:
            part = part.replace(secret, MASK)
        return part

    pieces, end = [], 0
    for match in _URL_USERINFO.finditer(text):
        pieces.append(outside(text[end : match.start()]))
        pieces.append(f"{match['head']}{MASK}@")
        end = match.end()
    pieces.append(outside(text[end:]))
    return "".join(pieces)


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
    """``url`` (or each URL of a ``;`` failover list) with any password masked, for logs and error messages.

    Parameters:
        url: a broker URL or failover list.

    Returns:
        The URL as kombu reads it (default port filled in), the password as :data:`MASK`:
        ``amqp://guest:***@localhost:5672//``.
    """
    if not url:
        return url
    if ";" in url:
        return ";".join(safe_url(part) if part.strip() else part for part in url.split(";"))
    try:
        shown: str = Connection(url).as_uri(include_password=False)  # kombu writes "user:**@"
    except Exception:  # noqa: BLE001 - a URL kombu cannot parse is still shown, without its password
        return _masked(url)
    return redact(shown)


def management_url_for(broker_url: str, port: int = DEFAULT_MANAGEMENT_PORT) -> str:
    """The management API a broker URL implies, as rabbitmqadmin and most tools find it.

    The first host of a failover list, over ``http``, on ``port``, with the broker URL's
    user and password (``guest``/``guest`` when it names none).  The vhost is not part of
    the API root: see :func:`vhost_of`.

    Parameters:
        broker_url: a broker URL or ``;``-separated failover list.
        port: the management port (RabbitMQ's default 15672).

    Returns:
        ``http://user:password@host:port/`` (the password in clear: pass it to the
        management client, show it through :func:`redact`).

    Raises:
        ValidationError: the URL names no host.
    """
    first = broker_url.split(";")[0].strip()
    try:
        parts = urlsplit(first)
        host = parts.hostname
    except ValueError as exc:
        raise ValidationError(f"bad broker URL {_masked(first)!r}: {exc}", field="url") from None
    if not host:
        raise ValidationError(f"the broker URL {_masked(first)!r} names no host", field="url")
    user = quote(unquote(parts.username or "guest"), safe="")
    password = quote(unquote(parts.password if parts.password is not None else "guest"), safe="")
    netloc = f"{user}:{password}@{f'[{host}]' if ':' in host else host}:{port}"
    return urlunsplit(("http", netloc, "/", "", ""))


def vhost_of(broker_url: str) -> str:
    """The vhost of a broker URL (the first of a failover list): its path without the ``/``; ``/`` when empty.

    Parameters:
        broker_url: a broker URL or ``;``-separated failover list.

    Returns:
        The vhost, unquoted (``amqp://h//`` and ``amqp://h`` both give ``/``).
    """
    path = urlsplit(broker_url.split(";")[0].strip()).path
    return unquote(path[1:]) if path and path != "/" else "/"


__all__ = [
    "DEFAULT_MANAGEMENT_PORT",
    "DEFAULT_URL",
    "MASK",
    "TLS_SCHEMES",
    "BrokerUrls",
    "management_url_for",
    "redact",
    "resolve_url",
    "safe_url",
    "split_urls",
    "vhost_of",
]
