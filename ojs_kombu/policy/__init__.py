"""Decisions without I/O: retry outcomes and the delay ladder, back-off, the scheduling cascade, cron fire times,
rate limit windows."""

from ojs_kombu.policy.backoff import reconnect_delay, retry_delay
from ojs_kombu.policy.cron import Due, due, evaluation_delay, next_fire
from ojs_kombu.policy.ratelimit import WindowSchedule
from ojs_kombu.policy.retry import Decision, Failure, Outcome, decide, ladder_ms, ladder_ms_until, record_failure
from ojs_kombu.policy.schedule import Cascade, delay_ms_until

__all__ = [
    "Cascade",
    "Decision",
    "Due",
    "Failure",
    "Outcome",
    "WindowSchedule",
    "decide",
    "delay_ms_until",
    "due",
    "evaluation_delay",
    "ladder_ms",
    "ladder_ms_until",
    "next_fire",
    "reconnect_delay",
    "record_failure",
    "retry_delay",
]
