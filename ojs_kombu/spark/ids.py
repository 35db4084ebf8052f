"""Deterministic job ids for rows: UUIDv7-shaped, from a hash, so a re-sent row carries the same id.

* With key columns: ``sha256(["ojs.key", namespace, key values])``; the timestamp
  bits come from the row's ``created_at`` column, else the ``idTimestamp`` option,
  else 0 (never the clock: a retry must produce the same id).
* A streaming sink without key columns: ``sha256(["ojs.stream", query id, batch id,
  partition id, row index])``, timestamp bits from ``idTimestamp`` or 0.  A
  replayed micro-batch holds the same rows in the same partitions, so it re-sends
  the same ids.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ojs_kombu.model.ids import uuid7
from ojs_kombu.model.jsonvalue import dumps


def hashed_id(parts: list[Any], unix_ms: int) -> str:
    """The UUIDv7-shaped id of the JSON-native ``parts``, with timestamp bits ``unix_ms``.

    Parameters:
        parts: JSON-native values hashed in order (their compact JSON text is hashed).
        unix_ms: the id's 48-bit millisecond timestamp.

    Returns:
        A lowercase UUIDv7 whose 74 random bits are the first bits of the SHA-256.
    """
    digest = int.from_bytes(hashlib.sha256(dumps(parts).encode("utf-8")).digest()[:10], "big")
    return uuid7(unix_ms, digest >> 68, digest >> 6)


def key_id(namespace: str, key_values: list[Any], unix_ms: int) -> str:
    """The id of a row whose key columns hold ``key_values`` (JSON-native), in ``namespace``."""
    return hashed_id(["ojs.key", namespace, key_values], unix_ms)


def stream_id(query_id: str, batch_id: int, partition_id: int, row_index: int, unix_ms: int) -> str:
    """The id of row ``row_index`` of a streaming micro-batch's partition."""
    return hashed_id(["ojs.stream", query_id, batch_id, partition_id, row_index], unix_ms)


__all__ = ["hashed_id", "key_id", "stream_id"]
