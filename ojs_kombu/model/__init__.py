"""The binding's data model: jobs and their policies, ids, names, timestamps and JSON checks.

Pure Python and pydantic: nothing here imports kombu or py-amqp.  Modules, bottom up:
``_problems`` (validation problems with a path), ``timefmt`` (timestamps, durations),
``jsonvalue`` (JSON-native values, JSON text in and out), ``ids`` (UUIDv7 job ids),
``naming`` (job type and queue name rules, AMQP entity names), ``body`` (an envelope's
JSON text), ``fields`` and ``base`` (the models' field types and machinery),
``policies`` (retry and unique policies), ``ratelimit`` (the rate limit policy), ``job_create``
and ``job_read`` (``Job.create``'s argument checks, the fast tolerant read), ``job`` (the envelope),
``cron`` (cron job definitions and expressions), ``workflow`` (chain, group, batch: definitions, states, results).
"""

from ojs_kombu.model.body import MAX_ENVELOPE_BYTES
from ojs_kombu.model.cron import CronExpression, CronJob, OverlapPolicy, parse_timezone
from ojs_kombu.model.fields import JobState
from ojs_kombu.model.ids import JOB_ID_PATTERN, new_job_id
from ojs_kombu.model.job import SPEC_VERSION, Job, JobError
from ojs_kombu.model.jsonvalue import MAX_JSON_DEPTH, MAX_SAFE_INTEGER, ensure_json_native
from ojs_kombu.model.naming import (
    JOB_TYPE_PATTERN,
    MAX_JOB_TYPE_LENGTH,
    MAX_QUEUE_NAME_LENGTH,
    QUEUE_NAME_PATTERN,
    Names,
    job_type_for,
    ojs_queue_for,
    validate_job_type,
    validate_queue_name,
)
from ojs_kombu.model.policies import UNLIMITED_ATTEMPTS, RetryPolicy, UniquePolicy
from ojs_kombu.model.ratelimit import RATE_LIMIT_KEY_PATTERN, RateLimitPolicy, RateWindow
from ojs_kombu.model.timefmt import format_duration, format_timestamp, parse_duration, parse_timestamp, utcnow
from ojs_kombu.model.workflow import Batch, Chain, Group, WorkflowContext, batch, chain, evaluate, group
from ojs_kombu.model.workflow_info import StepInfo, WorkflowInfo

__all__ = [
    "Batch",
    "Chain",
    "Group",
    "WorkflowContext",
    "WorkflowInfo",
    "StepInfo",
    "batch",
    "chain",
    "evaluate",
    "group",
    "JOB_ID_PATTERN",
    "JOB_TYPE_PATTERN",
    "MAX_ENVELOPE_BYTES",
    "MAX_JOB_TYPE_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_QUEUE_NAME_LENGTH",
    "MAX_SAFE_INTEGER",
    "QUEUE_NAME_PATTERN",
    "RATE_LIMIT_KEY_PATTERN",
    "SPEC_VERSION",
    "CronExpression",
    "CronJob",
    "UNLIMITED_ATTEMPTS",
    "Job",
    "JobError",
    "JobState",
    "Names",
    "OverlapPolicy",
    "RateLimitPolicy",
    "RateWindow",
    "RetryPolicy",
    "UniquePolicy",
    "ensure_json_native",
    "format_duration",
    "format_timestamp",
    "job_type_for",
    "new_job_id",
    "ojs_queue_for",
    "parse_duration",
    "parse_timezone",
    "parse_timestamp",
    "utcnow",
    "validate_job_type",
    "validate_queue_name",
]
