"""``replace`` of a *running* holder never runs both (unique-jobs spec §5.2, §8, UNIQ-30).

The one implementation of "cancel the holder, then wait while it is active", used by every
publisher that applies ``on_conflict="replace"``: the Client (:mod:`ojs_kombu.client.uniqueness`)
and the ``ojs://`` transport of Celery (:mod:`ojs_kombu.transport.state`).

After the cancel, one INFO (:func:`~ojs_kombu.amqp.info.ask_info`, ``probe`` s) asks the
queue's workers whether the holder is ``active``.  INFO travels on the same control stream,
after the cancel: a worker that answers has applied the cancel, so a holder it does not run now
it never starts.  Only an ``active`` holder is waited for: INFO is asked again until no worker
says it is active (its Settler then frees the lock as ``cancelled``), for at most ``timeout`` s;
past that the replace falls back to ``reject``: a :class:`~ojs_kombu.errors.DuplicateJobError`,
the holder cancelled but still running, the new job not published.  A holder scheduled more
than 5 s ahead (its lock's record says when) cannot run yet: it is not asked about.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Final

from ojs_kombu.errors import DuplicateJobError, ValidationError
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.timefmt import parse_timestamp, utcnow

#: Seconds the INFO after a replace's cancel waits for a worker to say the holder runs.
DEFAULT_REPLACE_PROBE: Final = 1.0
#: Seconds a replace waits for a running holder to end once cancelled, before it rejects.
DEFAULT_REPLACE_TIMEOUT: Final = 10.0
_NOT_DUE: Final = timedelta(seconds=5)  # a holder due later than this cannot run yet (clock skew margin)
_ASK_AGAIN: Final = 0.05  # an active answer comes back at once: do not spin on the control stream


def cancel_and_wait(
    job_id: str,
    scheduled_at: str | None,
    *,
    cancel: Callable[[], None],
    info: Callable[[float], JobInfo | None],
    probe: float,
    timeout: float,
) -> None:
    """Cancel the holder ``job_id`` (``replace``); return once it does not run, or reject.

    Parameters:
        job_id: the holder's id.
        scheduled_at: when the holder is due (its lock's record), or None.
        cancel: publishes the CANCEL of the holder on its queue's control stream.
        info: one INFO about the holder on that stream, waiting at most the seconds given.
        probe: seconds each INFO waits for answers.
        timeout: seconds to wait for an active holder to end.

    Raises:
        DuplicateJobError: it still runs ``timeout`` s after the cancel (its ``key`` is set by
            :func:`~ojs_kombu.runtime.unique.claim`).
    """
    cancel()
    if scheduled_at is not None and _due_in(scheduled_at) > _NOT_DUE:
        return
    deadline = time.monotonic() + timeout
    while (answer := info(probe)) is not None and answer.state == "active":
        if time.monotonic() >= deadline:
            raise DuplicateJobError(
                f"job {job_id} is running and did not end within {timeout:g} s of its cancel: "
                "an active job cannot be replaced (on_conflict falls back to reject)",
                existing_id=job_id,
                key="",
            )
        time.sleep(_ASK_AGAIN)


def check_seconds(name: str, value: float, *, zero: bool) -> float:
    """``value`` as seconds (``replace_probe``, ``unique_replace_timeout``).

    Parameters:
        name: the option's name (for the error).
        value: the number given.
        zero: whether 0 is allowed.

    Returns:
        It as a float.

    Raises:
        ValidationError: not a number of seconds > 0 (>= 0 with ``zero``).
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (value == 0 and not zero):
        raise ValidationError(
            f"{name} must be a number of seconds {'>= 0' if zero else '> 0'}, got {value!r}", field=name
        )
    return float(value)


def _due_in(scheduled_at: str) -> timedelta:
    try:
        return parse_timestamp(scheduled_at) - utcnow()
    except ValidationError:  # an unreadable record: the holder may be due
        return timedelta(0)


__all__ = ["DEFAULT_REPLACE_PROBE", "DEFAULT_REPLACE_TIMEOUT", "cancel_and_wait", "check_seconds"]
