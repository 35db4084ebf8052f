"""The rate limits of one ``ojs://`` channel: a job's ``rate_limit`` (and the ``rate_limits`` option).

A framework's channel hands each job delivery to :meth:`ChannelLimits.admit` before the framework sees
it: admitted (the permits it took, given back by :meth:`ChannelLimits.release` when the job is acked or
rejected), settled (dropped or rescheduled by ``on_limit``), or parked: the delivery's arguments wait
here until its waiter took the permits, then :meth:`ChannelLimits.admitted` gives them back to the
channel, on the connection's loop.  The :class:`~ojs_kombu.runtime.limits.Limiter` is the Worker's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ojs_kombu.model.job import Job
from ojs_kombu.model.ratelimit import RateLimitPolicy
from ojs_kombu.runtime.delivery import Delivery
from ojs_kombu.runtime.limits import Admitted, Limiter, Verdict

Parked = tuple[dict[str, Any], dict[str, Any], str, Callable[[Any], Any]]
"""What the channel needs to deliver a parked job once admitted: properties, delivery info, queue, callback."""

JobPolicy = Callable[[Job], RateLimitPolicy | None]
"""A policy of a job's own besides its ``rate_limit`` (the ``rate_limits`` transport option)."""


class ChannelLimits:
    """The limits of one channel's job deliveries (made per channel, the Limiter on its first limited job).

    Parameters:
        make_limiter: builds the Limiter: ``make_limiter(park_limit, job_policy)``.
        job_policy: the ``rate_limits`` transport option (a policy of a job's own), or None.
    """

    def __init__(self, make_limiter: Callable[[int, JobPolicy | None], Limiter], job_policy: JobPolicy | None):
        self._make_limiter = make_limiter
        self._job_policy = job_policy
        self._limiter: Limiter | None = None
        self._parked: dict[int, Parked] = {}
        #: The channel's prefetch count (``basic_qos``): at most half of it waits parked.
        self.prefetch = 0

    def applies(self, job: Job) -> bool:
        """Whether ``job`` goes through the limiter (it, or the option, has a limit; or one is running)."""
        return job.rate_limit is not None or self._job_policy is not None or self._limiter is not None

    def admit(self, delivery: Delivery, job: Job, parked: Parked) -> Verdict:
        """The limiter's verdict on ``delivery``; a parked one keeps ``parked`` until :meth:`admitted`."""
        if self._limiter is None:
            self._limiter = self._make_limiter(self.prefetch // 2, self._job_policy)
        verdict = self._limiter.admit(delivery, job)
        if verdict == "parked":
            self._parked[delivery.delivery_tag] = parked
        return verdict

    def admitted(self, delivery: Delivery, channel_open: bool) -> Parked | None:
        """The arguments of parked ``delivery``, now admitted; None if the channel is gone (the broker
        redelivers it, the limiter forgets it)."""
        parked = self._parked.pop(delivery.delivery_tag, None)
        if parked is None or not channel_open:
            if self._limiter is not None:
                self._limiter.forget(delivery)
            return None
        return parked

    def release(self, held: Admitted) -> None:
        """Give back the permits of an acked or rejected job."""
        if held and self._limiter is not None:
            self._limiter.release(held)

    def close(self, held: Iterable[Admitted]) -> None:
        """The channel is torn down: the parked deliveries go back to the broker with it; ``held`` (the
        permits of its unsettled jobs) are given back."""
        limiter, self._limiter = self._limiter, None
        if limiter is not None:
            limiter.stop()
            for permits in held:
                limiter.release(permits)
            limiter.close(close_permits=False)
        self._parked.clear()


__all__ = ["ChannelLimits", "JobPolicy", "Parked"]
