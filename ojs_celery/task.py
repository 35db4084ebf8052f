"""The base ``Task`` class of :class:`ojs_celery.Celery` apps."""

from __future__ import annotations

from typing import Any

import celery

from .protocol import retrying_exception
from .request import REQUEST


class Task(celery.Task):  # type: ignore[misc]  # Celery is untyped
    """``celery.Task`` with :class:`ojs_celery.request.Request` (counted time limits and lost workers).

    :meth:`retry` also hands its ``exc`` to the transport, which writes it to the
    retry message's ``x-ojs-error-message`` / ``x-ojs-error-code`` and ``errors[]``
    (without it, the exception being handled is used).
    """

    Request = REQUEST

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        *more: Any,
        **options: Any,
    ) -> Any:
        """As :meth:`celery.Task.retry`; the failure recorded on the wire is ``exc``."""
        token = retrying_exception.set(exc)
        try:
            return super().retry(args, kwargs, exc, *more, **options)
        finally:
            retrying_exception.reset(token)


__all__ = ["Task"]
