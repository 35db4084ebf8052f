"""A worker's handlers: which function runs each job type, and which of them are ``async def``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ojs_kombu.model.naming import validate_job_type

#: A job handler: called with the job's ``args`` and ``meta.kwargs``; may be an ``async def``.
Handler = Callable[..., object]


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """A batch handler (:meth:`Worker.batch_handler <ojs_kombu.runtime.worker.Worker.batch_handler>`):
    ``fn(jobs)`` with up to ``size`` jobs, collected for at most ``timeout`` seconds after the first."""

    fn: Callable[[list[Any]], object]
    size: int
    timeout: float


class Handlers:
    """The handler registry of a :class:`~ojs_kombu.runtime.worker.Worker` (job type -> handler).

    Not locked: the Worker registers under its own lock; a lookup reads one dict entry.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._async_types: set[str] = set()  # job types whose handler is an ``async def``
        #: The batch handlers (job type -> spec); a type has a handler or a batch handler.
        self.batches: dict[str, BatchSpec] = {}

    def add(self, job_type: str, handler: Handler) -> None:
        """Register ``handler`` for ``job_type``, replacing the one registered before.

        Raises:
            ValidationError: ``job_type`` is not a valid OJS job type.
        """
        validate_job_type(job_type)
        self.batches.pop(job_type, None)
        self._handlers[job_type] = handler
        if inspect.iscoroutinefunction(handler):
            self._async_types.add(job_type)
        else:
            self._async_types.discard(job_type)

    def add_batch(self, job_type: str, spec: BatchSpec) -> None:
        """Register the batch handler ``spec`` for ``job_type``, replacing its handler or batch handler.

        Raises:
            ValidationError: ``job_type`` is not a valid OJS job type.
        """
        validate_job_type(job_type)
        self._handlers.pop(job_type, None)
        self._async_types.discard(job_type)
        self.batches[job_type] = spec

    def get(self, job_type: str) -> Handler | None:
        """The handler of ``job_type``, or ``None``."""
        return self._handlers.get(job_type)

    def is_async(self, job_type: str) -> bool:
        """Whether the handler of ``job_type`` is an ``async def`` (its jobs run on the event loop)."""
        return job_type in self._async_types

    @property
    def all_async(self) -> bool:
        """Whether there are handlers and every one is an ``async def`` (one handler thread will do)."""
        return bool(self._handlers) and not self.batches and self._async_types.issuperset(self._handlers)

    def __len__(self) -> int:
        return len(self._handlers) + len(self.batches)

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._handlers or job_type in self.batches


__all__ = ["BatchSpec", "Handler", "Handlers"]
