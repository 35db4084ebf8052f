"""The Dramatiq errors ``OjsBroker`` raises for the ``ojs_kombu`` errors of a publish.

Code written for ``RabbitmqBroker`` catches :class:`dramatiq.errors.BrokerError`
(or its ``ConnectionClosed``) around ``send()``; :func:`dramatiq_errors` keeps
that working by raising Dramatiq's classes, with the ``ojs_kombu`` error as
``__cause__`` for callers that want the detail.  The table, and why each
error maps where it does, is in :class:`ojs_dramatiq.OjsBroker`'s docstring;
:data:`ERROR_MAP` is its code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from dramatiq.errors import BrokerError, ConnectionClosed, DramatiqError, QueueNotFound

from ojs_kombu.errors import (
    BrokerConnectionError,
    DuplicateJobError,
    OjsError,
    PublishNackedError,
    PublishTimeoutError,
    UnroutableError,
    ValidationError,
)

E = TypeVar("E", bound=DramatiqError)

#: ``(ojs_kombu error, Dramatiq error)``, most specific first; the first match wins.
ERROR_MAP: tuple[tuple[type[OjsError], type[BrokerError]], ...] = (
    (BrokerConnectionError, ConnectionClosed),
    (PublishTimeoutError, ConnectionClosed),
    (UnroutableError, QueueNotFound),
    (PublishNackedError, BrokerError),
    (OjsError, BrokerError),
)


def dramatiq_error_for(error: OjsError) -> BrokerError:
    """The Dramatiq error that stands for ``error`` (see the module's table).

    Parameters:
      error: an ``ojs_kombu`` error other than a :class:`~ojs_kombu.ValidationError`.

    Returns:
      A new :class:`dramatiq.errors.BrokerError` (subclass) carrying ``error``'s message;
      the caller raises it ``from error``.
    """
    for ojs_class, dramatiq_class in ERROR_MAP:
        if isinstance(error, ojs_class):
            return dramatiq_error(dramatiq_class, str(error))
    raise TypeError(f"not an ojs_kombu error: {error!r}")


def dramatiq_error(kind: type[E], message: object) -> E:
    """``kind(message)``, typed: Dramatiq's error classes take one unannotated ``message``.

    Parameters:
      kind: a Dramatiq error class (``ConnectionClosed``, ``QueueJoinTimeout`` ...).
      message: what ``str()`` of the error shows (Dramatiq keeps it as ``.message``).

    Returns:
      The new error.
    """
    return kind(message)


@contextmanager
def dramatiq_errors() -> Iterator[None]:
    """Raise the ``ojs_kombu`` errors of the block as Dramatiq's (``raise X(...) from error``).

    Raises:
      dramatiq.errors.BrokerError: (a subclass of it) for every ``OjsError`` but a ``ValidationError``.
      ojs_kombu.ValidationError, ojs_kombu.DuplicateJobError: unchanged.
    """
    try:
        yield
    except (ValidationError, DuplicateJobError):
        raise
    except OjsError as error:
        raise dramatiq_error_for(error) from error


__all__ = ["ERROR_MAP", "dramatiq_error", "dramatiq_error_for", "dramatiq_errors"]
