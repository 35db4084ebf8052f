"""ojs_celery: existing Celery task code, unchanged, over the OJS AMQP binding.

::

    from ojs_celery import Celery

    app = Celery("proj", broker="amqp://guest:guest@localhost//", broker_backend="ojs")

Importing :mod:`ojs_celery` registers its codec (:class:`CeleryCodec`, Celery protocol v2)
as the ``ojs://`` transport's (:func:`ojs_kombu.transport.register_codec`), and does not import
Celery until :class:`Celery`, :class:`Task` or :class:`Request` is used, so the transport can
use the codec in processes without Celery's app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ojs_kombu.lazy import lazy_exports
from ojs_kombu.transport import register_codec

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

# A path, not the class: the codec module loads on the first task message, not at this import.
register_codec("ojs_celery.protocol:CeleryCodec")


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
