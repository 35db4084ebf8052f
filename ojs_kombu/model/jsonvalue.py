"""JSON values: what ``args``, ``meta`` and ``result`` may hold (ojs-json-format), and JSON text in and out.

:func:`ensure_json_native` refuses anything that would not survive a trip through JSON
in every language unchanged: bytes, sets, datetimes, Decimal, NaN, integers beyond
±(2**53-1), non-string keys, lone surrogates, nesting deeper than :data:`MAX_JSON_DEPTH`.
:func:`loads` reads JSON text as RFC 8259 defines it (no NaN, no infinities), and
:func:`dumps` writes it compactly.
"""

from __future__ import annotations

import json
import math
import uuid as _uuid
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import orjson

from ojs_kombu.model._problems import Problem, public_error, short_repr

MAX_SAFE_INTEGER = 2**53 - 1
"""Largest integer every JSON consumer represents exactly (ojs-json-format: larger ones travel as strings)."""

MAX_JSON_DEPTH = 256
"""Deepest nesting of arrays/objects accepted in ``args``, ``meta`` and ``result``."""

_HINTS = {
    datetime: "format it as an RFC 3339 string (e.g. ojs_kombu.model.timefmt.format_timestamp(dt))",
    date: "pass an ISO 8601 string (d.isoformat())",
    bytes: "encode it as a string, e.g. base64url without padding",
    bytearray: "encode it as a string, e.g. base64url without padding",
    Decimal: "pass it as a string",
    set: "pass a list",
    frozenset: "pass a list",
    _uuid.UUID: "pass str(value)",
}


def _not_native(value: Any) -> Problem:
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    hint = next((h for t, h in _HINTS.items() if isinstance(value, t)), None)
    text = (
        f"a {name} is not a JSON-native value (allowed: object with string keys, array, string, number, boolean, null)"
    )
    return Problem(f"{text}; {hint}" if hint else text)


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise Problem("string contains a lone surrogate and cannot be encoded as UTF-8") from None


def _walk(value: Any, large_ints: bool, depth: int) -> int:
    """Check that ``value`` is JSON-native; return an upper bound of its JSON size in bytes."""
    kind = type(value)
    if kind is str:
        _check_text(value)
        return 6 * len(value) + 2  # worst case: every character escaped as \uXXXX
    if kind is bool or value is None:
        return 5
    if kind is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return 17
        if not large_ints:
            raise Problem(
                f"integer {value} is outside ±(2**53-1) and is not exact in every JSON consumer; pass it as a string"
            )
        bits: int = value.bit_length()
        return bits // 3 + 3
    if kind is float:
        if not math.isfinite(value):
            raise Problem(f"{value!r} is not a JSON number (NaN and infinities are refused)")
        return 25
    if depth >= MAX_JSON_DEPTH:
        raise Problem(f"nested deeper than {MAX_JSON_DEPTH} levels (a reference cycle?)")
    if kind is list or kind is tuple:
        size = 2
        for index, item in enumerate(value):
            # ASCII strings and safe integers inline (Job.create walks every job's args).
            item_kind = type(item)
            if item_kind is str and item.isascii():
                size += 6 * len(item) + 3
            elif item_kind is int and -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                size += 18
            else:
                try:
                    size += _walk(item, large_ints, depth + 1) + 1
                except Problem as problem:
                    raise problem.under(f"[{index}]") from None
        return size
    if kind is dict:
        size = 2
        for key, item in value.items():
            if type(key) is not str:
                if not isinstance(key, str):
                    raise Problem(f"object keys must be strings, got {type(key).__name__} key {short_repr(key)}")
            try:
                _check_text(key)
                size += 6 * len(key) + 4 + _walk(item, large_ints, depth + 1)
            except Problem as problem:
                raise problem.under(key) from None
        return size
    # Subclasses (IntEnum, str-based Enum, OrderedDict...) serialise like their base type.
    if isinstance(value, str):
        return _walk(str.__str__(value), large_ints, depth)
    if isinstance(value, int):
        return _walk(int.__int__(value), large_ints, depth)
    if isinstance(value, float):
        return _walk(float.__float__(value), large_ints, depth)
    if isinstance(value, (list, tuple)):
        return _walk(list(value), large_ints, depth)
    if isinstance(value, dict):
        return _walk(dict(value), large_ints, depth)
    raise _not_native(value)


def ensure_json_native(value: Any, field: str, *, allow_large_ints: bool = False) -> None:
    """Raise :class:`ValidationError` unless ``value`` is made only of JSON-native values.

    Allowed: ``dict`` with ``str`` keys, ``list`` and ``tuple`` (a tuple serialises as
    an array, like in Celery), ``str``, ``bool``, ``None``, ``int`` within
    ±(2**53-1) (larger ones must travel as strings, per ojs-json-format, unless
    ``allow_large_ints``) and finite ``float``; subclasses of those (``IntEnum``,
    ``OrderedDict``...) count as their base type.  Anything else (bytes, sets,
    datetimes, Decimal, arbitrary objects) is refused, with the type name and a hint.
    ``field`` names ``value``; the error's ``field`` is the exact path of the
    offending item, e.g. ``"args[2].when"``.
    """
    try:
        _walk(value, allow_large_ints, 0)
    except Problem as problem:
        raise public_error(problem, field) from None


class JsonTextError(ValueError):
    """Why :func:`loads` refused a text.

    Its message completes a sentence about the text, e.g. ``f"body {exc}"`` reads
    ``"body is not JSON: Expecting value: line 1 column 1 (char 0)"``.
    """


def loads(data: str | bytes | bytearray | memoryview, *, strip_bom: bool = False) -> Any:
    """Parse JSON text as RFC 8259 defines it: ``NaN`` and ``Infinity``, which Python's json accepts, are refused.

    orjson reads the text when it is sure to give what Python's json gives (:func:`_loads_orjson`);
    any other text, and any text orjson refuses, is read by Python's json, whose result or error
    is the answer: the two paths never differ.

    Parameters:
        data: the text, or its UTF-8 encoding.
        strip_bom: drop a leading byte order mark instead of refusing it (ojs-json-format forbids it;
            the tolerant consumer lets it pass).

    Returns:
        The value: ``dict``, ``list``, ``str``, ``int``, ``float``, ``bool`` or ``None``.

    Raises:
        JsonTextError: invalid UTF-8, a byte order mark, invalid JSON, or nesting too deep for the parser.
    """
    return loads_native(data, strip_bom=strip_bom)[0]


def loads_native(data: str | bytes | bytearray | memoryview, *, strip_bom: bool = False) -> tuple[Any, bool]:
    """:func:`loads`, and whether the value is known to be JSON-native without a walk.

    Parameters:
        data: the text, or its UTF-8 encoding.
        strip_bom: as for :func:`loads`.

    Returns:
        ``(value, native)``: ``native`` is True when orjson read the text, so every part of
        ``value`` passes ``ensure_json_native(value, allow_large_ints=True)`` by construction
        (exact built-in types, string keys, no lone surrogate, finite floats, integers within
        64 bits, fewer than :data:`MAX_JSON_DEPTH` levels); False when Python's json read it.

    Raises:
        JsonTextError: as :func:`loads`.
    """
    value = _loads_orjson(data)
    if value is _UNREAD:
        return _loads_json(data, strip_bom=strip_bom), False
    return value, True


_UNREAD: Any = object()

_MAX_FAST_OPENINGS = MAX_JSON_DEPTH
"""Texts with this many ``[``/``{`` go to Python's json: orjson nests to 1024, Python's json raises
RecursionError near 1000 minus the caller's stack; below this, neither limit can be reached
(nor :data:`MAX_JSON_DEPTH`, which :func:`loads_native` relies on)."""

_LONG_DIGITS = b"0" * 19
"""orjson reads an integer beyond 64 bits as a float; every integer with fewer digits fits in 64 bits."""

# Digits read as "0", openings as "[", everything else as " ": one C pass finds both risks above.
_MARKS = bytes(48 if 48 <= byte <= 57 else 91 if byte in (91, 123) else 32 for byte in range(256))


def _loads_orjson(data: str | bytes | bytearray | memoryview) -> Any:
    """orjson's reading of ``data``, or ``_UNREAD`` where it could differ from :func:`_loads_json`'s.

    orjson refuses (so Python's json reads) a BOM, invalid UTF-8, lone surrogates, ``NaN``,
    ``Infinity`` and numbers that overflow to infinity; a long digit run (an integer beyond
    64 bits, which orjson would read as a float) and deep nesting are screened out here.
    ``tests/unit/test_jsonvalue_loads.py`` holds the two readings equal.
    """
    if isinstance(data, str):
        try:
            raw: bytes | bytearray = data.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: Python's json reads it
            return _UNREAD
    elif isinstance(data, memoryview):
        raw = bytes(data)
    else:
        raw = data
    marks = raw.translate(_MARKS)
    if _LONG_DIGITS in marks or marks.count(b"[") >= _MAX_FAST_OPENINGS:
        return _UNREAD
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _UNREAD


def _loads_json(data: str | bytes | bytearray | memoryview, *, strip_bom: bool = False) -> Any:
    """:func:`loads` by Python's json alone: the reference reading (and the fallback)."""
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonTextError(f"is not valid UTF-8: {exc}") from None
    if text.startswith("\ufeff"):
        if not strip_bom:
            raise JsonTextError("starts with a byte order mark; OJS requires UTF-8 without BOM")
        text = text[1:]
    try:
        return _decode(text)
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, or an integer beyond sys.get_int_max_str_digits()
        raise JsonTextError(f"is not JSON: {exc}") from None
    except RecursionError:
        raise JsonTextError("is not usable JSON: nested too deeply") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


# One decoder for every call: json.loads(text, parse_constant=...) builds a new one each time.
_decode: Callable[[str], Any] = json.JSONDecoder(parse_constant=_refuse_constant).decode


dumps: Callable[[Any], str] = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
"""``dumps(value) -> str``: compact JSON text of a JSON-native value (not ASCII-escaped: encode it as UTF-8)."""


__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_SAFE_INTEGER",
    "JsonTextError",
    "dumps",
    "ensure_json_native",
    "loads",
    "loads_native",
]
