"""Structured log fields of a job (DESIGN §10).

Every log record the library writes about a job carries the same four fields
as ``extra``, so a JSON formatter (or ``%(job_id)s`` in a format string) can
index them::

    logger.info("job %s failed", job.id, extra=job_log_extra(job, attempt))

All four keys are always present (``None`` when unknown), so a format string
that names them never fails on a record about an undecodable message.
Credentials never belong in these fields: broker URLs are logged through
:func:`ojs_kombu.amqp.connection.safe_url`.
"""

from __future__ import annotations

from typing import TypedDict

from ojs_kombu.model.job import Job


class JobLogFields(TypedDict):
    """The ``extra`` of a log record about a job."""

    job_id: str | None
    job_type: str | None
    queue: str | None
    attempt: int | None


def job_log_extra(job: Job, attempt: int | None = None) -> JobLogFields:
    """The log fields of ``job``.

    Parameters:
        job: the job the record is about.
        attempt: the 1-based execution the record is about (as ``x-ojs-attempt``);
            default: the one a delivery of ``job`` is, its body ``attempt`` + 1.

    Returns:
        ``{"job_id", "job_type", "queue", "attempt"}``, for ``extra=``.
    """
    return {
        "job_id": job.id,
        "job_type": job.type,
        "queue": job.queue,
        "attempt": job.attempt + 1 if attempt is None else attempt,
    }


def message_log_extra(message_id: object, queue: str | None) -> JobLogFields:
    """The log fields of a message that is not (or not yet) a decoded job.

    Parameters:
        message_id: the message's ``message_id`` property (the job id, when a
            producer followed the binding); anything that is not a string is
            logged as ``None``.
        queue: the OJS queue it was delivered from.

    Returns:
        The same four keys as :func:`job_log_extra`; ``job_type`` and ``attempt`` are ``None``.
    """
    return {
        "job_id": message_id if isinstance(message_id, str) else None,
        "job_type": None,
        "queue": queue,
        "attempt": None,
    }


__all__ = ["JobLogFields", "job_log_extra", "message_log_extra"]
