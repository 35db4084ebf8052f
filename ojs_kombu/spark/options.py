"""The write options of the ``ojs`` data source and :func:`enqueue_partition`, parsed into a :class:`WritePlan`.

Spark hands a data source its options as strings in a case-insensitive dict;
:func:`enqueue_partition` takes Python keywords.  Both go through
:func:`parse_write_options`: names are compared without case and underscores
(``keyColumns``, ``keycolumns`` and ``key_columns`` are one option), values may
be strings or native values.  :func:`check_schema` then checks the plan against
a DataFrame's schema, so a missing column or an unusable type fails on the
driver, before anything is published.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DateType,
    IntegralType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from ojs_kombu.amqp.urls import resolve_url
from ojs_kombu.errors import ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.naming import Names
from ojs_kombu.model.timefmt import parse_timestamp
from ojs_kombu.wire.entities import QueueOptions

#: Chunk size of pipelined publishes when ``batchSize`` is not given.
DEFAULT_BATCH_SIZE = 1000

#: Per-row columns that set a job field rather than an argument.
ROW_COLUMNS = ("queue", "type", "priority", "scheduled_at", "expires_at", "meta", "tags")

_QUEUE_OPTIONS = {
    "maxpriority": "max_priority",
    "maxlength": "max_length",
    "maxlengthbytes": "max_length_bytes",
    "overflow": "overflow",
    "messagettl": "message_ttl",
    "queuetype": "queue_type",
}
_WRITE_OPTIONS = {
    "url",
    "prefix",
    "queue",
    "type",
    "argscolumns",
    "kwargscolumns",
    "keycolumns",
    "idnamespace",
    "idtimestamp",
    "batchsize",
    "scheduling",
    *_QUEUE_OPTIONS,
}
# Options Spark itself may pass along with the user's (a streaming sink's checkpoint, a path).
_SPARK_OPTIONS = {"path", "checkpointlocation"}


def normalize(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` keyed by lowercase names without underscores; ``None`` values dropped."""
    return {key.lower().replace("_", ""): value for key, value in options.items() if value is not None}


@dataclass(frozen=True)
class WritePlan:
    """What to publish for each row: resolved on the driver, pickled to every task.

    Attributes:
        url: the broker URL (``url`` option, else ``$OJS_AMQP_URL`` on the driver).
        prefix: the entity prefix.
        queue: the default queue (a ``queue`` column overrides it per row).
        job_type: the default job type (a ``type`` column overrides it per row).
        args_columns: columns that become ``args`` in this order, or None.
        kwargs_columns: columns that become ``kwargs``, or None (see :attr:`default_kwargs`).
        key_columns: columns whose values make the job id (empty: no deterministic ids).
        id_namespace: namespace hashed with the key values.
        id_timestamp_ms: timestamp bits of derived ids when there is no ``created_at`` column.
        batch_size: jobs per pipelined chunk.
        scheduling: declare the scheduling cascade with the queue.
        queue_options: arguments of declared job queues.
        utc_columns: columns whose naive datetimes are UTC (``TimestampNTZType``).
    """

    url: str
    prefix: str = ""
    queue: str = "default"
    job_type: str | None = None
    args_columns: tuple[str, ...] | None = None
    kwargs_columns: tuple[str, ...] | None = None
    key_columns: tuple[str, ...] = ()
    id_namespace: str = ""
    id_timestamp_ms: int | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    scheduling: bool = False
    queue_options: QueueOptions | None = None
    utc_columns: frozenset[str] = field(default_factory=frozenset)

    def control_columns(self, columns: tuple[str, ...]) -> set[str]:
        """Columns of ``columns`` that set job fields (or the id's time) rather than arguments."""
        control = {c for c in ROW_COLUMNS if c in columns}
        if self.key_columns and "created_at" in columns:
            control.add("created_at")
        return control

    def default_kwargs(self, columns: tuple[str, ...]) -> tuple[str, ...]:
        """The ``kwargs`` columns when neither args nor kwargs are specified: every non-control column."""
        control = self.control_columns(columns)
        return tuple(c for c in columns if c not in control)


def parse_write_options(options: Mapping[str, Any]) -> WritePlan:
    """Parse write options (strings, or native values from :func:`enqueue_partition`).

    Parameters:
        options: the options, keys in any case, with or without underscores.

    Returns:
        The plan.

    Raises:
        ValidationError: an unknown option or a bad value; ``field`` names the option.
    """
    opts = normalize(options)
    unknown = sorted(set(opts) - _WRITE_OPTIONS - _SPARK_OPTIONS - {"source"})
    if unknown:
        raise ValidationError(
            f"unknown option(s) {', '.join(unknown)} of the ojs data source; known: {', '.join(sorted(_WRITE_OPTIONS))}",
            field=unknown[0],
        )
    if opts.get("source", "jobs") != "jobs":
        raise ValidationError(
            f"source={opts['source']!r} is read-only; write jobs without a source option", field="source"
        )
    queue_options = {_QUEUE_OPTIONS[k]: _queue_option(k, v) for k, v in opts.items() if k in _QUEUE_OPTIONS}
    job_type = _text(opts, "type")
    plan = WritePlan(
        url=resolve_url(_text(opts, "url")),
        prefix=_text(opts, "prefix") or "",
        queue=_text(opts, "queue") or "default",
        job_type=job_type,
        args_columns=_columns(opts, "argscolumns"),
        kwargs_columns=_columns(opts, "kwargscolumns"),
        key_columns=_columns(opts, "keycolumns") or (),
        id_namespace=_text(opts, "idnamespace") or "",
        id_timestamp_ms=_id_timestamp(opts.get("idtimestamp")),
        batch_size=_positive_int(opts, "batchsize", DEFAULT_BATCH_SIZE),
        scheduling=_flag(opts, "scheduling"),
        queue_options=QueueOptions(**queue_options) if queue_options else None,
    )
    Names(plan.prefix)  # raises ValidationError for a bad prefix
    Job.create(job_type or "ojs.probe", queue=plan.queue)  # checks the type and queue names
    return plan


def check_schema(plan: WritePlan, schema: StructType) -> WritePlan:
    """Check ``plan`` against the DataFrame's ``schema``; return it with :attr:`WritePlan.utc_columns` set.

    Raises:
        ValidationError: a named column is missing, both a list option and its column are given,
            no job type is known, or a column's type cannot be mapped (binary, a non-array ``args``…).
    """
    types = {f.name: f.dataType for f in schema.fields}
    columns = tuple(types)

    def need(option: str, names: tuple[str, ...]) -> None:
        missing = [n for n in names if n not in types]
        if missing:
            raise ValidationError(
                f"{option}: no column {', '.join(map(repr, missing))} in the DataFrame (columns: {', '.join(columns)})",
                field=option,
            )

    need("argsColumns", plan.args_columns or ())
    need("kwargsColumns", plan.kwargs_columns or ())
    need("keyColumns", plan.key_columns)
    for option, column in (("argsColumns", "args"), ("kwargsColumns", "kwargs")):
        if getattr(plan, f"{column}_columns") is not None and column in types:
            raise ValidationError(f"both the {option} option and an {column!r} column are given; use one", field=option)
    if plan.job_type is None and "type" not in types:
        raise ValidationError("no job type: set the 'type' option or add a 'type' column", field="type")
    expected: dict[str, tuple[type[DataType], ...]] = {
        "args": (ArrayType,),
        "kwargs": (StructType, MapType),
        "meta": (StructType, MapType, StringType),
        "tags": (ArrayType,),
        "queue": (StringType,),
        "type": (StringType,),
        "priority": (IntegralType,),
        "scheduled_at": (TimestampType, TimestampNTZType, StringType),
        "expires_at": (TimestampType, TimestampNTZType, StringType),
        "created_at": (TimestampType, TimestampNTZType, DateType),
    }
    control = plan.control_columns(columns)
    for name in (*control, *(c for c in ("args", "kwargs") if c in types)):
        if name in expected and not isinstance(types[name], expected[name]):
            kinds = " or ".join(k.__name__.removesuffix("Type").lower() for k in expected[name])
            raise ValidationError(f"column {name!r} must be {kinds}, got {types[name].simpleString()}", field=name)
    used = set(plan.args_columns or ()) | set(plan.kwargs_columns or ()) | set(plan.key_columns) | control
    if plan.args_columns is None and plan.kwargs_columns is None and "args" not in types and "kwargs" not in types:
        used |= set(plan.default_kwargs(columns))
    used |= {c for c in ("args", "kwargs") if c in types}
    for name in sorted(used):
        if _contains(types[name], BinaryType):
            raise ValidationError(
                f"column {name!r} holds binary values, which are not JSON; cast it to a base64 string first",
                field=name,
            )
    utc = frozenset(n for n in used if _contains(types[n], TimestampNTZType) and not _contains(types[n], TimestampType))
    return WritePlan(**{**plan.__dict__, "utc_columns": utc})


def _contains(data_type: DataType, kind: type[DataType]) -> bool:
    if isinstance(data_type, kind):
        return True
    if isinstance(data_type, ArrayType):
        return _contains(data_type.elementType, kind)
    if isinstance(data_type, MapType):
        return _contains(data_type.keyType, kind) or _contains(data_type.valueType, kind)
    if isinstance(data_type, StructType):
        return any(_contains(f.dataType, kind) for f in data_type.fields)
    return False


def _text(opts: dict[str, Any], key: str) -> str | None:
    value = opts.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValidationError(f"option {key} must be a string, got {type(value).__name__}", field=key)
    return value


def _columns(opts: dict[str, Any], key: str) -> tuple[str, ...] | None:
    value = opts.get(key)
    if value is None:
        return None
    names = value.split(",") if isinstance(value, str) else list(value)
    result = tuple(str(n).strip() for n in names if str(n).strip())
    if not result:
        raise ValidationError(f"option {key} names no column", field=key)
    return result


def _positive_int(opts: dict[str, Any], key: str, default: int) -> int:
    value = opts.get(key, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or number < 1 or (isinstance(value, float) and value != number):
        raise ValidationError(f"option {key} must be an integer >= 1, got {value!r}", field=key)
    return number


def _flag(opts: dict[str, Any], key: str) -> bool:
    value = opts.get(key, False)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ValidationError(f"option {key} must be true or false, got {value!r}", field=key)


def _queue_option(key: str, value: Any) -> Any:
    if key in ("overflow", "queuetype"):
        return str(value)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValidationError(f"option {key} must be an integer, got {value!r}", field=key) from None


def _id_timestamp(value: Any) -> int | None:
    """``idTimestamp``: milliseconds since the epoch, or an RFC 3339 timestamp."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        text = str(value).strip()
        if text.isdigit():
            ms = int(text)
        else:
            try:
                ms = int(parse_timestamp(text).timestamp() * 1000)
            except ValidationError as exc:
                raise ValidationError(f"option idTimestamp: {exc}", field="idtimestamp") from None
    if not 0 <= ms < 1 << 48:
        raise ValidationError(f"option idTimestamp is out of range: {value!r}", field="idtimestamp")
    return ms


__all__ = ["DEFAULT_BATCH_SIZE", "ROW_COLUMNS", "WritePlan", "check_schema", "normalize", "parse_write_options"]
