"""Broker URLs and kombu connections: one way to build and open them (DESIGN §9).

TLS (``amqps://``, ``ojss://`` or an ``ssl`` argument) always verifies the
broker's certificate chain *and* its host name unless told not to:
:func:`tls_options` turns the documented ``ssl`` forms into the options
py-amqp's ``SSLTransport`` takes.  Left to itself, py-amqp checks the chain
with ``ssl=True`` but never the host name (it only does when a
``server_hostname`` is passed), which is what this module fixes.
"""

from __future__ import annotations

import functools
import logging
import ssl as _ssl
from collections.abc import Mapping
from typing import Any

from kombu.connection import Connection

from ojs_kombu.amqp.errors import map_exceptions
from ojs_kombu.amqp.urls import DEFAULT_URL, TLS_SCHEMES, resolve_url, safe_url
from ojs_kombu.errors import ValidationError

logger = logging.getLogger(__name__)

#: AMQP heartbeat in seconds (DESIGN §9).
DEFAULT_HEARTBEAT = 60

# Our keys of the ``ssl`` dict, and py-amqp's ``wrap_socket`` options passed through as they are.
_OWN_KEYS = frozenset({"ca_certs", "certfile", "keyfile", "verify", "server_hostname"})
_PASSED_KEYS = frozenset({"ciphers", "tls_minimum_version", "tls_maximum_version"})
# Keys only py-amqp's own ``wrap_socket`` form has (Celery's ``broker_use_ssl``): such a dict is used as is.
_PY_AMQP_KEYS = frozenset(
    {"cert_reqs", "ssl_version", "server_side", "do_handshake_on_connect", "suppress_ragged_eofs"}
)


@functools.cache
def _warn_unverified() -> None:
    logger.warning("TLS certificate and host name verification is OFF (ssl verify=False): use it only for tests")


def tls_wanted(url: str, ssl: object) -> bool:
    """Whether connections to ``url`` use TLS: an ``ssl`` option, or a TLS scheme in the URL (list)."""
    if ssl is not None and ssl is not False:
        return True
    return any(part.strip().split("://", 1)[0].lower() in TLS_SCHEMES for part in url.split(";") if "://" in part)


def _url_host(url: str) -> str | None:
    """The host of a single broker URL; ``None`` for a failover list (kombu then names each host)."""
    if ";" in url.strip().strip(";"):
        return None
    host: str | None = Connection(url).hostname
    return host or None


def tls_options(ssl: object, *, host: str | None) -> dict[str, Any]:
    """The py-amqp ``ssl`` options for one of the documented ``ssl`` forms.

    Forms:

    * ``True`` (or ``None`` with an ``amqps://`` / ``ojss://`` URL): the system's
      CA certificates; chain and host name verified.
    * a dict with any of ``ca_certs`` (PEM file of the CAs to trust instead of the
      system's), ``certfile`` / ``keyfile`` (a client certificate and its key, for
      brokers that require one), ``server_hostname`` (the name the certificate must
      carry; default: the URL's host) and ``verify`` (default ``True``; ``False``
      turns off chain *and* host name checks, logged once at WARNING).
      ``ciphers``, ``tls_minimum_version`` and ``tls_maximum_version`` pass to py-amqp.
    * py-amqp's own options (a dict with ``cert_reqs`` ..., as Celery's ``broker_use_ssl``):
      used as they are, with ``server_hostname`` added unless ``cert_reqs`` is ``CERT_NONE``.

    Parameters:
        ssl: ``True``, ``None`` or the dict above.
        host: the broker's host name, checked against its certificate; ``None`` lets
            kombu fill in each host of a failover list.

    Returns:
        py-amqp ``SSLTransport`` options (``cert_reqs``, ``server_hostname`` ...).

    Raises:
        ValidationError: an unknown key, a non-bool ``verify``, an ``ssl.SSLContext``
            (py-amqp 5 cannot take one: use the dict) or any other type.
    """
    if isinstance(ssl, _ssl.SSLContext):
        raise ValidationError(
            "ssl: py-amqp cannot use an ssl.SSLContext; pass a dict "
            "{'ca_certs': ..., 'certfile': ..., 'keyfile': ..., 'server_hostname': ..., 'verify': ...}"
        )
    if ssl is None or ssl is True:
        given: Mapping[str, Any] = {}
    elif isinstance(ssl, Mapping):
        given = ssl
    else:
        raise ValidationError(f"ssl must be True, None or a dict, not {type(ssl).__name__}")
    if set(given) & _PY_AMQP_KEYS:
        raw = dict(given)
        if raw.get("cert_reqs", _ssl.CERT_REQUIRED) != _ssl.CERT_NONE:
            raw.setdefault("server_hostname", host)
        return raw
    unknown = sorted(set(given) - _OWN_KEYS - _PASSED_KEYS)
    if unknown:
        raise ValidationError(f"ssl: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(_OWN_KEYS))}")
    verify = given.get("verify", True)
    if not isinstance(verify, bool):
        raise ValidationError(f"ssl: verify must be True or False, not {verify!r}")
    options: dict[str, Any] = {k: given[k] for k in _PASSED_KEYS | {"ca_certs", "certfile", "keyfile"} if given.get(k)}
    if verify:
        options["cert_reqs"] = _ssl.CERT_REQUIRED
        # py-amqp turns check_hostname on exactly when server_hostname is set; None: kombu sets it per host.
        options["server_hostname"] = given.get("server_hostname") or host
    else:
        _warn_unverified()
        options["cert_reqs"] = _ssl.CERT_NONE
        options.pop("ca_certs", None)
        # No server_hostname: py-amqp would turn check_hostname on, which CERT_NONE forbids.
    return options


def transport_tls_options(ssl: object) -> object:
    """The ``ssl`` a kombu TLS transport (``ojss://``) should use when it was given ``ssl`` directly.

    Celery hands ``broker_use_ssl`` to kombu without :func:`make_connection`: ``True``,
    nothing, or a dict become options as :func:`tls_options` makes them, the host name
    left to kombu (which fills in the host connected to).  Options :func:`make_connection`
    built are kept as they are.

    Parameters:
        ssl: the kombu connection's ``ssl``.

    Returns:
        The options for py-amqp.

    Raises:
        ValidationError: as for :func:`tls_options`.
    """
    return tls_options(True if ssl is None or isinstance(ssl, bool) else ssl, host=None)


def make_connection(
    url: str, *, heartbeat: float, ssl: Any, transport_options: dict[str, Any] | None, connection_name: str
) -> Connection:
    """An unconnected kombu connection.

    Parameters:
        url: the broker URL (or a ``;``-separated failover list).
        heartbeat: AMQP heartbeat in seconds.
        ssl: ``None``/``False`` (TLS only for ``amqps://`` / ``ojss://``), ``True`` or a dict:
            see :func:`tls_options`.  TLS verifies the chain and the host name by default.
        transport_options: kombu transport options; ``connection_name`` shows in the
            management UI unless they already carry ``client_properties``.
        connection_name: the connection's name for the broker.

    Returns:
        The kombu connection, not yet connected.

    Raises:
        ValidationError: a bad ``ssl`` option.
    """
    options = dict(transport_options or {})
    options.setdefault("client_properties", {"connection_name": connection_name})
    if tls_wanted(url, ssl):
        ssl = tls_options(ssl, host=_url_host(url))
    return Connection(url, heartbeat=heartbeat, ssl=ssl, transport_options=options)


def connect_once(conn: Connection, *, timeout: float | None = None) -> Any:
    """Make one connection attempt, without kombu's own retries and sleeps.

    The caller owns the back-off (DESIGN §9); kombu's ``connect()`` would add a
    fixed 2 s retry of its own to every attempt.  After a failure the next URL
    of a failover list is selected for the next attempt.

    Parameters:
        conn: the kombu connection to open.
        timeout: seconds the TCP connect and AMQP handshake may take (default: the
            connection's ``connect_timeout``, 5 s); a retry budget passes what is left of it.

    Returns:
        The py-amqp connection.

    Raises:
        AccessRefusedError: the broker refused the login or the virtual host (permanent).
        TlsVerificationError: the broker's TLS certificate failed verification (permanent).
        OSError, amqp.ConnectionError: a transient failure, for the caller's back-off.
    """
    if timeout is not None:
        conn.connect_timeout = max(0.05, timeout)  # type: ignore[assignment]  # kombu: int default, float use
    with map_exceptions(url=conn.as_uri()):
        try:
            return conn.ensure_connection(max_retries=0, reraise_as_library_errors=False)
        except conn.recoverable_connection_errors:
            conn.maybe_switch_next()
            raise


def close_quietly(closable: Any) -> None:
    """Close a py-amqp channel (or anything with ``close()``), ignoring every error.

    For clean-up paths: the broker may already have closed it, or the connection may be gone.

    Parameters:
        closable: the channel to close.
    """
    try:
        closable.close()
    except Exception:  # noqa: BLE001 - closing something already broken must not raise
        pass


__all__ = [
    "DEFAULT_HEARTBEAT",
    "DEFAULT_URL",
    "TLS_SCHEMES",
    "close_quietly",
    "connect_once",
    "make_connection",
    "resolve_url",
    "safe_url",
    "tls_options",
    "tls_wanted",
    "transport_tls_options",
]
