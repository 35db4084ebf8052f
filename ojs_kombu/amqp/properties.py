"""Encoding message properties and header tables for a content header frame, fast."""

from __future__ import annotations

import struct
from typing import Any

from amqp.basic_message import Message
from amqp.serialization import dumps

# -- wire encoding ----------------------------------------------------------------------------------
# py-amqp serialises message properties through a generic, format-string driven
# encoder that dominates the cost of a pipelined publish (measured: ~45 % of
# enqueue_many).  Our properties are a few short strings, octets and a headers
# table of strings and ints, so they are encoded here directly; anything else in
# a headers table falls back to py-amqp's encoder.

_PROPERTIES = (  # (name, kind) in the order and flag positions of AMQP 0-9-1 basic properties
    ("content_type", "s"),
    ("content_encoding", "s"),
    ("application_headers", "F"),
    ("delivery_mode", "o"),
    ("priority", "o"),
    ("correlation_id", "s"),
    ("reply_to", "s"),
    ("expiration", "s"),
    ("message_id", "s"),
    ("timestamp", "T"),
    ("type", "s"),
    ("user_id", "s"),
    ("app_id", "s"),
    ("cluster_id", "s"),
)
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_INT32_MIN, _INT32_MAX = -(2**31 - 1), 2**31 - 1  # py-amqp's range for 'I'; beyond it 'L' as py-amqp


def _shortstr(value: Any) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(raw) > 255:
        raise ValueError(f"AMQP short string longer than 255 bytes: {raw[:40]!r}...")
    return bytes((len(raw),)) + raw


def encode_table(table: dict[str, Any]) -> bytes:
    """An AMQP field table (with its length prefix), fast for str / int / bool values."""
    parts = []
    for key, value in table.items():
        parts.append(_shortstr(key))
        if isinstance(value, str):
            raw = value.encode("utf-8")
            parts += (b"S", _U32.pack(len(raw)), raw)
        elif isinstance(value, bool):
            parts.append(b"t\x01" if value else b"t\x00")
        elif isinstance(value, int) and _INT32_MIN <= value <= _INT32_MAX:
            parts += (b"I", _I32.pack(value))
        elif isinstance(value, int):
            parts += (b"L", _I64.pack(value))
        else:
            encoded: bytes = dumps("F", [table])  # nested tables, arrays, floats, …: py-amqp's encoder
            return encoded
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def encode_properties(properties: dict[str, Any]) -> bytes:
    """Basic properties as they go in a content header frame: flags, then values."""
    flags = 0
    parts = []
    for position, (name, kind) in enumerate(_PROPERTIES):
        value = properties.get(name)
        if value is None:
            continue
        flags |= 1 << (15 - position)
        if kind == "s":
            parts.append(_shortstr(value))
        elif kind == "o":
            parts.append(bytes((int(value),)))
        elif kind == "T":
            parts.append(_U64.pack(int(value.timestamp()) if hasattr(value, "timestamp") else int(value)))
        else:
            parts.append(encode_table(value))
    return struct.pack(">H", flags) + b"".join(parts)


class WireMessage(Message):  # type: ignore[misc]  # py-amqp is untyped
    """A py-amqp message whose properties are encoded by :func:`encode_properties`."""

    def _serialize_properties(self) -> bytes:
        return encode_properties(self.properties)


__all__ = ["WireMessage", "encode_properties", "encode_table"]
