"""The ``ojs`` PySpark Python Data Source: batch and streaming writes of jobs, reads of dead letters.

Where each part runs (PySpark pickles the writer to every task):

* ``writer()`` / ``streamWriter()`` on the driver: options parsed and checked
  against the schema, the queue declared (a short-lived connection, closed at once).
* ``write()`` in a Python worker process of each task: rows published through the
  process's cached Client (:func:`cached_client`), opened on first use.
* ``commit()`` / ``abort()`` on the driver, in yet another process: they log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ojs_kombu.client import Client
from ojs_kombu.errors import ValidationError
from ojs_kombu.spark.deadletters import DEAD_LETTER_SCHEMA, DeadLetterReader
from ojs_kombu.spark.ids import stream_id
from ojs_kombu.spark.options import WritePlan, check_schema, normalize, parse_write_options
from ojs_kombu.spark.publish import PartitionResult, publish_rows, task_position

logger = logging.getLogger("ojs_kombu.spark")


@dataclass
class OjsCommitMessage(WriterCommitMessage):
    """What one successful task sends back to ``commit()``."""

    result: PartitionResult


class OjsDataSource(DataSource):
    """The ``ojs`` data source (see :mod:`ojs_kombu.spark` for its options).

    Parameters:
        options: the reader's or writer's options (strings, case-insensitive).
    """

    @classmethod
    def name(cls) -> str:
        """The short name: ``df.write.format("ojs")``."""
        return "ojs"

    def schema(self) -> StructType:
        """The schema of a read: the dead letter columns."""
        return DEAD_LETTER_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """A reader of dead letters (``source=dead_letters``).

        Raises:
            ValidationError: another ``source``, or a bad option.
        """
        source = normalize(self.options).get("source")
        if source != "dead_letters":
            raise ValidationError(
                f"the ojs data source reads only dead letters: set option source=dead_letters (got {source!r})",
                field="source",
            )
        return DeadLetterReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The batch writer, after the options are checked and the queue declared.

        Raises:
            ValidationError: ``overwrite`` (jobs cannot be overwritten), a bad option or a missing column.
            BrokerConnectionError, BrokerRefusedError, TopologyConflictError: declaring the queue failed.
        """
        return OjsBatchWriter(_prepare(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The streaming writer (same options as the batch writer); ``complete`` output mode is refused."""
        return OjsStreamWriter(_prepare(self.options, schema, overwrite, streaming=True))


def _prepare(options: Any, schema: StructType, overwrite: bool, *, streaming: bool = False) -> WritePlan:
    if overwrite:
        raise ValidationError(
            "the ojs data source only appends: published jobs cannot be overwritten; use mode('append')"
            + (" (streaming: outputMode('append') or 'update')" if streaming else ""),
            field="mode",
        )
    plan = check_schema(parse_write_options(options), schema)
    with Client(
        plan.url,
        prefix=plan.prefix,
        queue_options=plan.queue_options,
        pool_size=1,
        connection_name="ojs_kombu.spark driver",
    ) as client:
        client.declare_queue(plan.queue, scheduling=plan.scheduling)
    return plan


def _log_commit(messages: list[WriterCommitMessage | None], what: str) -> None:
    results = [m.result for m in messages if isinstance(m, OjsCommitMessage)]
    logger.info("ojs: %s published %d jobs in %d partitions", what, sum(r.rows for r in results), len(results))
    for r in results:
        logger.info(
            "ojs: %s partition %d (attempt %d): %d jobs in %d chunks %s",
            what,
            r.partition_id,
            r.attempt,
            r.rows,
            r.chunks,
            r.queues,
        )


def _log_abort(messages: list[WriterCommitMessage | None], what: str) -> None:
    failed = [i for i, m in enumerate(messages) if m is None]
    done = sum(m.result.rows for m in messages if isinstance(m, OjsCommitMessage))
    logger.error(
        "ojs: %s failed in partition(s) %s; %d jobs of the partitions that succeeded, and whatever chunks the failed "
        "tasks had confirmed, are published and are not taken back (writing again re-sends them: with keyColumns, "
        "with the same ids)",
        what,
        failed,
        done,
    )


class OjsBatchWriter(DataSourceWriter):
    """Publishes each partition's rows as jobs (``df.write.format("ojs")``)."""

    def __init__(self, plan: WritePlan):
        self.plan = plan

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        """Publish this task's rows; ids from the key columns, else random.

        Raises:
            ValidationError, ChunkNotConfirmedError: see :func:`publish_rows`.
        """
        partition_id, attempt = task_position()
        return OjsCommitMessage(publish_rows(iterator, self.plan, partition_id=partition_id, attempt=attempt))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Log the counts per partition."""
        _log_commit(messages, "write")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Log which partitions failed, and that confirmed jobs stay published."""
        _log_abort(messages, "write")


class OjsStreamWriter(DataSourceStreamWriter):
    """Publishes each micro-batch (``df.writeStream.format("ojs")``).

    Without key columns a row's id is derived from (query id, batch id, partition id,
    row index), so a micro-batch replayed after a restart re-sends the same ids.
    """

    def __init__(self, plan: WritePlan):
        self.plan = plan

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        """Publish this task's rows of the micro-batch.

        Raises:
            ValidationError, ChunkNotConfirmedError: see :func:`publish_rows`.
        """
        partition_id, attempt = task_position()
        id_for = None
        context = TaskContext.get()
        if not self.plan.key_columns and context is not None:
            query_id = context.getLocalProperty("sql.streaming.queryId") or ""
            batch_id = int(context.getLocalProperty("streaming.sql.batchId") or -1)
            unix_ms = self.plan.id_timestamp_ms or 0

            def id_for(index: int, _row: Any) -> str:
                return stream_id(query_id, batch_id, partition_id, index, unix_ms)

        result = publish_rows(iterator, self.plan, partition_id=partition_id, attempt=attempt, id_for=id_for)
        return OjsCommitMessage(result)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log the counts of micro-batch ``batchId`` per partition."""
        _log_commit(messages, f"micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log which partitions of micro-batch ``batchId`` failed."""
        _log_abort(messages, f"micro-batch {batchId}")


def register(spark: SparkSession) -> None:
    """Register :class:`OjsDataSource` with ``spark`` under the name ``ojs``."""
    spark.dataSource.register(OjsDataSource)


__all__ = ["OjsBatchWriter", "OjsCommitMessage", "OjsDataSource", "OjsStreamWriter", "register"]
