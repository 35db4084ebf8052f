"""Encoding message properties and header tables for a content header frame, fast."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, TypeVar

from amqp.basic_message import Message
from amqp.serialization import dumps

# -- wire encoding ----------------------------------------------------------------------------------
# py-amqp serialises message properties through a generic, format-string driven
# encoder that dominates the cost of a pipelined publish (measured: ~45 % of
# enqueue_many).  Our properties are a few short strings, octets and a headers
# table of strings and ints, so they are encoded here directly; anything else in
# a headers table falls back to py-amqp's encoder.

_PROPERTIES = (  # (name, kind, flag bit) in the order and flag positions of AMQP 0-9-1 basic properties
    # kinds: "m" a short string that repeats (memoised), "s" a short string, "o" an octet,
    # "T" a timestamp, "F" a field table
    ("content_type", "m"),
    ("content_encoding", "m"),
    ("application_headers", "F"),
    ("delivery_mode", "o"),
    ("priority", "o"),
    ("correlation_id", "s"),
    ("reply_to", "m"),
    ("expiration", "s"),
    ("message_id", "s"),
    ("timestamp", "T"),
    ("type", "m"),
    ("user_id", "m"),
    ("app_id", "m"),
    ("cluster_id", "m"),
)
_FLAGGED = tuple((name, kind, 1 << (15 - position)) for position, (name, kind) in enumerate(_PROPERTIES))
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_INT32_MIN, _INT32_MAX = -(2**31 - 1), 2**31 - 1  # py-amqp's range for 'I'; beyond it 'L' as py-amqp
_LENGTH = tuple(bytes((n,)) for n in range(256))  # a short string's length octet
_OCTET = _LENGTH

# Encoded short strings and table fields that repeat from message to message (table keys,
# content type, job type, queue, attempt, created_at within one millisecond...).  Bounded:
# when full a memo starts over, so unique values (message ids) cost a little, never memory.
_V = TypeVar("_V")
_MEMO_LIMIT = 4096
_MEMO_MAX_VALUE = 64  # longer table values (error messages) are not memoised
_memo: dict[str, bytes] = {}
_fields: dict[tuple[str, str | int], bytes] = {}


def _remember(memo: dict[Any, _V], key: Any, encoded: _V) -> _V:
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = encoded
    return encoded


def _shortstr(value: Any) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(raw) > 255:
        raise ValueError(f"AMQP short string longer than 255 bytes: {raw[:40]!r}...")
    return _LENGTH[len(raw)] + raw


def shortstr(value: str) -> bytes:
    """``value`` as an AMQP short string: its length octet, then its UTF-8 bytes.

    Raises:
        ValueError: longer than 255 bytes.
    """
    return _shortstr(value)


def _memo_shortstr(value: Any) -> bytes:
    if type(value) is not str:
        return _shortstr(value)
    encoded = _memo.get(value)
    return encoded if encoded is not None else _remember(_memo, value, _shortstr(value))


def _field(key: str, value: str | int) -> bytes:
    """One table field, key and typed value, of a str or (not bool) int value."""
    if isinstance(value, str):
        raw = value.encode("utf-8")
        typed = b"S" + _U32.pack(len(raw)) + raw
    elif _INT32_MIN <= value <= _INT32_MAX:
        typed = b"I" + _I32.pack(value)
    else:
        typed = b"L" + _I64.pack(value)
    return _memo_shortstr(key) + typed


def encode_table(table: Mapping[str, Any]) -> bytes:
    """An AMQP field table (with its length prefix), fast for str / int / bool values.

    Parameters:
        table: the headers table; values other than str / int / bool (nested tables,
            arrays, floats...) make the whole table go through py-amqp's encoder.

    Returns:
        The table as py-amqp's ``dumps("F", ...)`` encodes it, byte for byte.

    Raises:
        ValueError: a key longer than 255 bytes.
    """
    parts: list[bytes] = []
    append = parts.append
    for key, value in table.items():
        kind = type(value)
        if kind is str or kind is int:  # not bool: True == 1 would share a memo entry
            encoded = _fields.get((key, value))
            if encoded is None:
                encoded = _field(key, value)
                if kind is int or len(value) <= _MEMO_MAX_VALUE:
                    _remember(_fields, (key, value), encoded)
            append(encoded)
        elif kind is bool:
            append(_memo_shortstr(key) + (b"t\x01" if value else b"t\x00"))
        else:
            whole: bytes = dumps("F", [table])  # nested tables, arrays, floats, subclasses: py-amqp's encoder
            return whole
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def encode_properties(properties: Mapping[str, Any], headers: Mapping[str, Any] | None = None) -> bytes:
    """Basic properties as they go in a content header frame: flags, then values.

    Jobs of a batch differ in little but their ``message_id`` (the header values change at
    most once per millisecond), so the bytes before and after the message id are kept per
    distinct rest of the properties (:func:`_template_key`) and only the id is encoded anew.

    Parameters:
        properties: py-amqp property names to values; None values are left out.
        headers: the headers table, when it is not ``properties["application_headers"]``.

    Returns:
        What py-amqp's ``Message._serialize_properties`` returns for the same properties.

    Raises:
        ValueError: a short string (message id, type...) longer than 255 bytes.
    """
    key = _template_key(properties, headers)
    try:
        template = _templates.get(key) if key is not None else None
    except TypeError:  # a list or dict among the properties: encode them every time
        key = None
    if key is None:
        return _encode_all(properties, headers)
    if template is None:
        template = _remember(_templates, key, _template(properties, headers))
    before, after = template
    return before + _shortstr(properties["message_id"]) + after


# Keyed by everything but the message id; bounded as the other memos.
_templates: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}
_PLAIN_HEADER_VALUES = frozenset({str, int})  # exact types: True == 1.0 == 1 but each encodes differently


def _template_key(properties: Mapping[str, Any], headers: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    """What the properties are, message id apart, as a key; None when they cannot be one (no
    message id, a headers value that is not a plain str / int).  The key may hold an unhashable
    property value (a list...): the lookup then raises TypeError."""
    if type(properties) is not dict or properties.get("message_id") is None:
        return None
    rest = properties.copy()
    del rest["message_id"]
    if headers is None:
        headers = rest.pop("application_headers", None)
    if headers is None:
        return (tuple(rest), tuple(rest.values()), None)  # None: no table (an empty one is still sent)
    if type(headers) is not dict:
        return None
    for value in headers.values():
        if type(value) not in _PLAIN_HEADER_VALUES:
            return None
    return (tuple(rest), tuple(rest.values()), tuple(headers), tuple(headers.values()))  # flat: no pair tuples


def properties_template(properties: Mapping[str, Any], headers: Mapping[str, Any] | None = None) -> tuple[bytes, bytes]:
    """The encoded properties around the message id, for messages that differ in nothing else.

    ``before + shortstr(message_id) + after`` is what :func:`encode_properties` returns for
    ``properties`` with that message id (a short string: its length octet, then UTF-8).

    Parameters:
        properties: py-amqp property names to values, with a ``message_id`` (its value is not used).
        headers: the headers table, when it is not ``properties["application_headers"]``.

    Returns:
        ``(before, after)``: the flags and the fields before the message id, the fields after it.

    Raises:
        ValueError: a short string longer than 255 bytes.
    """
    return _template(properties, headers)


def _template(properties: Mapping[str, Any], headers: Mapping[str, Any] | None) -> tuple[bytes, bytes]:
    """The encoded properties around the message id: (flags and the fields before it, the fields after)."""
    flags, parts = _encode_fields(properties, headers, _BEFORE_ID)
    after_flags, after = _encode_fields(properties, headers, _AFTER_ID)
    return _U16.pack(flags | _ID_FLAG | after_flags) + b"".join(parts), b"".join(after)


def _encode_all(properties: Mapping[str, Any], headers: Mapping[str, Any] | None) -> bytes:
    flags, parts = _encode_fields(properties, headers, _FLAGGED)
    return _U16.pack(flags) + b"".join(parts)


def _encode_fields(
    properties: Mapping[str, Any], headers: Mapping[str, Any] | None, fields: tuple[tuple[str, str, int], ...]
) -> tuple[int, list[bytes]]:
    """The flag bits and encoded values of those of ``fields`` that are set."""
    flags = 0
    parts: list[bytes] = []
    get = properties.get
    for name, kind, flag in fields:
        value: Any = headers if headers is not None and name == "application_headers" else get(name)
        if value is None:
            continue
        flags |= flag
        if kind == "m":
            parts.append(_memo_shortstr(value))
        elif kind == "s":
            parts.append(_shortstr(value))
        elif kind == "o":
            parts.append(_OCTET[int(value)])
        elif kind == "T":
            parts.append(_U64.pack(int(value.timestamp()) if hasattr(value, "timestamp") else int(value)))
        else:
            parts.append(encode_table(value))
    return flags, parts


_ID_INDEX = next(i for i, (name, _, _) in enumerate(_FLAGGED) if name == "message_id")
_BEFORE_ID, _ID_FLAG, _AFTER_ID = _FLAGGED[:_ID_INDEX], _FLAGGED[_ID_INDEX][2], _FLAGGED[_ID_INDEX + 1 :]


class WireMessage(Message):  # type: ignore[misc]  # py-amqp is untyped
    """A py-amqp message whose properties are encoded by :func:`encode_properties`."""

    def _serialize_properties(self) -> bytes:
        return encode_properties(self.properties)


__all__ = ["WireMessage", "encode_properties", "encode_table", "properties_template", "shortstr"]
