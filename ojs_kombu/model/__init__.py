"""The binding's data model: jobs and their policies, ids, names, timestamps and JSON checks.

Pure Python and pydantic: nothing here imports kombu or py-amqp.
"""

from ojs_kombu.model.envelope import Job, JobError, RetryPolicy, UniquePolicy, new_job_id
from ojs_kombu.model.naming import Names, job_type_for, ojs_queue_for, validate_job_type, validate_queue_name

__all__ = [
    "Job",
    "JobError",
    "Names",
    "RetryPolicy",
    "UniquePolicy",
    "job_type_for",
    "new_job_id",
    "ojs_queue_for",
    "validate_job_type",
    "validate_queue_name",
]
