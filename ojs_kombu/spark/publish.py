"""Rows to jobs, and jobs to the broker: the code every write path of :mod:`ojs_kombu.spark` shares.

:class:`RowMapper` turns one row (a ``pyspark.sql.Row``) into a :class:`Job`
following a :class:`WritePlan`; :func:`publish_rows` publishes a partition's rows
in chunks of ``batch_size`` with pipelined confirms on the Client cached in this
Python process (:func:`cached_client`), and raises :class:`ChunkNotConfirmedError`
as soon as a chunk has a job the broker did not confirm, so Spark retries the task.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from itertools import islice
from typing import Any

from pyspark import TaskContext

from ojs_kombu.amqp.urls import safe_url
from ojs_kombu.client import Client
from ojs_kombu.errors import OjsError, PublishError, ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.jsonvalue import JsonTextError, loads
from ojs_kombu.spark.ids import key_id
from ojs_kombu.spark.options import WritePlan, parse_write_options
from ojs_kombu.spark.values import format_instant, to_json

logger = logging.getLogger("ojs_kombu.spark")

#: ``IdFor(row_index, row) -> id or None``: None lets :meth:`Job.create` draw a random UUIDv7.
IdFor = Callable[[int, Sequence[Any]], str | None]

#: Clients kept open per Python process (one per broker URL, prefix and queue options).
MAX_CACHED_CLIENTS = 4


class ChunkNotConfirmedError(PublishError):
    """A chunk of a partition had jobs the broker did not confirm; the task fails so that Spark retries it."""


@dataclass
class PartitionResult:
    """What one task published: the commit message of a write, and the return value of :func:`enqueue_partition`.

    Attributes:
        partition_id: Spark's partition id (``-1`` outside a task).
        attempt: the task attempt number.
        rows: jobs published and confirmed.
        chunks: chunks published.
        queues: jobs per queue.
    """

    partition_id: int
    attempt: int
    rows: int
    chunks: int
    queues: dict[str, int]


# -- one Client per Python worker process ------------------------------------------------------

_clients: OrderedDict[tuple[Any, ...], Client] = OrderedDict()
_clients_pid = os.getpid()
_clients_lock = threading.Lock()


def connection_name(plan: WritePlan) -> str:
    """The connection name the broker shows for this process's Client (management API / UI)."""
    return f"ojs_kombu.spark {plan.prefix or '-'} pid {os.getpid()}"


def cached_client(plan: WritePlan) -> Client:
    """This process's Client for ``plan``'s broker, prefix and queue options, created on first use.

    A forked child never reuses its parent's connections: the cache starts empty in it.
    """
    global _clients_pid
    key = (plan.url, plan.prefix, plan.queue_options)
    with _clients_lock:
        if _clients_pid != os.getpid():
            _clients.clear()  # sockets inherited through fork belong to the parent
            _clients_pid = os.getpid()
        client = _clients.get(key)
        if client is None:
            client = Client(
                plan.url,
                prefix=plan.prefix,
                queue_options=plan.queue_options,
                pool_size=1,
                window=max(plan.batch_size, 1),
                connection_name=connection_name(plan),
            )
            _clients[key] = client
            logger.info("opened %s in pid %d", client, os.getpid())
            while len(_clients) > MAX_CACHED_CLIENTS:
                _, old = _clients.popitem(last=False)
                old.close()
        else:
            _clients.move_to_end(key)
        return client


# -- rows to jobs -------------------------------------------------------------------------------


class RowMapper:
    """Builds the :class:`Job` of each row of one partition (rows share their fields).

    Parameters:
        plan: the write plan.
        fields: the rows' column names, in order.

    Raises:
        ValidationError: a column named by the plan is missing (:func:`check_schema` checks this on the driver
            for the data source; :func:`enqueue_partition` finds out here).
    """

    def __init__(self, plan: WritePlan, fields: Sequence[str]):
        self.plan = plan
        columns = tuple(fields)
        index = {name: i for i, name in enumerate(columns)}

        def pick(option: str, names: Sequence[str]) -> list[tuple[str, int]]:
            missing = [n for n in names if n not in index]
            if missing:
                raise ValidationError(
                    f"{option}: no column {', '.join(map(repr, missing))} in the rows (columns: {', '.join(columns)})",
                    field=option,
                )
            return [(n, index[n]) for n in names]

        self.args = pick("argsColumns", plan.args_columns) if plan.args_columns is not None else None
        self.kwargs: list[tuple[str, int]] | None
        if plan.kwargs_columns is not None:
            self.kwargs = pick("kwargsColumns", plan.kwargs_columns)
        elif plan.args_columns is None and "args" not in index and "kwargs" not in index:
            self.kwargs = pick("kwargs", plan.default_kwargs(columns))
        else:
            self.kwargs = None
        self.keys = pick("keyColumns", plan.key_columns)
        if plan.job_type is None and "type" not in index:
            raise ValidationError("no job type: set the 'type' option or add a 'type' column", field="type")
        self.column = {name: index.get(name) for name in (*_ROW_FIELDS, "args", "kwargs", "created_at")}
        if not plan.key_columns:
            self.column["created_at"] = None

    def _value(self, row: Sequence[Any], name: str, i: int) -> Any:
        return to_json(row[i], name, naive_is_utc=name in self.plan.utc_columns)

    def job(self, row: Sequence[Any], job_id: str | None) -> Job:
        """The job of ``row``.

        Raises:
            ValidationError: a value cannot be mapped or the job is invalid; the message names the column.
        """
        col = self.column
        if self.args is not None:
            args: Any = [self._value(row, n, i) for n, i in self.args]
        elif col["args"] is not None:
            args = self._value(row, "args", col["args"]) or []
        else:
            args = []
        if self.kwargs is not None:
            kwargs: Any = {n: self._value(row, n, i) for n, i in self.kwargs}
        elif col["kwargs"] is not None:
            kwargs = self._value(row, "kwargs", col["kwargs"])
        else:
            kwargs = None
        options: dict[str, Any] = {"queue": self.plan.queue, "kwargs": kwargs or None, "id": job_id}
        job_type = self.plan.job_type
        for name in _ROW_FIELDS:
            i = col[name]
            if i is None or row[i] is None:
                continue
            value = row[i]
            if name == "type":
                job_type = value
            elif name == "meta":
                options["meta"] = _meta(value)
            elif name in ("scheduled_at", "expires_at") and isinstance(value, datetime):
                options[name] = format_instant(value, naive_is_utc=name in self.plan.utc_columns)
            else:
                options[name] = self._value(row, name, i)
        try:
            return Job.create(job_type or "", args, **options)
        except ValidationError as exc:
            top = exc.field.split(".")[0].split("[")[0] if exc.field else ""
            where = f"column {top!r}" if col.get(top) is not None else f"field {exc.field!r}"
            raise ValidationError(f"{where}: {exc}", field=exc.field) from None

    def id_timestamp_ms(self, row: Sequence[Any]) -> int:
        """The timestamp bits of a derived id: the ``created_at`` column, else ``idTimestamp``, else 0."""
        i = self.column["created_at"]
        value = row[i] if i is not None else None
        if isinstance(value, datetime):
            aware = (
                value.replace(tzinfo=UTC) if value.tzinfo is None and "created_at" in self.plan.utc_columns else value
            )
            return int(aware.astimezone(UTC).timestamp() * 1000)
        if isinstance(value, date):
            return int(datetime(value.year, value.month, value.day, tzinfo=UTC).timestamp() * 1000)
        return self.plan.id_timestamp_ms or 0

    def key_id(self, row: Sequence[Any]) -> str:
        """The deterministic id of ``row`` from its key columns."""
        values = [self._value(row, n, i) for n, i in self.keys]
        return key_id(self.plan.id_namespace, values, self.id_timestamp_ms(row))


_ROW_FIELDS = ("queue", "type", "priority", "scheduled_at", "expires_at", "meta", "tags")


def _meta(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value = loads(value)
        except JsonTextError as exc:
            raise ValidationError(f"column 'meta': the text {exc}", field="meta") from None
        if not isinstance(value, dict):
            raise ValidationError("column 'meta': the JSON text must be an object", field="meta")
        return value
    meta = to_json(value, "meta")
    if not isinstance(meta, dict):
        raise ValidationError("column 'meta' must be a map, a struct or JSON text of an object", field="meta")
    return meta


# -- publishing ---------------------------------------------------------------------------------


def publish_rows(
    rows: Iterable[Any],
    plan: WritePlan,
    *,
    partition_id: int = -1,
    attempt: int = 0,
    id_for: IdFor | None = None,
) -> PartitionResult:
    """Publish one job per row in chunks of ``plan.batch_size``, each chunk confirmed before the next.

    Parameters:
        rows: ``pyspark.sql.Row`` objects (any tuples with ``__fields__``).
        plan: the write plan.
        partition_id, attempt: where this runs, for messages.
        id_for: ``(row index, row) -> id``; by default the key columns' id, or a random id without keys.

    Returns:
        The counts of this partition.

    Raises:
        ValidationError: a row cannot become a job (chunks before it stay published).
        ChunkNotConfirmedError: the broker did not confirm every job of a chunk (the reason is in the message).
    """
    iterator: Iterator[Any] = iter(rows)
    result = PartitionResult(partition_id, attempt, 0, 0, {})
    chunk = list(islice(iterator, plan.batch_size))
    if not chunk:
        return result
    mapper = RowMapper(plan, _fields(chunk[0]))
    if id_for is None and plan.key_columns:
        id_for = lambda _index, row: mapper.key_id(row)  # noqa: E731
    index = 0
    while chunk:
        jobs = []
        for row in chunk:
            jobs.append(mapper.job(row, id_for(index, row) if id_for is not None else None))
            index += 1
        outcomes = cached_client(plan).enqueue_many(jobs)
        failed = [o.error for o in outcomes if o.error is not None]
        if failed:
            first = failed[0]
            raise ChunkNotConfirmedError(
                f"partition {partition_id} attempt {attempt}: {len(failed)} of {len(jobs)} jobs of chunk "
                f"{result.chunks + 1} were not confirmed by {safe_url(plan.url)} ({result.rows + len(jobs) - len(failed)} "
                f"confirmed in this task stay published); first: {type(first).__name__}: {first}",
                job_id=getattr(first, "job_id", None),
            ) from first
        result.rows += len(jobs)
        result.chunks += 1
        for job in jobs:
            result.queues[job.queue] = result.queues.get(job.queue, 0) + 1
        chunk = list(islice(iterator, plan.batch_size))
    return result


def _fields(row: Any) -> Sequence[str]:
    fields = getattr(row, "__fields__", None)
    if fields is None:
        raise OjsError(f"expected pyspark.sql.Row objects (with named fields), got {type(row).__name__}")
    return tuple(fields)


def task_position() -> tuple[int, int]:
    """``(partition id, attempt number)`` of the Spark task running here, ``(-1, 0)`` outside one."""
    context = TaskContext.get()
    if context is None:
        return -1, 0
    return context.partitionId(), context.attemptNumber()


def enqueue_partition(rows: Iterable[Any], **options: Any) -> PartitionResult:
    """Publish one job per row of a partition: for ``foreachPartition`` and ``foreachBatch``; needs no pyarrow.

    ``df.foreachPartition(lambda rows: enqueue_partition(rows, queue="email", type="email.send"))``

    Parameters:
        rows: ``pyspark.sql.Row`` objects.
        options: the write options of the ``ojs`` data source as keywords (``queue``, ``type``,
            ``keyColumns`` or ``key_columns`` — a list or a comma-separated string —, ``batchSize``…).

    Returns:
        What was published (rows, chunks, jobs per queue).

    Raises:
        ValidationError: a bad option, a missing column or a row that cannot become a job.
        ChunkNotConfirmedError: a chunk was not wholly confirmed (the task fails; Spark retries it).
    """
    plan = parse_write_options(options)
    partition_id, attempt = task_position()
    return publish_rows(rows, plan, partition_id=partition_id, attempt=attempt)


__all__ = [
    "MAX_CACHED_CLIENTS",
    "ChunkNotConfirmedError",
    "PartitionResult",
    "RowMapper",
    "cached_client",
    "connection_name",
    "enqueue_partition",
    "publish_rows",
    "task_position",
]
