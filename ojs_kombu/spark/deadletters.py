"""Dead letters as DataFrame rows (``spark.read.format("ojs").option("source", "dead_letters")``).

The read is :meth:`Client.dead_letters`: the oldest ``limit`` messages of
``ojs.queue.dlx.{queue}`` are fetched with ``Basic.Get`` on one channel that is
then closed without acking, so the broker puts every one back where it was: the
dead letter queue is unchanged afterwards (count and order).  Up to ``limit``
messages are held unacknowledged while the read runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from ojs_kombu.amqp.urls import resolve_url
from ojs_kombu.client import Client
from ojs_kombu.errors import ValidationError
from ojs_kombu.model.jsonvalue import dumps
from ojs_kombu.model.naming import Names, validate_queue_name
from ojs_kombu.runtime.deadletter import DeadLetterEntry
from ojs_kombu.spark.options import normalize

#: Dead letters read at most when ``limit`` is not given.
DEFAULT_READ_LIMIT = 10_000

DEAD_LETTER_SCHEMA = StructType(
    [
        StructField("id", StringType()),
        StructField("type", StringType()),
        StructField("queue", StringType()),
        StructField("args", StringType()),
        StructField("kwargs", StringType()),
        StructField("attempt", IntegerType()),
        StructField("error_code", StringType()),
        StructField("error_type", StringType()),
        StructField("error_message", StringType()),
        StructField("failed_at", TimestampType()),
        StructField("reason", StringType()),
        StructField("dead_lettered_at", TimestampType()),
        StructField("death_count", LongType()),
        StructField("decode_error", StringType()),
        StructField("envelope", StringType()),
    ]
)
"""The columns of a dead letter read: ``args``/``kwargs``/``envelope`` are JSON text;
``attempt``, ``error_code``, ``error_type``, ``error_message`` and ``failed_at`` are the
final failure, the one that sent the job there, in every dead-letter mode
(:class:`~ojs_kombu.runtime.deadletter.DeadLetterEntry`); ``reason`` is the first ``x-death``
entry's (``"republished"`` for letters a worker republished with their final failure) and
``dead_lettered_at`` its time, else the final failure's."""

_READ_OPTIONS = {"source", "url", "prefix", "queue", "limit"}


def entry_row(entry: DeadLetterEntry) -> tuple[Any, ...]:
    """One dead letter as a row of :data:`DEAD_LETTER_SCHEMA`."""
    job = entry.job
    return (
        job.id if job is not None else entry.message_id,
        job.type if job is not None else None,
        job.queue if job is not None else None,
        dumps(job.args) if job is not None else None,
        dumps(job.kwargs) if job is not None else None,
        entry.attempt,
        entry.error_code,
        entry.error_type,
        entry.error_message,
        entry.failed_at,
        entry.reason,
        entry.dead_at,
        entry.death_count,
        entry.decode_error,
        entry.body.decode("utf-8", "replace"),
    )


class DeadLetterReader(DataSourceReader):
    """Reads one queue's dead letters in one partition (the options are checked on the driver).

    Parameters:
        options: ``queue`` (required), ``url``, ``prefix``, ``limit``.

    Raises:
        ValidationError: a missing queue or a bad option.
    """

    def __init__(self, options: Mapping[str, Any]):
        opts = normalize(options)
        unknown = sorted(set(opts) - _READ_OPTIONS)
        if unknown:
            raise ValidationError(
                f"unknown option(s) {', '.join(unknown)} for source=dead_letters; known: {', '.join(sorted(_READ_OPTIONS))}",
                field=unknown[0],
            )
        if not opts.get("queue"):
            raise ValidationError("source=dead_letters needs the 'queue' option", field="queue")
        self.queue = validate_queue_name(str(opts["queue"]))
        self.url = resolve_url(opts.get("url") or None)
        self.prefix = str(opts.get("prefix") or "")
        Names(self.prefix)
        try:
            self.limit = int(opts.get("limit", DEFAULT_READ_LIMIT))
        except ValueError:
            self.limit = 0
        if self.limit < 1:
            raise ValidationError(f"option limit must be an integer >= 1, got {opts.get('limit')!r}", field="limit")

    def partitions(self) -> list[InputPartition]:
        """One partition: a queue is read in order by one consumer."""
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """The dead letters, oldest first, left in the queue.

        Raises:
            NotFoundError: the dead letter queue does not exist.
        """
        with Client(self.url, prefix=self.prefix, declare=False, pool_size=1) as client:
            entries = client.dead_letters(self.queue, limit=self.limit)
        for entry in entries:
            yield entry_row(entry)


__all__ = ["DEAD_LETTER_SCHEMA", "DEFAULT_READ_LIMIT", "DeadLetterReader", "entry_row"]
