"""ojs_celery: existing Celery task code, unchanged, over the OJS AMQP binding.

::

    from ojs_celery import Celery

    app = Celery("proj", broker="amqp://guest:guest@localhost//", broker_backend="ojs")

Importing :mod:`ojs_celery` does not import Celery until :class:`Celery`,
:class:`Task` or :class:`Request` is used, so the ``ojs://`` transport can use
the codec (:mod:`ojs_celery.protocol`) in processes without Celery's app.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    """Load the public names on first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
