"""The job's policies: :class:`RetryPolicy` (retry-policy.schema.json) and :class:`UniquePolicy` (unique-policy.schema.json)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from ojs_kombu.model._problems import Problem
from ojs_kombu.model.base import OjsModel
from ojs_kombu.model.fields import Duration, Int, JobState, StrList, int_field, tuple_to_list, unique_items
from ojs_kombu.model.timefmt import _duration, _duration_groups

DEFAULT_MAX_ATTEMPTS = 3
"""``max_attempts`` of a job without a retry policy, and of a policy that does not say (retry-policy.schema.json)."""

UNLIMITED_ATTEMPTS = 2**31 - 1
"""``max_attempts`` that stands for "retry forever" (Celery's and Dramatiq's ``max_retries=None``)."""


class RetryPolicy(OjsModel):
    """The OJS retry policy (retry-policy.schema.json) plus the ``backoff_strategy`` extension.

    Durations accept an ISO 8601 string or a ``timedelta`` (stored as the string).
    Only the fields that were set are serialised, so ``RetryPolicy(max_attempts=5)``
    emits ``{"max_attempts": 5}``; unset fields read as the spec defaults.
    ``on_exhaustion`` stays ``None`` when not given: DESIGN §5 routes that case to
    the dead letter queue, unlike an explicit ``"discard"``.
    """

    _label: ClassVar[str] = "retry policy"

    max_attempts: Int = int_field(DEFAULT_MAX_ATTEMPTS, ge=0)
    initial_interval: Duration = "PT1S"
    backoff_coefficient: float = Field(default=2.0, strict=True, ge=1.0, allow_inf_nan=False)
    max_interval: Duration = "PT5M"
    jitter: bool = Field(default=True, strict=True)
    non_retryable_errors: StrList = Field(default_factory=list)
    on_exhaustion: Literal["discard", "dead_letter"] | None = None
    backoff_strategy: Literal["exponential", "linear", "polynomial", "none"] | None = None

    @field_validator("initial_interval", "max_interval")
    @classmethod
    def _fixed_duration(cls, value: str) -> str:
        _duration(value)
        return value

    @field_validator("non_retryable_errors")
    @classmethod
    def _unique_errors(cls, value: list[str]) -> list[str] | None:
        return unique_items(value)

    @model_validator(mode="after")
    def _intervals(self) -> RetryPolicy:
        initial = _duration(self.initial_interval)
        if initial <= timedelta(0):
            raise Problem(f"must be greater than zero, got {self.initial_interval!r}", "initial_interval")
        if _duration(self.max_interval) < initial:
            raise Problem(
                f"{self.max_interval!r} is shorter than initial_interval {self.initial_interval!r}", "max_interval"
            )
        return self

    @property
    def initial_interval_seconds(self) -> float:
        """``initial_interval`` in seconds."""
        return _duration(self.initial_interval).total_seconds()

    @property
    def max_interval_seconds(self) -> float:
        """``max_interval`` in seconds."""
        return _duration(self.max_interval).total_seconds()

    @property
    def dead_letters_on_exhaustion(self) -> bool:
        """True unless ``on_exhaustion`` is explicitly ``"discard"`` (DESIGN §5)."""
        return self.on_exhaustion != "discard"

    def is_non_retryable(self, error_type: str) -> bool:
        """Whether ``error_type`` is listed in ``non_retryable_errors``.

        Exact names match exactly (``"ValueError"``); an entry ending in ``.*``
        matches every type under that prefix (``"auth.*"`` matches
        ``"auth.TokenExpired"`` and ``"auth.token.expired"``, not ``"auth"`` itself).
        """
        for entry in self.non_retryable_errors:
            if entry == error_type:
                return True
            if entry.endswith(".*") and error_type.startswith(entry[:-1]):
                return True
        return False


class UniquePolicy(OjsModel):
    """The OJS unique policy (unique-policy.schema.json).

    ``period`` accepts any duration the schema allows (years and months included:
    nothing here needs its length) or a ``timedelta``.
    """

    _label: ClassVar[str] = "unique policy"

    keys: Annotated[list[Literal["type", "queue", "args", "meta"]], BeforeValidator(tuple_to_list)] | None = None
    args_keys: StrList | None = None
    meta_keys: Annotated[StrList, Field(min_length=1)] | None = None
    period: Duration | None = None
    states: Annotated[list[JobState], BeforeValidator(tuple_to_list)] | None = None
    on_conflict: Literal["reject", "replace", "replace_except_schedule", "ignore"] | None = None

    @field_validator("keys", "args_keys", "meta_keys", "states")
    @classmethod
    def _unique(cls, value: list[str] | None) -> list[str] | None:
        return unique_items(value)

    @field_validator("period")
    @classmethod
    def _period(cls, value: str | None) -> str | None:
        if value is not None:
            _duration_groups(value)
        return value

    @model_validator(mode="after")
    def _meta_keys_needed(self) -> UniquePolicy:
        # The schema's `if` is vacuously true when `keys` is absent, so it demands meta_keys
        # for every policy without keys (DESIGN §2).  We follow the spec's intent instead:
        # meta_keys is required only when "meta" is one of the keys.
        if self.keys and "meta" in self.keys and not self.meta_keys:
            raise Problem('is required when keys contains "meta"', "meta_keys")
        return self


__all__ = ["DEFAULT_MAX_ATTEMPTS", "UNLIMITED_ATTEMPTS", "RetryPolicy", "UniquePolicy"]
