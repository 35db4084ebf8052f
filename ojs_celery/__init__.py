"""ojs_celery: existing Celery task code, unchanged, over the OJS AMQP binding.

::

    from ojs_celery import Celery

    app = Celery("proj", broker="amqp://guest:guest@localhost//", broker_backend="ojs")

Importing :mod:`ojs_celery` does not import Celery until :class:`Celery`,
:class:`Task` or :class:`Request` is used, so the ``ojs://`` transport can use
the codec (:mod:`ojs_celery.protocol`) in processes without Celery's app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ojs_kombu.lazy import lazy_exports

if TYPE_CHECKING:
    from .app import OJS_DEFAULTS, Celery
    from .protocol import CeleryCodec, TaskIndex
    from .request import Request
    from .task import Task

_EXPORTS = {
    "Celery": ".app",
    "OJS_DEFAULTS": ".app",
    "CeleryCodec": ".protocol",
    "TaskIndex": ".protocol",
    "Request": ".request",
    "Task": ".task",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
