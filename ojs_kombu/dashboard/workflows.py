"""The workflows the dashboard lists: found by their record streams, read through ``Client.workflow``.

Every workflow enqueued with ``Client.enqueue_workflow`` has its record stream
``ojs.workflow.{id}.log`` (:mod:`ojs_kombu.amqp.workflowlog`: its definition and every step's
outcome), kept by the broker for 7 days.  The management API lists those streams; a workflow id is a
UUIDv7, so its name sorts by creation time and the :data:`SHOWN` newest are read, without reading the
others.  Reading a workflow that has not ended appends a read marker to its stream (what
``Client.workflow`` does); one that ended does not change any more, so it is kept (up to
:data:`KEPT` of them) and not read again.  Without the management API nothing can be listed: a
workflow is still shown by its id.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from ojs_kombu.amqp.management import ManagementClient, ManagementError
from ojs_kombu.client import Client
from ojs_kombu.errors import NotFoundError, ValidationError
from ojs_kombu.model.ids import UUID_RE
from ojs_kombu.model.workflow_info import WorkflowInfo

#: Workflows listed on the Workflows page, newest first.
SHOWN = 25
#: Workflows that ended, kept in memory so that they are not read again.
KEPT = 1000
_ENDED = frozenset({"completed", "failed", "cancelled"})
_LOG_SUFFIX = ".log"


@dataclass
class Listing:
    """The workflows found: ``workflows`` (the newest :data:`SHOWN`, newest first), ``total`` (record
    streams found), ``unreadable`` (ids whose stream could not be read: gone meanwhile, no definition),
    ``note`` (why nothing could be listed)."""

    workflows: list[WorkflowInfo] = field(default_factory=list)
    total: int = 0
    unreadable: list[str] = field(default_factory=list)
    note: str = ""


def workflow_ids(queues: list[dict[str, object]], head: str) -> list[str]:
    """The workflow ids of the record streams in a management API queue listing, newest first.

    Parameters:
        queues: ``/api/queues`` items (``name``).
        head: the streams' names' start, ``{prefix.}ojs.workflow.``.

    Returns:
        The ids (UUIDv7: sorted by creation time, newest first).
    """
    found = []
    for queue in queues:
        name = str(queue.get("name", ""))
        if name.startswith(head) and name.endswith(_LOG_SUFFIX):
            workflow_id = name[len(head) : -len(_LOG_SUFFIX)]
            if UUID_RE.fullmatch(workflow_id):
                found.append(workflow_id)
    return sorted(found, reverse=True)


class Workflows:
    """Reads workflows for the pages, keeping those that ended.

    Parameters:
        client: the control plane client.
        management: the management API (to list the record streams), or None.
    """

    def __init__(self, client: Client, management: ManagementClient | None) -> None:
        self.client = client
        self.management = management
        self._ended: OrderedDict[str, WorkflowInfo] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, workflow_id: str) -> WorkflowInfo:
        """The state of one workflow (kept once it ended).

        Parameters:
            workflow_id: its id.

        Returns:
            Its state.

        Raises:
            NotFoundError: no such workflow.
            OjsError: the broker refused the read.
        """
        with self._lock:
            kept = self._ended.get(workflow_id)
        if kept is not None:
            return kept
        info = self.client.workflow(workflow_id)
        if info.state in _ENDED:
            with self._lock:
                self._ended[workflow_id] = info
                while len(self._ended) > KEPT:
                    self._ended.popitem(last=False)
        return info

    def recent(self, shown: int = SHOWN) -> Listing:
        """The newest workflows (see the module).

        Parameters:
            shown: how many to read.

        Returns:
            What was found.

        Raises:
            OjsError: the broker refused a read (other than a stream gone meanwhile).
        """
        if self.management is None:
            return Listing(
                note="Workflows are found by their record streams' names: listing them needs the management API."
            )
        head = self.client.names.workflow_log_stream("")[: -len(_LOG_SUFFIX)]
        try:
            ids = workflow_ids(self.management.queues(head), head)
        except ManagementError as exc:
            return Listing(note=f"The management API did not answer: {exc}")
        listing = Listing(total=len(ids))
        for workflow_id in ids[:shown]:
            try:
                listing.workflows.append(self.get(workflow_id))
            except (NotFoundError, ValidationError):
                listing.unreadable.append(workflow_id)
        return listing


__all__ = ["KEPT", "SHOWN", "Listing", "Workflows", "workflow_ids"]
