"""The replays this dashboard made, so that a job's page can say its outcome predates one.

An INFO answer (:class:`~ojs_kombu.model.info.JobInfo`) does not say that the job was replayed
since: a job replayed and not yet run again is still ``discarded`` with its old error.  The
dashboard remembers when it replayed each job (in memory, the latest ``size`` jobs); a replay
made elsewhere (``ojs-amqp dlq replay``, another dashboard) or before a restart is not known
here, and the page then shows the INFO answer as it is.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from datetime import datetime

from ojs_kombu.model.info import JobInfo


class Replays:
    """When this dashboard last replayed each job; thread-safe.

    Parameters:
        size: jobs remembered (the oldest are forgotten first).
    """

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._at: OrderedDict[str, datetime] = OrderedDict()

    def record(self, job_ids: Iterable[str], at: datetime) -> None:
        """Note that ``job_ids`` were replayed at ``at``."""
        with self._lock:
            for job_id in job_ids:
                self._at.pop(job_id.lower(), None)
                self._at[job_id.lower()] = at
            while len(self._at) > self._size:
                self._at.popitem(last=False)

    def last(self, job_id: str) -> datetime | None:
        """When ``job_id`` was last replayed here, or None."""
        with self._lock:
            return self._at.get(job_id.lower())


def predates(info: JobInfo | None, replayed_at: datetime | None) -> bool:
    """Whether ``info`` is an outcome from before the replay at ``replayed_at`` (the replayed job has
    not started since): a finished state whose last time (finished, else started) is earlier.

    Parameters:
        info: the INFO answer, or None.
        replayed_at: the job's last known replay, or None.

    Returns:
        True when the page must say that what it shows comes from before the replay.
    """
    if info is None or replayed_at is None or not info.finished:
        return False
    last = info.finished_at or info.started_at
    return last is None or last < replayed_at


__all__ = ["Replays", "predates"]
