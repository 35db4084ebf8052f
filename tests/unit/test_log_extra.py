"""The structured fields of log records about jobs (DESIGN §10)."""

from __future__ import annotations

import logging

from ojs_kombu import Job
from ojs_kombu.observability.logs import job_log_extra, message_log_extra


def test_job_fields() -> None:
    job = Job.create("email.send", [], queue="email")
    assert job_log_extra(job, 2) == {"job_id": job.id, "job_type": "email.send", "queue": "email", "attempt": 2}
    assert job_log_extra(job)["attempt"] == job.attempt + 1 == 1  # the execution a delivery of it is


def test_message_fields_have_the_same_keys() -> None:
    assert message_log_extra(123, "email") == {"job_id": None, "job_type": None, "queue": "email", "attempt": None}
    assert message_log_extra("abc", None)["job_id"] == "abc"


def test_a_format_string_can_name_the_fields() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "failed", None, None)
    record.__dict__.update(message_log_extra(None, "email"))
    assert logging.Formatter("%(job_id)s %(job_type)s %(queue)s %(attempt)s %(message)s").format(record) == (
        "None None email None failed"
    )
