"""The job's rate limit policy (``ojs-rate-limiting.md`` §6): :class:`RateLimitPolicy` and :class:`RateWindow`.

Carried in the envelope as the ``rate_limit`` object (spec §6.1), set per job
(``Job.create(..., rate_limit=policy)``, ``Client.enqueue(..., rate_limit=...)``, or
``job.rate_limit = policy``, validated on assignment)::

    {"key": "stripe-api", "concurrency": 5,
     "rate": {"limit": 100, "period": "PT1M"},
     "throttle": {"limit": 10, "period": "PT1S"},
     "on_limit": "wait"}

Only the fields that were set are emitted; ``on_limit`` reads as ``"wait"`` when absent
(spec §6.2: implementations MUST default to ``"wait"``).  Periods are ISO 8601 durations of a
fixed length (weeks, days, hours, minutes, seconds; not years or months) and longer than zero.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator

from ojs_kombu.model._problems import Problem
from ojs_kombu.model.base import OjsModel
from ojs_kombu.model.fields import Duration, Int, int_field
from ojs_kombu.model.timefmt import _duration

RATE_LIMIT_KEY_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9._:-]*$"
"""The pattern every ``rate_limit.key`` matches (spec §6.2, a MUST)."""

MAX_RATE_LIMIT_KEY_LENGTH = 160
"""Longest key, in characters: the key is part of AMQP queue names (``{prefix}.ojs.limit.{key}.held.{index}``),
which RabbitMQ caps at 255 bytes; 160 leaves room for a deployment prefix of 60."""

_KEY_RE = re.compile(RATE_LIMIT_KEY_PATTERN)

OnLimit = Literal["wait", "reschedule", "drop"]
"""What happens to a job that cannot start because of its limits (spec §6.2 ``on_limit``)."""


class RateWindow(OjsModel):
    """``rate`` or ``throttle`` of a policy: at most ``limit`` job starts per ``period`` (spec §6.1).

    ``period`` is an ISO 8601 duration string or a ``timedelta`` (stored as the string).
    """

    _label: ClassVar[str] = "rate window"

    limit: Int = int_field(..., ge=1)  # type: ignore[arg-type]
    period: Duration

    @field_validator("period")
    @classmethod
    def _positive(cls, value: str) -> str:
        if _duration(value) <= timedelta(0):
            raise Problem(f"must be longer than zero, got {value!r}")
        return value

    @property
    def period_seconds(self) -> float:
        """``period`` in seconds."""
        return _duration(self.period).total_seconds()

    @property
    def interval_seconds(self) -> float:
        """``period / limit``: the even spacing of a throttle (spec §5.3), in seconds."""
        return self.period_seconds / self.limit


class RateLimitPolicy(OjsModel):
    """The OJS ``rate_limit`` policy of a job (spec §6): limits shared by every job with the same ``key``.

    Parameters:
        key: the partition key, matching :data:`RATE_LIMIT_KEY_PATTERN` (e.g. ``"tenant:acme:api"``).
        concurrency: most jobs of the key running at once (``0`` pauses the key); ``None``: unlimited.
        rate: a window rate, :class:`RateWindow` or ``{"limit": ..., "period": ...}``.
        throttle: an evenly spaced rate, same form as ``rate``.
        on_limit: ``"wait"`` (the default), ``"reschedule"`` or ``"drop"``.

    Raises:
        ValidationError: a bad field; ``field`` names it (``"key"``, ``"rate.period"``...).
    """

    _label: ClassVar[str] = "rate limit policy"

    key: Annotated[str, Field(strict=True)]
    concurrency: Int | None = int_field(None, ge=0)
    rate: RateWindow | None = None
    throttle: RateWindow | None = None
    on_limit: OnLimit | None = None

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if _KEY_RE.fullmatch(value) is None:
            raise Problem(f"{value!r} does not match {RATE_LIMIT_KEY_PATTERN}")
        if len(value) > MAX_RATE_LIMIT_KEY_LENGTH:
            raise Problem(f"is {len(value)} characters long; at most {MAX_RATE_LIMIT_KEY_LENGTH}")
        return value

    @property
    def action(self) -> OnLimit:
        """``on_limit``, ``"wait"`` when absent (spec §6.2)."""
        return self.on_limit or "wait"

    @property
    def lossy(self) -> bool:
        """Whether a limited job is discarded (``on_limit: "drop"``)."""
        return self.on_limit == "drop"


__all__ = ["MAX_RATE_LIMIT_KEY_LENGTH", "RATE_LIMIT_KEY_PATTERN", "OnLimit", "RateLimitPolicy", "RateWindow"]
