"""Lazy re-exports for packages whose submodules are costly or must not load early (PEP 562)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` that import ``exports[name]`` on first use.

    ``exports`` maps a public name to the relative module defining it (``{"Celery": ".app"}``).
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
