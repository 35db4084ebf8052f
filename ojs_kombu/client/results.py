"""The types of the Client's public API: enqueue options, per-job outcomes, queue counts."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

from ojs_kombu.errors import OjsError
from ojs_kombu.model.job import Job
from ojs_kombu.model.policies import RetryPolicy, UniquePolicy
from ojs_kombu.model.ratelimit import RateLimitPolicy


class JobOptions(TypedDict, total=False):
    """The keyword options of :meth:`Job.create`, as :meth:`Client.enqueue` takes them."""

    queue: str
    kwargs: dict[str, Any] | None
    meta: dict[str, Any] | None
    priority: int | None
    retry: RetryPolicy | Mapping[str, Any] | None
    scheduled_at: datetime | str | timedelta | None
    expires_at: datetime | str | timedelta | None
    timeout: int | None
    tags: list[str] | tuple[str, ...] | None
    id: str | uuid.UUID | None
    unique: UniquePolicy | Mapping[str, Any] | None
    rate_limit: RateLimitPolicy | Mapping[str, Any] | None


@dataclass
class EnqueueResult:
    """The outcome of one job of :meth:`Client.enqueue_many`.

    Attributes:
        job: the job as enqueued; for a duplicate ignored (``unique`` with ``on_conflict="ignore"``),
            the job passed with the *existing* job's id (its other fields are the ones passed).
        error: why it was not enqueued, or None.
        existing_id: the id of the existing job when this one was a duplicate and nothing was
            published (``on_conflict="ignore"``); None otherwise.
    """

    job: Job
    error: OjsError | None = None
    existing_id: str | None = None

    @property
    def deduplicated(self) -> bool:
        """True when the job was a duplicate that ``on_conflict="ignore"`` left unpublished."""
        return self.existing_id is not None

    @property
    def ok(self) -> bool:
        """True when the broker confirmed the job."""
        return self.error is None

    def unwrap(self) -> Job:
        """The job, or raise the error that kept it from being enqueued."""
        if self.error is not None:
            raise self.error
        return self.job


@dataclass(frozen=True)
class QueueCounts:
    """What a passive ``Queue.Declare`` tells of a queue (:meth:`Client.queue_counts`)."""

    ready: int
    consumers: int


__all__ = ["EnqueueResult", "JobOptions", "QueueCounts"]
