"""Spark values as JSON-native values (the mapping documented in :mod:`ojs_kombu.spark`).

PySpark hands a Python data source writer (and ``foreachPartition``) plain Python
values: ``Row`` for structs, ``dict`` for maps, ``list`` for arrays,
``decimal.Decimal``, ``datetime.date``, and *naive* ``datetime.datetime`` for
timestamps (a ``TimestampType`` value in the worker's local time zone, a
``TimestampNTZType`` value as written).  :func:`to_json` turns them into what an
OJS envelope may hold, or raises :class:`ValidationError` naming the column.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.jsonvalue import MAX_SAFE_INTEGER


def format_instant(value: datetime, *, naive_is_utc: bool = False) -> str:
    """A timestamp as RFC 3339 UTC with ``Z``: milliseconds, or microseconds when it has them.

    Parameters:
        value: an aware datetime, or a naive one in the local time zone (Spark's ``TimestampType``)
            or in UTC when ``naive_is_utc`` (``TimestampNTZType``).

    Returns:
        e.g. ``"2026-02-15T10:30:00.000Z"`` or ``"2026-02-15T10:30:00.000250Z"``.
    """
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC) if naive_is_utc else value.astimezone(UTC)
    else:
        value = value.astimezone(UTC)
    spec = "microseconds" if value.microsecond % 1000 else "milliseconds"
    return value.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def to_json(value: Any, column: str, *, naive_is_utc: bool = False) -> Any:
    """``value`` of ``column`` as a JSON-native value.

    Parameters:
        value: a value PySpark gave for one column of one row.
        column: the column's name, for the error message (a path such as ``"address.zip"`` below it).
        naive_is_utc: read naive datetimes as UTC (``TimestampNTZType``) rather than local time.

    Returns:
        ``None``, ``bool``, ``int``, ``float``, ``str``, ``list`` or ``dict`` (recursively).

    Raises:
        ValidationError: a binary value, a NaN or infinite float, an integer beyond ±(2**53-1),
            a map key that is not a string or an integer, or a type Spark does not produce.
    """
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
        raise _refused(column, f"integer {value} is beyond ±(2**53-1), not exact in every JSON consumer", "string")
    if kind is float:
        if math.isfinite(value):
            return value
        raise _refused(column, f"{value!r} is not a JSON number", "string, or replace it with null")
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise _refused(column, f"decimal {value} is not a number", "string")
        return format(value, "f")
    if isinstance(value, datetime):
        return format_instant(value, naive_is_utc=naive_is_utc)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise _refused(column, "binary values are not JSON", "base64 string (base64(col))")
    if isinstance(value, tuple) and hasattr(value, "__fields__"):  # pyspark.sql.Row: a struct
        return {
            name: to_json(item, f"{column}.{name}", naive_is_utc=naive_is_utc)
            for name, item in zip(value.__fields__, value, strict=True)
        }
    if isinstance(value, Mapping):
        result: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise _refused(column, f"map key {key!r} is neither a string nor an integer", "map with string keys")
            result[str(key)] = to_json(item, f"{column}.{key}", naive_is_utc=naive_is_utc)
        return result
    if isinstance(value, (list, tuple)):
        return [to_json(item, f"{column}[{index}]", naive_is_utc=naive_is_utc) for index, item in enumerate(value)]
    raise _refused(column, f"a {kind.__name__} is not a value this mapping knows", "string")


def _refused(column: str, problem: str, cast_to: str) -> ValidationError:
    return ValidationError(f"column {column!r}: {problem}; cast it to a {cast_to} first", field=column)


__all__ = ["format_instant", "to_json"]
