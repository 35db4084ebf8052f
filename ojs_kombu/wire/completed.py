"""Completion records: the stream ``ojs.stream.completed.{q}`` of execution de-duplication (DESIGN §19).

A worker with ``deduplicate=True`` records the id of every job it completed (its handler
returned) in the stream of the job's queue, and acks without running a delivery whose id is
recorded there.  Records are published straight to the stream (default exchange, routing key
= the stream's name), many ids per message:

* ``type=ojs.completed``, body ``{"at": <epoch seconds>, "ids": ["<job id>", ...]}``: the ids
  of jobs completed by ``at`` (the publisher's clock; the reader forgets them ``max_age`` later);
* ``type=ojs.completed.marker``, body ``{}``: a reader's own catch-up marker (its
  ``message_id`` read back means everything before it has been replayed); others ignore it.

JSON, like every other record of the control plane; a record of 1,000 ids is ~39 KB
(~39 bytes per id on disk).  Pure functions: :mod:`ojs_kombu.runtime.completed` publishes what
:func:`completed_record` builds and reads what :func:`decode_completed` returns.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.control import json_message
from ojs_kombu.wire.entities import stream_arguments

#: The ``type`` of a record of completed job ids.
COMPLETED_TYPE = "ojs.completed"
#: The ``type`` of a reader's catch-up marker.
COMPLETED_TYPE_MARKER = "ojs.completed.marker"
#: A record larger than this is not ours (1,000 ids are ~39 KB).
MAX_COMPLETED_BYTES = 4 * 1024 * 1024

_MAX_AGE = re.compile(r"^(?P<n>[1-9][0-9]*)(?P<unit>Y|M|D|h|m|s)$")
# RabbitMQ's units of x-max-age (rabbit_amqqueue: Y = 365 days, M = 30 days).
_UNIT_SECONDS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}


def max_age_seconds(max_age: str) -> int:
    """Seconds of an ``x-max-age`` value such as ``"7D"`` (units ``Y M D h m s``, as RabbitMQ reads them).

    Parameters:
        max_age: the value.

    Returns:
        Its length in seconds.

    Raises:
        ValidationError: not a positive integer followed by one of the units.
    """
    match = _MAX_AGE.fullmatch(max_age) if isinstance(max_age, str) else None
    if match is None:
        raise ValidationError(f"max_age must look like '7D' (units Y, M, D, h, m, s), got {max_age!r}", field="max_age")
    return int(match["n"]) * _UNIT_SECONDS[match["unit"]]


@dataclass(frozen=True)
class CompletedOptions:
    """Bounds of execution de-duplication: of the stream ``ojs.stream.completed.{q}`` and of what a worker keeps.

    A job id is remembered for ``max_age`` after its job completed: a duplicate delivered later
    runs again.  The stream is trimmed by whole segments, so it keeps at least ``max_age`` (and
    at most ``max_length_bytes``, ~39 bytes per id); a worker keeps at most ``max_ids`` ids in
    memory (~100 bytes each, see :class:`~ojs_kombu.runtime.completed.CompletedIds`), the oldest
    going first.  Forgetting an id early costs at worst a duplicate execution, never a lost job.

    Parameters:
        max_age: ``x-max-age`` of the stream and how long a worker remembers an id
            (RabbitMQ units ``Y M D h m s``); the default outlives the broker's own redelivery
            paths (a retry ladder, the scheduling cascade's delays are the job's, not a duplicate's).
        max_length_bytes: ``x-max-length-bytes``: the stream's size cap (default ~5 M ids).
        max_segment_size_bytes: ``x-stream-max-segment-size-bytes``.
        max_ids: the most ids a worker keeps in memory.

    Raises:
        ValidationError: an option is malformed.
    """

    max_age: str = "7D"
    max_length_bytes: int = 200_000_000
    max_segment_size_bytes: int = 10_000_000
    max_ids: int = 2_000_000

    def __post_init__(self) -> None:
        max_age_seconds(self.max_age)
        for name in ("max_length_bytes", "max_segment_size_bytes", "max_ids"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError(f"{name} must be a positive integer, got {value!r}", field=name)

    @property
    def max_age_seconds(self) -> int:
        """:attr:`max_age` in seconds."""
        return max_age_seconds(self.max_age)

    def arguments(self) -> dict[str, Any]:
        """The arguments of the stream."""
        return stream_arguments(self.max_age, self.max_length_bytes, self.max_segment_size_bytes)


@dataclass(frozen=True)
class CompletedRecord:
    """A decoded record: the ids completed by ``at`` (epoch seconds), or a marker (``marker`` = its message id)."""

    at: float
    ids: Sequence[str]
    marker: str | None = None


def completed_record(ids: Sequence[str], *, at: float | None = None) -> OutgoingMessage:
    """The persistent record of ``ids``, completed by ``at``.

    Parameters:
        ids: job ids (lowercase).
        at: epoch seconds (default: now).

    Returns:
        The message, ready to publish to the stream.
    """
    when = time.time() if at is None else at
    return json_message(COMPLETED_TYPE, {"at": round(when, 3), "ids": list(ids)}, delivery_mode=2)


def completed_marker() -> OutgoingMessage:
    """A fresh catch-up marker (its ``message_id`` identifies it).

    Returns:
        The message, ready to publish to the stream.
    """
    return json_message(COMPLETED_TYPE_MARKER, {}, delivery_mode=2)


def decode_completed(body: bytes, properties: dict[str, Any]) -> CompletedRecord | None:
    """Read a message of the stream.

    Parameters:
        body: the message body.
        properties: its AMQP properties.

    Returns:
        The record; ``None`` for a message of another ``type`` (ignored).

    Raises:
        DecodeError: a record of ours that cannot be read.
    """
    kind = properties.get("type")
    if kind == COMPLETED_TYPE_MARKER:
        message_id = properties.get("message_id")
        return CompletedRecord(0.0, (), marker=message_id if isinstance(message_id, str) else "")
    if kind != COMPLETED_TYPE:
        return None
    if len(body) > MAX_COMPLETED_BYTES:
        raise DecodeError(f"completion record of {len(body)} bytes (at most {MAX_COMPLETED_BYTES})")
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise DecodeError(f"completion record is not JSON: {exc}") from exc
    ids = data.get("ids") if isinstance(data, dict) else None
    at = data.get("at") if isinstance(data, dict) else None
    if not isinstance(ids, list) or isinstance(at, bool) or not isinstance(at, int | float):
        raise DecodeError("completion record without a list of ids and a numeric 'at'")
    return CompletedRecord(float(at), [i for i in ids if isinstance(i, str)])


__all__ = [
    "COMPLETED_TYPE",
    "COMPLETED_TYPE_MARKER",
    "CompletedOptions",
    "CompletedRecord",
    "completed_marker",
    "completed_record",
    "decode_completed",
    "max_age_seconds",
]
