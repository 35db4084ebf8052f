"""Produce OJS jobs from Spark DataFrames, and read dead letters back: a PySpark Python Data Source.

Needs ``pip install ojs-amqp[spark]`` (pyspark >= 4.0; the data source path uses pyarrow,
:func:`enqueue_partition` does not).  One job per row::

    from ojs_kombu.spark import register

    register(spark)  # or spark.dataSource.register(OjsDataSource)
    (customers.select("customer_id", "email")
        .write.format("ojs").mode("append")
        .option("queue", "email").option("type", "email.send")
        .option("keyColumns", "customer_id").option("idNamespace", "welcome-2026")
        .save())

    dead = spark.read.format("ojs").option("source", "dead_letters").option("queue", "email").load()

    query = stream.writeStream.format("ojs").option("queue", "email").option("type", "email.send") \\
        .option("checkpointLocation", "/chk/email").start()

    df.foreachPartition(lambda rows: enqueue_partition(rows, queue="email", type="email.send"))

Write options (strings; names are case-insensitive, ``key_columns`` = ``keyColumns``)
-------------------------------------------------------------------------------------
``url``            broker URL; default ``$OJS_AMQP_URL`` as seen by the driver.
``prefix``         entity prefix (multi-tenant), as ``Client(prefix=)``.
``queue``          the job queue (default ``default``); declared on the driver before any task runs.
``type``           the job type; required unless a ``type`` column gives it per row.
``argsColumns``    comma-separated columns whose values become ``args``, in that order.
``kwargsColumns``  comma-separated columns whose values become ``kwargs`` (``meta.kwargs``).
                   Instead of these two: an ``args`` array column and/or a ``kwargs`` struct or map column.
                   With none of the four, every column that is not a per-row column below becomes a kwarg.
``keyColumns``     comma-separated columns whose values make a deterministic job id (below).
``idNamespace``    hashed with the key values (default ``""``): one namespace per logical run of a pipeline.
``idTimestamp``    timestamp bits of derived ids: epoch milliseconds or RFC 3339 (default 0); a
                   ``created_at`` timestamp/date column, when present with ``keyColumns``, wins.
``batchSize``      jobs per chunk of pipelined, confirmed publishes (default 1000).
``scheduling``     ``true``: also declare the scheduling cascade with the queue.
``maxPriority``, ``maxLength``, ``maxLengthBytes``, ``overflow``, ``messageTtl``, ``queueType``:
                   the queue options of ``Client.declare_queue`` (``QueueOptions``), for every queue declared.
Any other option fails the write on the driver.  Only ``mode("append")`` is accepted.

Per-row columns (override the options; null means "not set")
-------------------------------------------------------------
``queue`` (string), ``type`` (string), ``priority`` (integer), ``scheduled_at`` and ``expires_at``
(timestamp, or RFC 3339 text), ``meta`` (map, struct or JSON text of an object), ``tags`` (array of
strings).  ``created_at`` (timestamp or date) is read only with ``keyColumns``, for the id's time.

Values: Spark -> JSON
---------------------
string, boolean, integers, float/double -> themselves (NaN/infinity refused; integers beyond
±(2**53-1) refused: cast them to string); decimal -> a string in plain notation, always
(``Decimal("12.50")`` -> ``"12.50"``: exact, and the same JSON type for every row); date ->
``"YYYY-MM-DD"``; timestamp -> RFC 3339 in UTC with ``Z``, milliseconds, or microseconds when it
has them (``TimestampType`` is the instant; ``TimestampNTZType`` is read as UTC); array -> array;
struct -> object; map -> object (string or integer keys); binary -> refused, naming the column (cast
it to base64 first).  A refused value fails the task with a ``ValidationError`` naming the column.

Delivery, retries and ids
-------------------------
Options are checked, columns and their types validated and the queue declared in ``writer()`` on
the driver: a bad option or a missing column fails before anything is published.  Each Python worker
process opens one Client on first use (cached; never in ``writer()``), and publishes its partition
in chunks of ``batchSize`` with pipelined publisher confirms.  If any job of a chunk is not confirmed
(Nack, e.g. a full ``x-overflow=reject-publish`` queue, Return, timeout, connection lost past the
client's back-off) the task fails with ``ChunkNotConfirmedError`` naming the reason
(``PublishNackedError: …``), and Spark retries it.  Jobs already confirmed are never taken back, so a
retried task, a speculative copy (``spark.speculation``) or a replayed micro-batch re-sends them:

* with ``keyColumns`` the id is ``uuid7(ms, sha256(["ojs.key", idNamespace, key values]))``:
  the same row gets the same id every time, so duplicates carry the same id;
* a streaming write without keys derives the id from (query id, batch id, partition id, row index):
  a batch replayed after a restart from the checkpoint re-sends the same ids;
* a batch write without keys gives random ids: a retried task re-sends the rows of its confirmed
  chunks under new ids, and those duplicates cannot be told apart.  Use ``keyColumns``.

Removing duplicates needs a store on the consuming side (OJS ``unique``): the library does not
pretend otherwise.  ``commit()`` logs the jobs per partition; ``abort()`` logs which partitions failed.

Dead letters
------------
``spark.read.format("ojs").option("source", "dead_letters").option("queue", "email").load()`` (options
``url``, ``prefix``, ``limit`` = 10000) gives the oldest ``limit`` dead letters with the columns
``id, type, queue, args, kwargs`` (JSON text), ``attempt, error_code, error_message, reason,
dead_lettered_at`` (from ``x-death``), ``death_count, decode_error, envelope`` (the body).  The read
is non-destructive: the letters are fetched unacknowledged on one channel that is then closed, so
the broker keeps each where it was.  Archive them, then remove exactly those with
``Client.purge_dead_letters(queue, ids=[...])``.
"""

from __future__ import annotations

from ojs_kombu.spark.publish import ChunkNotConfirmedError, PartitionResult, enqueue_partition
from ojs_kombu.spark.source import OjsDataSource, register

__all__ = ["ChunkNotConfirmedError", "OjsDataSource", "PartitionResult", "enqueue_partition", "register"]
