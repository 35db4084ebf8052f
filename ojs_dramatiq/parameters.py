"""``RabbitmqBroker``'s connection forms (pika parameters) as the AMQP URL ``OjsBroker`` connects to.

``RabbitmqBroker(host="rabbit", port=5672, credentials=pika.PlainCredentials("u", "p"))`` and
``RabbitmqBroker(parameters=[{"host": "a"}, {"host": "b"}])`` describe the broker with pika's
``ConnectionParameters``; ``ojs_kombu`` connects with py-amqp through kombu, which takes a URL
(``;``-separated URLs fail over in order).  :func:`url_for_parameters` translates what has a
URL equivalent and refuses the rest with a message naming the supported form.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ojs_kombu.amqp.urls import BrokerUrls
from ojs_kombu.wire.entities import QueueOptions

#: pika connection parameters with a URL equivalent.
TRANSLATED = ("host", "port", "virtual_host", "credentials", "heartbeat")

#: pika connection parameters ``OjsBroker`` cannot honour, and what to use instead.
REFUSED: dict[str, str] = {
    "ssl_options": "use url='amqps://…' with ssl={…} (py-amqp's SSL options: ca_certs, certfile, keyfile, "
    "cert_reqs, server_hostname); a pika SSLOptions object has no py-amqp equivalent",
    "connection_attempts": "use connect_retries= (attempts after a connection error, with back-off)",
    "retry_delay": "the back-off between attempts is 1, 2, 4 … s (±25 %); use connect_retries=",
    "blocked_connection_timeout": "use confirm_timeout= (seconds to wait for the broker's publisher confirms)",
    "client_properties": "use connection_name= or transport_options={'client_properties': {…}}",
    "socket_timeout": "not supported",
    "stack_timeout": "not supported",
    "channel_max": "not supported",
    "frame_max": "not supported",
    "locale": "not supported",
    "tcp_options": "not supported",
}

#: The keyword arguments of ``OjsBroker`` that are pika connection parameters (``heartbeat``
#: is also a kombu option, so it is handled apart).
PIKA_KEYWORDS = frozenset(TRANSLATED) - {"heartbeat"} | frozenset(REFUSED)

_DEFAULT_HOST = "localhost"
_DEFAULT_PORT = 5672
_DEFAULT_VHOST = "/"
_SUPPORTED = "url='amqp://user:password@host:5672/%2F' or host=, port=, virtual_host=, credentials=, heartbeat="


@dataclass(frozen=True)
class Translation:
    """An AMQP URL (``;``-separated for a failover list) and the heartbeat the parameters gave."""

    url: str
    heartbeat: float | None


def url_for_parameters(parameters: Sequence[Any] | Any | None = None, **options: Any) -> Translation:
    """Translate ``RabbitmqBroker``'s ``parameters=`` or pika keyword arguments into an AMQP URL.

    Parameters:
      parameters: a list of dicts of pika ``ConnectionParameters`` keyword arguments, or of
        ``pika.ConnectionParameters`` / ``pika.URLParameters`` objects (one of either is taken as a
        list of one); several give a failover list, tried in order.
      **options: pika keyword arguments (``host``, ``port``, ``virtual_host``, ``credentials``,
        ``heartbeat``), when ``parameters`` is not given.

    Returns:
      The :class:`Translation`: the URL (credentials and virtual host quoted) and the heartbeat,
      ``None`` when none was given.

    Raises:
      TypeError: for a parameter that has no URL equivalent (``ssl_options``, ``connection_attempts``,
        ... the message says what to use instead), for non-password credentials, or for ``parameters``
        together with keyword arguments.
      ValueError: for an empty ``parameters`` list, a bad port, or different heartbeats.
    """
    if parameters is None:
        entries = [_from_mapping(options)]
    else:
        if options:
            raise TypeError(
                f"OjsBroker(parameters=…) cannot be combined with pika keyword arguments ({', '.join(sorted(options))})"
            )
        if isinstance(parameters, Mapping) or not isinstance(parameters, Sequence):
            parameters = [parameters]
        if not parameters:
            raise ValueError("OjsBroker(parameters=[]) names no broker: give at least one set of parameters")
        entries = [_from_mapping(p) if isinstance(p, Mapping) else _from_pika_object(p) for p in parameters]
    heartbeats = {heartbeat for _, heartbeat in entries if heartbeat is not None}
    if len(heartbeats) > 1:
        raise ValueError(f"the parameters give different heartbeats ({sorted(heartbeats)}); OjsBroker has one")
    return Translation(";".join(url for url, _ in entries), heartbeats.pop() if heartbeats else None)


def refuse_untranslatable(names: Iterable[str]) -> None:
    """Refuse the pika parameters among ``names`` that ``OjsBroker`` cannot honour.

    Parameters:
      names: keyword argument names.

    Raises:
      TypeError: naming the first such parameter and what to use instead.
    """
    for name in names:
        if name in REFUSED:
            raise TypeError(f"OjsBroker cannot honour the pika parameter {name}=: {REFUSED[name]}")


def _from_mapping(options: Mapping[str, Any]) -> tuple[str, float | None]:
    refuse_untranslatable(options)
    for name in options:
        if name not in TRANSLATED:
            raise TypeError(f"unknown pika connection parameter {name!r}; OjsBroker takes {_SUPPORTED}")
    return _url(
        options.get("host", _DEFAULT_HOST),
        options.get("port", _DEFAULT_PORT),
        options.get("virtual_host", _DEFAULT_VHOST),
        options.get("credentials"),
    ), _heartbeat(options.get("heartbeat"))


def _from_pika_object(parameters: Any) -> tuple[str, float | None]:
    """A ``pika.ConnectionParameters`` (or ``URLParameters``): every setting but the translated ones
    must be pika's default, or it would be silently dropped."""
    try:
        import pika
    except ImportError:  # no pika: this cannot be a pika object
        pika = None
    if pika is None or not isinstance(parameters, pika.connection.Parameters):
        raise TypeError(
            f"OjsBroker(parameters=…) takes dicts of pika keyword arguments or pika.ConnectionParameters, "
            f"not {type(parameters).__name__}"
        )
    defaults = pika.ConnectionParameters()
    for name in REFUSED:
        if getattr(parameters, name) != getattr(defaults, name):
            raise TypeError(f"OjsBroker cannot honour the pika parameter {name}: {REFUSED[name]}")
    return _url(parameters.host, parameters.port, parameters.virtual_host, parameters.credentials), _heartbeat(
        parameters.heartbeat
    )


def _url(host: Any, port: Any, virtual_host: Any, credentials: Any) -> str:
    if not isinstance(host, str) or not host:
        raise TypeError(f"host must be a non-empty string, not {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be an integer in 1..65535, not {port!r}")
    if not isinstance(virtual_host, str):
        raise TypeError(f"virtual_host must be a string, not {virtual_host!r}")
    username, password = _username_password(credentials)
    netloc_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return (
        f"amqp://{quote(username, safe='')}:{quote(password, safe='')}@{netloc_host}:{port}/"
        f"{quote(virtual_host, safe='')}"
    )


def _username_password(credentials: Any) -> tuple[str, str]:
    if credentials is None:
        return "guest", "guest"  # pika's default credentials
    username = getattr(credentials, "username", None)
    password = getattr(credentials, "password", None)
    if not isinstance(username, str) or not isinstance(password, str):
        raise TypeError(
            f"OjsBroker takes pika.PlainCredentials (user name and password), not {type(credentials).__name__}; "
            "(EXTERNAL authentication is not supported)"
        )
    return username, password


def _heartbeat(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"heartbeat must be a number of seconds (a callable is not supported), not {value!r}")
    if value < 0:
        raise ValueError(f"heartbeat must be >= 0, not {value!r}")
    return value


#: Options of :class:`ojs_kombu.Client` that ``OjsBroker`` passes through.
CLIENT_OPTIONS = frozenset(
    {
        "declare",
        "queue_options",
        "queue_type",
        "pool_size",
        "confirm_timeout",
        "publish_timeout",
        "connect_retries",
        "app_id",
        "on_conflict",
        "window",
        "connection_name",
        "control",
    }
)

#: Options of the kombu connections that ``OjsBroker`` passes through.
KOMBU_OPTIONS = frozenset({"heartbeat", "ssl", "transport_options"})


def split_options(
    url: BrokerUrls | None, parameters: Sequence[Any] | None, options: dict[str, Any], max_priority: int | None
) -> tuple[BrokerUrls | None, dict[str, Any], dict[str, Any]]:
    """``OjsBroker``'s keyword arguments: the URL (or what ``parameters`` / the pika keywords in
    ``options`` give), the kombu connection options and the :class:`~ojs_kombu.client.Client`'s.

    Parameters:
        url: ``OjsBroker(url=...)``, or None.
        parameters: ``RabbitmqBroker``'s ``parameters=``, or None.
        options: the other keyword arguments.
        max_priority: ``OjsBroker(max_priority=...)``: the job queues' ``x-max-priority``.

    Returns:
        ``(url, kombu connection options, Client options)``.

    Raises:
      TypeError: an unknown keyword argument (or one :func:`_connection` refuses).
      ValueError: a heartbeat that differs from the parameters'.
    """
    unknown = set(options) - CLIENT_OPTIONS - KOMBU_OPTIONS - PIKA_KEYWORDS
    if unknown:
        raise TypeError(f"OjsBroker() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    url, heartbeat = _connection(url, parameters, options)
    kombu_options = {k: v for k, v in options.items() if k in KOMBU_OPTIONS}
    if heartbeat is not None:
        kombu_options["heartbeat"] = heartbeat
    client_options = {k: v for k, v in options.items() if k in CLIENT_OPTIONS}
    client_options.setdefault("pool_size", 64)  # one pooled connection per publishing worker thread
    if max_priority is not None and "queue_options" not in client_options:
        client_options["queue_options"] = QueueOptions(max_priority=max_priority)
    return url, kombu_options, client_options


def _connection(
    url: BrokerUrls | None, parameters: Sequence[Any] | None, options: dict[str, Any]
) -> tuple[BrokerUrls | None, float | None]:
    """``url``, or the URL of ``RabbitmqBroker``'s ``parameters=`` / pika keyword arguments in
    ``options``; and the heartbeat those gave (``None``: none)."""
    refuse_untranslatable(sorted(options))  # before any other complaint: it says what to use instead
    pika_options = {k: v for k, v in options.items() if k in PIKA_KEYWORDS}
    if parameters is None and not pika_options:
        return url, None
    if url is not None:
        given = ["parameters"] if parameters is not None else sorted(pika_options)
        raise TypeError(f"OjsBroker(url=…) cannot be combined with pika connection parameters ({', '.join(given)})")
    heartbeat = options.get("heartbeat")
    if parameters is None and heartbeat is not None:
        pika_options["heartbeat"] = heartbeat
    translation = url_for_parameters(parameters, **pika_options)
    if heartbeat is not None and translation.heartbeat not in (None, heartbeat):
        raise ValueError(f"heartbeat={heartbeat} differs from the parameters' heartbeat {translation.heartbeat}")
    return translation.url, translation.heartbeat


__all__ = [
    "CLIENT_OPTIONS",
    "KOMBU_OPTIONS",
    "PIKA_KEYWORDS",
    "REFUSED",
    "TRANSLATED",
    "Translation",
    "refuse_untranslatable",
    "split_options",
    "url_for_parameters",
]
