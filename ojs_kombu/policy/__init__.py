"""Decisions without I/O: retry outcomes and the delay ladder, back-off, and the scheduling cascade."""

from ojs_kombu.policy.backoff import reconnect_delay, retry_delay
from ojs_kombu.policy.retry import Decision, Failure, Outcome, decide, ladder_ms, ladder_ms_until, record_failure
from ojs_kombu.policy.schedule import Cascade, delay_ms_until

__all__ = [
    "Cascade",
    "Decision",
    "Failure",
    "Outcome",
    "decide",
    "delay_ms_until",
    "ladder_ms",
    "ladder_ms_until",
    "reconnect_delay",
    "record_failure",
    "retry_delay",
]
