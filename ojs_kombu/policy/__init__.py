"""Decisions without I/O: retry outcomes and the delay ladder, back-off, the scheduling cascade, cron fire times,
unique keys, what follows a workflow job's end, rate limit windows."""

from ojs_kombu.policy.backoff import reconnect_delay, retry_delay
from ojs_kombu.policy.cron import Due, due, evaluation_delay, next_fire
from ojs_kombu.policy.ratelimit import WindowSchedule
from ojs_kombu.policy.retry import Decision, Failure, Outcome, decide, ladder_ms, ladder_ms_until, record_failure
from ojs_kombu.policy.schedule import Cascade, delay_ms_until
from ojs_kombu.policy.unique import (
    DEFAULT_KEYS,
    DEFAULT_ON_CONFLICT,
    DEFAULT_STATES,
    canonical_json,
    effective_keys,
    effective_on_conflict,
    effective_states,
    job_unique_key,
    period_end,
    unique_key,
)
from ojs_kombu.policy.workflow import (
    Enqueue,
    Finished,
    OpenFanIn,
    Report,
    WorkflowAction,
    advance_workflow,
    after_fan_in,
    callbacks_fan_in_id,
    start_workflow,
)

__all__ = [
    "Cascade",
    "DEFAULT_KEYS",
    "DEFAULT_ON_CONFLICT",
    "DEFAULT_STATES",
    "Decision",
    "Due",
    "Enqueue",
    "Finished",
    "OpenFanIn",
    "Report",
    "WorkflowAction",
    "advance_workflow",
    "after_fan_in",
    "callbacks_fan_in_id",
    "start_workflow",
    "Failure",
    "Outcome",
    "canonical_json",
    "WindowSchedule",
    "decide",
    "delay_ms_until",
    "due",
    "evaluation_delay",
    "next_fire",
    "effective_keys",
    "effective_on_conflict",
    "effective_states",
    "job_unique_key",
    "ladder_ms",
    "ladder_ms_until",
    "period_end",
    "reconnect_delay",
    "record_failure",
    "retry_delay",
    "unique_key",
]
