"""Window arithmetic of rate limits (``ojs-rate-limiting.md`` §5.2, §5.3), without I/O.

Both window strategies become *slots*: a slot of ``interval`` seconds grants ``capacity`` job
starts, and the slots are fixed windows aligned to the Unix epoch (slot ``k`` covers
``[k·interval, (k+1)·interval)``), so every process and the refiller agree on them without
talking to each other.

* ``rate`` (``limit`` per ``period``) is a **fixed window** (spec §5.2: implementations MUST
  document the algorithm): ``capacity = limit``, ``interval = period``.  Starts in one window
  never exceed ``limit``; across a boundary up to ``2 × limit`` may start within one period.
* ``throttle`` (``limit`` per ``period``, evenly spaced) is one start per slot of
  ``period / limit`` seconds (``capacity = 1``): on average one start every ``period / limit``;
  two starts at either side of a slot boundary may come closer than that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ojs_kombu.model.ratelimit import RateLimitPolicy, RateWindow

WindowKind = Literal["rate", "throttle"]
"""Which field of the policy a :class:`WindowSchedule` comes from."""


@dataclass(frozen=True)
class WindowSchedule:
    """``capacity`` job starts per slot of ``interval`` seconds, slots aligned to the epoch.

    Parameters:
        kind: ``"rate"`` or ``"throttle"``.
        capacity: starts per slot (≥ 1).
        interval: the slot's length in seconds (> 0).
    """

    kind: WindowKind
    capacity: int
    interval: float

    @classmethod
    def of(cls, kind: WindowKind, window: RateWindow) -> WindowSchedule:
        """The schedule of a policy's ``rate`` or ``throttle`` window (see the module).

        Parameters:
            kind: which field ``window`` is.
            window: the window.

        Returns:
            The schedule.
        """
        if kind == "rate":
            return cls("rate", window.limit, window.period_seconds)
        return cls("throttle", 1, window.interval_seconds)

    @classmethod
    def for_policy(cls, policy: RateLimitPolicy) -> list[WindowSchedule]:
        """The schedules of every window field the policy sets (``rate``, ``throttle``; none, one or both).

        Parameters:
            policy: the policy.

        Returns:
            The schedules, ``rate`` first.
        """
        schedules = []
        if policy.rate is not None:
            schedules.append(cls.of("rate", policy.rate))
        if policy.throttle is not None:
            schedules.append(cls.of("throttle", policy.throttle))
        return schedules

    def slot(self, now: float) -> int:
        """The index of the slot that holds the Unix time ``now``.

        Parameters:
            now: seconds since the epoch.

        Returns:
            ``floor(now / interval)``.
        """
        return math.floor(now / self.interval)

    def start(self, slot: int) -> float:
        """The Unix time slot ``slot`` begins at.

        Parameters:
            slot: a slot index.

        Returns:
            Seconds since the epoch.
        """
        return slot * self.interval

    def end(self, slot: int) -> float:
        """The Unix time slot ``slot`` ends at (the next one's start).

        Parameters:
            slot: a slot index.

        Returns:
            Seconds since the epoch.
        """
        return (slot + 1) * self.interval

    def until_next(self, now: float) -> float:
        """Seconds from ``now`` to the start of the next slot: when a limited job may start again.

        ``on_limit: "reschedule"`` schedules the job this far ahead (spec §6.2).

        Parameters:
            now: seconds since the epoch.

        Returns:
            A delay in ``(0, interval]``.
        """
        return self.end(self.slot(now)) - now


__all__ = ["WindowKind", "WindowSchedule"]
