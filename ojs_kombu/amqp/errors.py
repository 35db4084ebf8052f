"""py-amqp / kombu exceptions -> the :mod:`ojs_kombu.errors` hierarchy, in one place.

The library's boundary raises :class:`~ojs_kombu.errors.OjsError` subclasses
only; this module is where a py-amqp exception becomes one, as httpx's
``_exceptions.map_exceptions`` does for its transports:

* :func:`is_permanent` tells a refusal that retrying cannot change (a wrong
  password, a virtual host the user may not use, a missing permission) from a
  transient failure (a dropped connection, a refused TCP connect, a restarting
  node).  Every back-off loop asks it before sleeping: a permanent refusal is
  raised at once, never retried forever.
* :func:`map_exception` builds the typed error for an exception, or returns
  ``None`` when it has none (a transient error the caller still retries);
  :func:`map_exceptions` is the same as a context manager; :func:`raise_if_permanent`
  is the one line a back-off loop's ``except`` clause needs.

The table (AMQP reply code -> error):

====================================  ==================================
``403 ACCESS_REFUSED``                :class:`AccessRefusedError`
``530 NOT_ALLOWED`` (vhost)           :class:`AccessRefusedError`
``404 NOT_FOUND`` (``must_exist``)    :class:`NotFoundError`
TLS certificate verification failed   :class:`TlsVerificationError` (unknown CA, wrong host name)
transient (``OSError``, 320, 505 …)   :class:`BrokerConnectionError` (:func:`connection_error`)
====================================  ==================================

A 404 is permanent only where the entity must already exist (a passive
declare, reading a dead letter queue): a publish to an exchange deleted
meanwhile is cured by re-declaring the topology, so it stays a channel error
that the caller's retry handles.  A 406 (inequivalent arguments) is handled
by :mod:`ojs_kombu.amqp.topology` (``TopologyConflictError``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from ssl import SSLCertVerificationError

from amqp.exceptions import (
    AccessRefused,
    InternalError,
    NotAllowed,
    NotFound,
    RecoverableConnectionError,
    ResourceError,
)

from ojs_kombu.amqp.urls import safe_url
from ojs_kombu.errors import (
    AccessRefusedError,
    BrokerConnectionError,
    BrokerRefusedError,
    NotFoundError,
    OjsError,
    TlsVerificationError,
)


def _tls_failure(exc: SSLCertVerificationError, url: str | None) -> TlsVerificationError:
    reason = exc.verify_message or exc.reason or str(exc)
    where = f" for the broker at {safe_url(url)}" if url else ""
    return TlsVerificationError(f"TLS certificate verification failed{where}: {reason}")


# py-amqp exceptions that the same request would meet again, whatever the context.
_ALWAYS_PERMANENT: dict[type[Exception], type[BrokerRefusedError]] = {
    AccessRefused: AccessRefusedError,
    NotAllowed: AccessRefusedError,
}


def _method_name(exc: BaseException) -> str:
    method = getattr(exc, "method_name", None) or ""
    return method if isinstance(method, str) else ""


def _refusal(exc: BaseException, error: type[BrokerRefusedError], url: str | None) -> BrokerRefusedError:
    code = int(getattr(exc, "reply_code", 0) or 0)
    text = str(getattr(exc, "reply_text", "") or exc)
    method = _method_name(exc)
    where = f" at {safe_url(url)}" if url else ""
    by = f" ({method})" if method else ""
    return error(f"the broker{where} refused{by}: {code} {text}", reply_code=code, reply_text=text, method=method)


def is_permanent(exc: BaseException, *, must_exist: bool = False) -> bool:
    """Whether retrying ``exc``'s operation cannot help.

    Parameters:
        exc: any exception, raw (py-amqp) or already mapped.
        must_exist: the operation only reads an entity that must exist (a passive
            declare, ``Basic.Get`` on a dead letter queue), so a 404 is final too.

    Returns:
        True for a :class:`BrokerRefusedError`, a py-amqp ``AccessRefused`` (403) or
        ``NotAllowed`` (530), a failed TLS certificate verification, and with
        ``must_exist`` a ``NotFound`` (404).
    """
    if isinstance(exc, BrokerRefusedError | AccessRefused | NotAllowed | SSLCertVerificationError):
        return True
    return must_exist and isinstance(exc, NotFound)


def map_exception(exc: BaseException, *, url: str | None = None, must_exist: bool = False) -> OjsError | None:
    """The :class:`OjsError` that stands for ``exc`` at the library's boundary.

    Parameters:
        exc: the exception raised by py-amqp / kombu (an ``OjsError`` is returned as it is).
        url: the broker URL, named (password masked) in the message.
        must_exist: as for :func:`is_permanent`.

    Returns:
        The typed error, or ``None`` when ``exc`` is transient or unknown here
        (the caller retries it, or lets it through).
    """
    if isinstance(exc, OjsError):
        return exc
    if isinstance(exc, SSLCertVerificationError):
        return _tls_failure(exc, url)
    for raw, error in _ALWAYS_PERMANENT.items():
        if isinstance(exc, raw):
            return _refusal(exc, error, url)
    if must_exist and isinstance(exc, NotFound):
        return _refusal(exc, NotFoundError, url)
    return None


def raise_if_permanent(exc: BaseException, *, url: str | None = None, must_exist: bool = False) -> None:
    """Raise the typed error of ``exc`` (chained to it) when ``exc`` is permanent; else return.

    The one call a back-off loop makes in its ``except`` clause before it sleeps.

    Raises:
        BrokerRefusedError: ``exc`` is a permanent refusal (see :func:`is_permanent`).
    """
    mapped = map_exception(exc, url=url, must_exist=must_exist) if is_permanent(exc, must_exist=must_exist) else None
    if mapped is None:
        return
    if mapped is exc:
        raise mapped
    raise mapped from exc


@contextmanager
def map_exceptions(*, url: str | None = None, must_exist: bool = False) -> Iterator[None]:
    """Turn the permanent py-amqp refusals raised inside the block into :class:`BrokerRefusedError`.

    Transient errors pass through unchanged: the caller's back-off loop retries them.

    Parameters:
        url: the broker URL, for the message (password masked).
        must_exist: a 404 inside the block is final (:class:`NotFoundError`).

    Raises:
        AccessRefusedError, NotFoundError, TlsVerificationError: as mapped; anything else as raised.
    """
    try:
        yield
    except OjsError:
        raise
    except Exception as exc:
        raise_if_permanent(exc, url=url, must_exist=must_exist)
        raise


def connection_error(url: str, exc: BaseException, attempts: int, elapsed: float) -> BrokerConnectionError:
    """The :class:`BrokerConnectionError` for a broker still unreachable after ``attempts`` tries.

    Parameters:
        url: the broker URL (its password is masked in the message).
        exc: the last connection error.
        attempts: connection attempts made.
        elapsed: seconds spent trying.
    """
    return BrokerConnectionError(
        f"cannot reach the broker at {safe_url(url)} after {attempts} attempt{'s' if attempts != 1 else ''} "
        f"in {elapsed:.1f}s: {exc}"
    )


class QueueNotServed(RecoverableConnectionError):  # type: ignore[misc]  # py-amqp is untyped
    """The broker closed the connection (541 INTERNAL_ERROR) on a ``Basic.Consume`` of ``entity``.

    Still a connection error that the consumer's back-off retries (the queue's member may be
    recovering); the :class:`~ojs_kombu.amqp.reconnect.Reconnector` turns it into a
    :class:`~ojs_kombu.errors.QueueUnavailableError` once ``entity`` failed for too long.
    """

    def __init__(self, entity: str, cause: InternalError):
        super().__init__(f"the broker could not serve a consumer of {entity!r}: {cause}")
        self.entity = entity
        self.reply_code = getattr(cause, "reply_code", 541)
        self.reply_text = str(getattr(cause, "reply_text", "") or cause)


# RabbitMQ's 506 on a publish to a stream without a member (a connection exception).
_STREAM_NOT_FOUND = re.compile(r"Stream not found for queue '([^']+)'")


def unserved_queue(exc: BaseException) -> str | None:
    """The queue ``exc`` says the broker cannot serve, or None.

    Parameters:
        exc: any exception.

    Returns:
        The queue's AMQP name for a :class:`QueueNotServed` (541 on ``Basic.Consume``) or a
        506 RESOURCE_ERROR "Stream not found for queue ..." (a publish routed to a stream
        without a member); None for anything else.
    """
    if isinstance(exc, QueueNotServed):
        return exc.entity
    if isinstance(exc, ResourceError) and (found := _STREAM_NOT_FOUND.search(str(exc.reply_text or ""))):
        return found.group(1)
    return None


@contextmanager
def consuming(entity: str) -> Iterator[None]:
    """Name ``entity`` in the 541 INTERNAL_ERROR that a ``Basic.Consume`` of it inside the block meets.

    Parameters:
        entity: the queue's AMQP name.

    Raises:
        QueueNotServed: the broker closed the connection with 541 (a stream or quorum queue
            without a running member: see :class:`~ojs_kombu.errors.QueueUnavailableError`).
    """
    try:
        yield
    except InternalError as exc:
        raise QueueNotServed(entity, exc) from exc


__all__ = [
    "QueueNotServed",
    "consuming",
    "unserved_queue",
    "TlsVerificationError",
    "connection_error",
    "is_permanent",
    "map_exception",
    "map_exceptions",
    "raise_if_permanent",
]
