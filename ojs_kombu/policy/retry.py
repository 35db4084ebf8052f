"""What happens to a job that failed: retry, dead letter or discard (DESIGN §5, §7).

:func:`decide` applies the job's :class:`~ojs_kombu.RetryPolicy` and the
handler response codes of the retry spec (:class:`~ojs_kombu.Discard`,
:class:`~ojs_kombu.DeadLetter`) to one failure, and :func:`record_failure`
writes the failure into the envelope (``attempt``, ``error``, ``errors[]``)
the way the retry path republishes it.

Retry delays travel through the binding's per-delay queues
``ojs.queue.retry.{q}.{delay_ms}``.  Jittered delays would create a queue per
millisecond value, so :func:`ladder_ms` rounds every delay *up* to the ladder
1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k ms: a retry is never early, at most
33 % late (plus the broker's TTL precision), and a job queue has at most ten
retry queues per decade of delay (about 60 for delays from 1 ms to 5 minutes).
"""

from __future__ import annotations

import enum
import math
import traceback
from bisect import bisect_left
from dataclasses import dataclass
from datetime import datetime

from ojs_kombu.errors import DeadLetter, Discard
from ojs_kombu.model.job import MAX_BACKTRACE_LINES, Job, JobError
from ojs_kombu.model.timefmt import format_timestamp, utcnow
from ojs_kombu.policy.backoff import retry_delay
from ojs_kombu.wire.codec import max_attempts_of

#: Mantissas of the retry delay ladder (one decade).
LADDER_MANTISSAS = (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)
#: How many failures ``errors[]`` keeps (the spec asks for at least 10).
ERROR_HISTORY = 20


def _ladder() -> list[int]:
    steps = {math.ceil(m * 10**e) for e in range(0, 12) for m in LADDER_MANTISSAS}
    return sorted(s for s in steps if s >= 1)


_LADDER = _ladder()


def ladder_ms(delay_ms: float) -> int:
    """The smallest ladder step >= ``delay_ms`` (and >= 1 ms)."""
    if delay_ms <= 1:
        return 1
    index = bisect_left(_LADDER, math.ceil(delay_ms - 1e-9))
    if index == len(_LADDER):
        return math.ceil(delay_ms)
    return _LADDER[index]


def ladder_ms_until(when: datetime, now: datetime | None = None) -> int:
    """The ladder step that carries a retry scheduled at ``when`` (an OJS ``scheduled_at``).

    An OJS timestamp is the framework's ETA rounded *up* to the millisecond (Celery's
    ``retry(countdown=1)`` is ``now + 1 s`` in microseconds), so the delay left until it may exceed
    the countdown by up to 1 ms, and :func:`ladder_ms` of that would take the next step: 1.2 s for
    a 1 s countdown.  The step is chosen for the delay less that millisecond; the retry then
    arrives up to 1 ms before ``when``, which its consumer waits out (the ``ojs://`` transport hands
    it to Celery, which holds a task until its ETA; a :class:`~ojs_kombu.Worker` delays it again).

    Parameters:
        when: the retry's ``scheduled_at`` as an aware datetime.
        now: the current time (default: now, UTC).

    Returns:
        The retry queue's delay in ms (a ladder step; 1 when ``when`` has passed).
    """
    delay_ms = (when - (now or utcnow())).total_seconds() * 1000
    return ladder_ms(delay_ms - 1)


class Outcome(enum.Enum):
    """What the worker does with a delivery."""

    ACK = "ack"  #: done: Basic.Ack
    RETRY = "retry"  #: republish to the retry path (confirmed), then Basic.Ack
    DEAD_LETTER = "dead_letter"  #: Basic.Nack(requeue=False) -> ojs.queue.dlx.{q}
    DISCARD = "discard"  #: Basic.Ack and drop: not retried, not in the DLQ


@dataclass(frozen=True)
class Failure:
    """One failed attempt: the OJS error code and type, the message and a backtrace."""

    code: str
    type: str
    message: str
    backtrace: tuple[str, ...] = ()

    @classmethod
    def from_exception(cls, exc: BaseException, code: str = "handler_error") -> Failure:
        """Describe ``exc``; the type is the exception's class name."""
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        backtrace = tuple(line.rstrip() for chunk in lines for line in chunk.splitlines() if line.strip())
        return cls(
            code=code,
            type=type(exc).__name__,
            message=str(exc) or type(exc).__name__,
            backtrace=backtrace[-MAX_BACKTRACE_LINES:],
        )


@dataclass(frozen=True)
class Decision:
    """The outcome of one failure; ``delay_ms`` is set for :attr:`Outcome.RETRY`."""

    outcome: Outcome
    delay_ms: int | None = None
    reason: str = ""


def error_names(exc: BaseException) -> list[str]:
    """Names under which ``exc`` may be listed in ``non_retryable_errors``.

    An explicit OJS error type first (a class attribute ``ojs_error_type =
    "auth.token_expired"``, so dot-namespaced policies like ``auth.*`` work),
    then the class name (``ValueError``), its qualified name with module
    (``myapp.errors.AuthError``), and the same for every base class, so a
    policy naming a base class covers its subclasses.
    """
    explicit = getattr(exc, "ojs_error_type", None)
    names = [explicit] if isinstance(explicit, str) else []
    for klass in type(exc).__mro__:
        if klass in (BaseException, Exception, object):
            continue
        names.append(klass.__name__)
        names.append(f"{klass.__module__}.{klass.__qualname__}")
    return names


def decide(job: Job, attempt: int, exc: BaseException | None = None, *, error_type: str | None = None) -> Decision:
    """Decide what to do after attempt ``attempt`` (1-based) of ``job`` failed with ``exc``.

    ``error_type`` names failures that are not exceptions (``"worker_lost"``).
    """
    policy = job.retry_policy
    terminal = Outcome.DEAD_LETTER if policy.dead_letters_on_exhaustion else Outcome.DISCARD
    if isinstance(exc, Discard):
        return Decision(Outcome.DISCARD, reason="the handler raised Discard")
    if isinstance(exc, DeadLetter):
        return Decision(Outcome.DEAD_LETTER, reason="the handler raised DeadLetter")
    names = error_names(exc) if exc is not None else []
    if error_type:
        names.append(error_type)
    matched = next((name for name in names if policy.is_non_retryable(name)), None)
    if matched:
        return Decision(terminal, reason=f"{matched} is non-retryable")
    max_attempts = max_attempts_of(job)
    if attempt >= max_attempts:
        return Decision(terminal, reason=f"attempt {attempt} of {max_attempts}: retries exhausted")
    delay = retry_delay(policy, attempt) * 1000
    return Decision(Outcome.RETRY, delay_ms=ladder_ms(delay), reason=f"retry {attempt} after {delay:.0f} ms")


def replay_count(job: Job) -> int:
    """How many times ``job`` was replayed from its dead letter queue (``meta["ojs.replay_count"]``)."""
    try:
        return max(0, int((job.meta or {}).get("ojs.replay_count", 0) or 0))
    except (TypeError, ValueError):
        return 0


def record_failure(job: Job, attempt: int, failure: Failure, occurred_at: datetime | None = None) -> Job:
    """The envelope to republish after attempt ``attempt`` failed.

    ``attempt`` becomes the number of executions so far (the header of the
    republished message says ``attempt + 1``); ``error`` is the last failure;
    ``errors[]`` gains an entry (the last :data:`ERROR_HISTORY` are kept) that
    happened at ``occurred_at`` (default: now).
    """
    error = JobError(type=failure.type, message=failure.message, backtrace=list(failure.backtrace) or None)
    entry = {
        "code": failure.code,
        "message": failure.message,
        "type": failure.type,
        "attempt": max(1, attempt),
        "occurred_at": format_timestamp(occurred_at or utcnow()),
    }
    history = [*(job.errors or []), entry][-ERROR_HISTORY:]
    return job.model_copy(update={"attempt": attempt, "error": error, "errors": history})


__all__ = [
    "Decision",
    "Failure",
    "LADDER_MANTISSAS",
    "Outcome",
    "decide",
    "error_names",
    "ladder_ms",
    "ladder_ms_until",
    "record_failure",
    "replay_count",
]
