"""What the broker holds for limits and unique jobs, as the dashboard shows it: permits per limit key, unique locks.

Both are found by their queues' names (:class:`~ojs_kombu.model.naming.Names`), listed by the management API:

* **Limits** (``docs/limits.md``): a key's permit tokens are the quorum queue ``ojs.limit.{key}.permits``
  and permit ``i`` is held while its index queue ``ojs.limit.{key}.held.{i}`` has its (exclusive)
  consumer.  So *total* is the number of index queues (the largest limit seeded), *in use* the index
  queues with a consumer, *available* the tokens ready (a passive declare, exact).  *Waiting*: a quorum
  queue counts as consumers both the waiters subscribed for a token and every holder of an
  unacknowledged token (a ``Basic.Get`` included; measured on RabbitMQ 4.3 and 3.10), so waiting is the
  permit queue's consumers less the permits in use (at least 0).  Across processes: what
  :meth:`~ojs_kombu.amqp.permits.Permits.inspect` cannot count (its ``waiting`` is its own process's).
* **Unique locks** (``docs/unique-jobs.md``): the lock of ``key`` is the queue ``ojs.lock.{key}``,
  held while it has its token; its holder's job id is the message of ``ojs.lock.{key}.holder``,
  read here through the management API's *get* with ``ack_requeue_true`` (what
  :meth:`~ojs_kombu.amqp.locks.UniqueLocks.holder` does over AMQP), for the first
  :data:`LOCKS_SHOWN` locks only.  The counts come from the management API's statistics (refreshed
  every few seconds by the broker).

Without the management API nothing can be listed: the page says so.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from ojs_kombu.amqp.management import ManagementClient, ManagementError
from ojs_kombu.client import Client

#: The unique locks listed with their holder (the count covers them all).
LOCKS_SHOWN = 100

_HOLDER_SUFFIX = ".holder"


@dataclass(frozen=True)
class LimitRow:
    """One concurrency limit key: ``total`` permits (index queues), ``in_use``, ``available``
    (tokens ready; None when unknown), ``waiting`` (None when unknown), ``held`` (the indexes in use)."""

    key: str
    total: int
    in_use: int
    available: int | None
    waiting: int | None
    held: tuple[int, ...] = ()


@dataclass(frozen=True)
class LockRow:
    """One unique lock held: its key (the hash of the job's unique fields), the node hosting it, and
    its holder's job id (None when not read: past :data:`LOCKS_SHOWN`, or no record yet)."""

    key: str
    node: str
    holder: str | None = None


@dataclass
class Holds:
    """The limits and locks found: ``limits`` by key, ``locks`` held (the first :data:`LOCKS_SHOWN`),
    ``lock_count`` (all held), ``per_node`` (locks held per node), ``idle_locks`` (lock queues without
    a token: released or expired, left to ``x-expires``), ``note`` (why something is missing)."""

    limits: list[LimitRow] = field(default_factory=list)
    locks: list[LockRow] = field(default_factory=list)
    lock_count: int = 0
    per_node: dict[str, int] = field(default_factory=dict)
    idle_locks: int = 0
    note: str = ""


def limit_rows(queues: list[dict[str, Any]], head: str) -> dict[str, tuple[int, list[int]]]:
    """The limit keys in a management API queue listing: each key's index count and held indexes.

    Parameters:
        queues: ``/api/queues`` items (``name``, ``consumers``).
        head: the names' start, ``{prefix.}ojs.limit.``.

    Returns:
        ``{key: (total, held indexes)}`` for every key that has a permit queue, by key.
    """
    names = {str(q.get("name", "")): q for q in queues}
    keys = sorted(n[len(head) : -len(".permits")] for n in names if n.startswith(head) and n.endswith(".permits"))
    found: dict[str, tuple[int, list[int]]] = {}
    for key in keys:
        index = re.compile(re.escape(f"{head}{key}.held.") + r"(\d+)")
        total, held = 0, []
        for name, queue in names.items():
            match = index.fullmatch(name)
            if match is not None:
                total += 1
                if queue.get("consumers"):
                    held.append(int(match.group(1)))
        found[key] = (total, sorted(held))
    return found


def lock_rows(queues: list[dict[str, Any]], head: str) -> tuple[list[tuple[str, str]], int]:
    """The unique locks in a management API queue listing.

    Parameters:
        queues: ``/api/queues`` items (``name``, ``messages``, ``node``).
        head: the names' start, ``{prefix.}ojs.lock.``.

    Returns:
        The locks held as ``(key, node)`` by key, and the number of lock queues without a token.
    """
    names = {str(q.get("name", "")): q for q in queues if str(q.get("name", "")).startswith(head)}
    held, idle = [], 0
    for name, queue in sorted(names.items()):
        if name.endswith(_HOLDER_SUFFIX) and name[: -len(_HOLDER_SUFFIX)] in names:
            continue  # a lock's holder record
        if queue.get("messages"):
            held.append((name[len(head) :], str(queue.get("node", ""))))
        else:
            idle += 1
    return held, idle


def _holder(management: ManagementClient, queue: str) -> str | None:
    """The job id in the holder record ``queue`` (read and requeued), or None."""
    path = f"/api/queues/{quote(management.vhost, safe='')}/{quote(queue, safe='')}/get"
    body = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 500}
    try:
        got = management.request("POST", path, body=body)
    except ManagementError:
        return None  # gone meanwhile (released, expired)
    if not got:
        return None
    payload = got[0].get("payload")
    return payload if isinstance(payload, str) and payload else None


def holds(client: Client, management: ManagementClient | None) -> Holds:
    """The limits and unique locks of ``client``'s deployment (see the module).

    Parameters:
        client: the control plane client (its names' prefix, passive declares).
        management: the management API, or None (then nothing is listed).

    Returns:
        What was found.

    Raises:
        OjsError: a passive declare failed (the broker is unreachable).
    """
    if management is None:
        return Holds(note="Limits and locks are found by their queues' names: this needs the management API.")
    limit_head = client.names.limit_permit_queue("")[: -len(".permits")]
    lock_head = client.names.lock_queue("")
    try:
        queues = management.queues(os.path.commonprefix([limit_head, lock_head]))
    except ManagementError as exc:
        return Holds(note=f"The management API did not answer: {exc}")
    found = limit_rows(queues, limit_head)
    counts = client.queue_counts([client.names.limit_permit_queue(k) for k in found])
    limits = []
    for key, (total, held) in found.items():
        tokens = counts.get(client.names.limit_permit_queue(key))
        available = tokens.ready if tokens is not None else None
        waiting = max(0, tokens.consumers - len(held)) if tokens is not None else None
        limits.append(LimitRow(key, total, len(held), available, waiting, tuple(held)))
    locked, idle = lock_rows(queues, lock_head)
    shown = [
        LockRow(key, node, _holder(management, client.names.lock_holder_queue(key)))
        for key, node in locked[:LOCKS_SHOWN]
    ]
    per_node = dict(sorted(Counter(node for _, node in locked).items()))
    return Holds(limits, shown, len(locked), per_node, idle)


__all__ = ["LOCKS_SHOWN", "Holds", "LimitRow", "LockRow", "holds", "limit_rows", "lock_rows"]
