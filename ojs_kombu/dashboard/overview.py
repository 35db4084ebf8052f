"""The OJS queues at a glance: the rows of ``ojs-amqp status`` and of the dashboard's overview.

Where each number comes from is described in :mod:`ojs_kombu.cli.status`.  This module imports
neither Starlette nor click, so the CLI imports it without the ``dashboard`` extra.
:attr:`Snapshot.note` may carry a broker error's text: redact it before showing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ojs_kombu.amqp.management import Management, ManagementClient, ManagementError, management_client
from ojs_kombu.client import Client
from ojs_kombu.errors import ValidationError


@dataclass
class QueueStatus:
    """One row of ``status``; None where the value is unknown."""

    queue: str
    exists: bool
    ready: int | None = None
    unacked: int | None = None
    consumers: int | None = None
    retrying: int | None = None
    dead: int | None = None
    held: int | None = None
    paused: bool | None = None
    publish_rate: float | None = None
    deliver_rate: float | None = None
    ack_rate: float | None = None


@dataclass
class Snapshot:
    """What ``status`` shows: the rows, the scheduling cascade's total, and where the numbers came from;
    ``levels``: the jobs waiting in each cascade level (None: unknown), which bound when they come due."""

    queues: list[QueueStatus]
    scheduled: int | None
    management: bool
    note: str = ""
    levels: list[int | None] = field(default_factory=list)

    def coming_due(self) -> list[tuple[str, int]]:
        """The scheduled jobs by when they come due at the latest: ``[(label, count)]`` for "1 min",
        "1 h", "1 day" and "later".  A job in cascade level ``k`` has less than ``2**(k+1)`` ms left
        (:mod:`ojs_kombu.policy.schedule`), so a level is counted under the first horizon it fits.
        Empty when no level's count is known."""
        if not any(n is not None for n in self.levels):
            return []
        horizons = [("1 min", 60_000), ("1 h", 3_600_000), ("1 day", 86_400_000), ("later", None)]
        due = dict.fromkeys([label for label, _ in horizons], 0)
        for level, count in enumerate(self.levels):
            label = next(name for name, ms in horizons if ms is None or 2 ** (level + 1) <= ms)
            due[label] += count or 0
        return list(due.items())

    def totals(self) -> dict[str, Any]:
        """The totals line of ``status --json``."""

        def total(field: str) -> int | None:
            values = [getattr(q, field) for q in self.queues if q.exists]
            return None if any(v is None for v in values) else sum(values)

        return {
            "totals": {
                "ready": total("ready"),
                "retrying": total("retrying"),
                "dead": total("dead"),
                "held": total("held"),
                "scheduled": self.scheduled,
            },
            "management": self.management,
        }


def _held(queue: dict[str, Any] | None) -> int:
    """Dead letters ``queue`` holds until their target confirms them (``messages_dlx``: quorum queues'
    at-least-once dead lettering); 0 for a classic queue (it dead-letters at most once, holding none)."""
    return int((queue or {}).get("messages_dlx") or 0)


def _rate(queue: dict[str, Any], stat: str) -> float:
    return float(((queue.get("message_stats") or {}).get(f"{stat}_details") or {}).get("rate", 0.0))


def snapshot(
    client: Client, management: ManagementClient | None, only: Sequence[str], *, paused: bool = True
) -> Snapshot:
    """Read the status of the OJS queues (see the module docstring).

    Parameters:
        client: the client whose broker and prefix are read.
        management: the management API, or None.
        only: these OJS queues only (required without the management API).
        paused: read the control streams (their replay costs about 0.1 ms per retained cancel).

    Returns:
        The snapshot.

    Raises:
        ValidationError: no management API answered and no queue was named.
        BrokerConnectionError, BrokerRefusedError: the broker could not be read.
    """
    names = client.names
    listed: dict[str, dict[str, Any]] | None = None
    note = ""
    cascade = [client.cascade.queue(level) for level in range(client.cascade.levels)]
    unanswered = ""
    if management is not None:
        try:
            listed = {q["name"]: q for q in management.queues(names.job_queue(""))}
        except ManagementError as exc:
            unanswered = (
                management.unreachable(exc)
                if isinstance(management, Management)
                else f"the management API at {management.base_url} did not answer: {exc}"
            )
            note = f"unacked, retrying and rates unknown: {unanswered}"
    if listed is None and not only:
        # The broker itself first: a wrong password or a closed port is the cause to report
        # (BrokerRefusedError, BrokerConnectionError), not the management API it also broke.
        client.queue_counts(cascade)
        raise ValidationError(
            (unanswered or "no management API (--management-url '')") + "; or name the queues with --queue",
            field="queue",
        )
    if listed is not None:
        found = sorted(q for q in map(names.queue_from_job_queue, listed) if q is not None)
        queues = [q for q in found if not only or q in only] + [q for q in only if q not in found]
    else:
        queues = list(dict.fromkeys(only))
    retry_head = names.job_queue("retry.")
    retry_queues: dict[str, list[str]] = {q: [] for q in queues}
    for name in listed or ():
        if name.startswith(retry_head) and "." in name[len(retry_head) :]:
            owner = name[len(retry_head) :].rsplit(".", 1)[0]
            if owner in retry_queues:
                retry_queues[owner].append(name)
    counts = client.queue_counts(
        [
            *(names.job_queue(q) for q in queues),
            *(names.dead_letter_queue(q) for q in queues),
            *(r for q in queues for r in retry_queues[q]),
            *cascade,
        ]
    )
    existing = [q for q in queues if counts[names.job_queue(q)] is not None]
    pauses = client.paused_queues(existing) if existing and paused else {}
    rows = []
    for queue in queues:
        own = counts[names.job_queue(queue)]
        if own is None:
            rows.append(QueueStatus(queue, exists=False))
            continue
        stats = (listed or {}).get(names.job_queue(queue))
        dead = counts[names.dead_letter_queue(queue)]
        row = QueueStatus(
            queue,
            exists=True,
            ready=own.ready,
            consumers=own.consumers,
            dead=dead.ready if dead is not None else 0,
            paused=pauses.get(queue),
        )
        if listed is not None:
            row.retrying = sum(c.ready for r in retry_queues[queue] if (c := counts[r]) is not None)
            row.held = sum(_held(listed.get(name)) for name in (names.job_queue(queue), *retry_queues[queue]))
        if stats is not None:
            row.unacked = int(stats.get("messages_unacknowledged", 0) or 0)
            row.publish_rate = _rate(stats, "publish")
            row.deliver_rate = _rate(stats, "deliver_get")
            row.ack_rate = _rate(stats, "ack")
        rows.append(row)
    scheduled = sum(c.ready for level in cascade if (c := counts[level]) is not None)
    levels = [c.ready if (c := counts[level]) is not None else None for level in cascade]
    return Snapshot(rows, scheduled, listed is not None, note, levels)


__all__ = ["Management", "QueueStatus", "Snapshot", "management_client", "snapshot"]
