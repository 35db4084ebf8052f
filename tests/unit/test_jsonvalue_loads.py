"""``jsonvalue.loads`` reads with orjson where it can: it must give exactly what Python's json path gives.

Same value (same types all the way down: int vs float, -0.0 vs 0.0) or the same ``JsonTextError``,
for the schema fixtures, known edge cases and a few thousand generated and mutated documents.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from ojs_kombu.errors import DecodeError, ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.jsonvalue import (
    _UNREAD,
    JsonTextError,
    _loads_json,
    _loads_orjson,
    ensure_json_native,
    loads,
    loads_native,
)
from ojs_kombu.wire.codec import decode, encode
from tools.schema import fixtures_dir

FIXTURES = sorted((fixtures_dir() / "valid").glob("*.json")) + sorted((fixtures_dir() / "invalid").glob("*.json"))

EDGE_CASES: list[str | bytes] = [
    "1e400",
    "-1e400",
    "[1.7976931348623157e309]",
    "1e-400",
    "-1e-400",
    "NaN",
    "Infinity",
    "-Infinity",
    '{"a": NaN}',
    '{"a":1,"a":2}',
    '{"a":{"b":1},"a":[2]}',
    "-0",
    "-0.0",
    "[0, -0, 0.0, -0.0, 0e0, -0e0]",
    '"\x01"',
    '"\x1f tab\t"',
    '"\\u0000"',
    "01",
    "[-01]",
    "00.5",
    "1.",
    ".5",
    "+1",
    "9007199254740993",
    "999999999999999999",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "123456789012345678901234567890",
    "1" * 5000,
    "-" + "9" * 4301,
    "0." + "1" * 5000,
    "1e" + "0" * 30 + "5",
    "1.7976931348623157e308",
    "2.2250738585072011e-308",
    "4.9406564584124654e-324",
    "2.4703282292062328e-324",
    "0.1",
    "1.0000000000000002",
    "123456789012345678.5",
    "\ufeff{}",
    b"\xef\xbb\xbf{}",
    b"\xef\xbb\xbf",
    b'"\xff"',
    b'"\xc3\x28"',
    b'"\xed\xa0\x80"',
    '"\\ud800"',
    '"\\udc00\\ud800"',
    '"\\ud83d\\ude00"',
    '"\ud800"',
    "",
    " ",
    "[1,]",
    '{"a":1,}',
    "[1 2]",
    "1 2",
    " \t\n\r[1] \r\n",
    "\u00a0[1]",
    "[1]\x00",
    "true",
    "True",
    "null",
    '"\\x41"',
    '"\\/\\b\\f\\n\\r\\t\\"\\\\"',
    '{"\\u00e9": "\u00e9"}',
    "[" * 255 + "]" * 255,
    "[" * 256 + "]" * 256,
    "[" * 990 + "]" * 990,
    "[" * 1000 + "]" * 1000,
    "[" * 1024 + "]" * 1024,
    "[" * 1025 + "]" * 1025,
    '{"a":' * 600 + "1" + "}" * 600,
]


def same(a: Any, b: Any) -> bool:
    """Equal with the same types throughout (and the same sign of zero); iterative, for deep documents."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if type(x) is not type(y):
            return False
        if type(x) is float:
            if not ((math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))):
                return False
        elif type(x) is list:
            if len(x) != len(y):
                return False
            pending.extend(zip(x, y, strict=True))
        elif type(x) is dict:
            if list(x) != list(y):
                return False
            pending.extend((x[k], y[k]) for k in x)
        elif x != y:
            return False
    return True


def outcome(read: Any, data: Any, strip_bom: bool) -> tuple[str, Any]:
    try:
        return ("value", read(data, strip_bom=strip_bom))
    except JsonTextError as exc:
        return ("error", str(exc))


def assert_same_reading(data: str | bytes) -> None:
    forms: list[Any] = [data]
    if isinstance(data, bytes):
        forms += [bytearray(data), memoryview(data)]
    else:
        try:
            forms.append(data.encode("utf-8"))
        except UnicodeEncodeError:
            pass
    for form in forms:
        for strip_bom in (False, True):
            got, want = outcome(loads, form, strip_bom), outcome(_loads_json, form, strip_bom)
            assert got[0] == want[0], (data[:80], strip_bom, got, want)
            if got[0] == "error":
                assert got[1] == want[1]
            else:
                assert same(got[1], want[1]), (data[:80], strip_bom, got, want)
                value, native = loads_native(form, strip_bom=strip_bom)
                if native:  # what Job._read_common(native=True) relies on to skip its walk
                    ensure_json_native(value, "value", allow_large_ints=True)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixtures_read_the_same(path: Any) -> None:
    raw = path.read_bytes()
    assert_same_reading(raw)
    assert_same_reading(raw.decode("utf-8"))
    # The fast path really serves the common envelope.
    assert _loads_orjson(raw) is not _UNREAD


@pytest.mark.parametrize("data", EDGE_CASES, ids=range(len(EDGE_CASES)))
def test_edge_cases_read_the_same(data: str | bytes) -> None:
    assert_same_reading(data)


def _random_number(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return str(rng.randint(-(2**70), 2**70) >> rng.randrange(70))
    if kind == 1:
        return repr(rng.uniform(-1e6, 1e6))
    if kind == 2:
        # Any double, from its bits (skipping NaN and infinities, which repr would not write as JSON).
        value = float.fromhex(f"{rng.choice('+-')}0x1.{rng.getrandbits(52):013x}p{rng.randint(-1074, 1023)}")
        return repr(value).replace("inf", "1e400")
    if kind == 3:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25)))
        return rng.choice(["", "-"]) + (digits.lstrip("0") or "0")
    if kind == 4:
        mantissa = f"{rng.randint(0, 10 ** rng.randint(1, 20))}.{rng.randint(0, 10 ** rng.randint(1, 20))}"
        return f"{mantissa}e{rng.randint(-340, 340)}"
    return rng.choice(["0", "-0", "0.0", "-0.0", "1e308", "1e309", "5e-324", "1e-330"])


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return json.loads(_random_number(rng))
    if kind == 1:
        return "".join(
            chr(rng.choice([rng.randint(32, 126), rng.randint(0, 0x10FFFF)])) for _ in range(rng.randrange(8))
        )
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4):
        return "".join(rng.choice('abc\u00e9\u20ac\U0001f600"\\/\n') for _ in range(rng.randrange(6)))
    if kind in (5, 6):
        return {_random_value(rng, 9) if rng.random() < 0.8 else "k": _random_value(rng, depth + 1) for _ in range(3)}
    return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


_PIECES = ["[", "]", "{", "}", ",", ":", '"', "\\", "-", "0", "1", "9" * 20, "e", ".", " ", "\ufeff", "NaN", "\x00"]


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(text) + 1)
        kind = rng.randrange(3)
        if kind == 0:
            text = text[:at] + rng.choice(_PIECES) + text[at:]
        elif kind == 1:
            text = text[:at] + text[at + rng.randint(1, 3) :]
        else:
            text = text[:at] + rng.choice(_PIECES) + text[at + 1 :]
    return text


def test_generated_documents_read_the_same() -> None:
    rng = random.Random(14)
    envelope = (fixtures_dir() / "valid").glob("*.json").__next__().read_text(encoding="utf-8")
    for _ in range(3000):
        number = _random_number(rng)
        assert_same_reading(number)
        document = json.dumps(_random_value(rng), ensure_ascii=rng.random() < 0.3)
        assert_same_reading(document)
        assert_same_reading(_mutate(rng, document))
        assert_same_reading(_mutate(rng, envelope))
        raw = envelope.encode("utf-8")
        at = rng.randrange(len(raw))
        assert_same_reading(raw[:at] + bytes([rng.randrange(256)]) + raw[at + 1 :])


#: args/meta values the tolerant read's walk refuses or that only Python's json reads.
ODD_PAYLOADS = [
    '"\\ud800"',
    '{"\\udc00": 1}',
    "1e400",
    "[-1e400]",
    "18446744073709551616",
    "[9007199254740993]",
    "[" * 254 + "]" * 254,
    "[" * 255 + "]" * 255,
    "[" * 256 + "]" * 256,
    "[" * 300 + "]" * 300,
    '{"a":' * 260 + "1" + "}" * 260,
    '[1, "\u00e9", {"k": [true, null, -0.0]}]',
]


@pytest.mark.parametrize("payload", ODD_PAYLOADS, ids=range(len(ODD_PAYLOADS)))
@pytest.mark.parametrize("field", ["args", "meta"])
def test_a_native_read_skips_no_check_of_args_and_meta(payload: str, field: str, monkeypatch: Any) -> None:
    """The envelope reads (job or typed error) as it does when only Python's json reads text."""
    message = encode(Job.create("email.send", ["a"], meta={"m": 1}))
    text = message.body.decode("utf-8")
    value = f"[{payload}]" if field == "args" else f'{{"x": {payload}}}'
    body = text.replace('"args":["a"]' if field == "args" else '"meta":{"m":1}', f'"{field}":{value}').encode()
    assert body != message.body

    def readings() -> list[Any]:
        out = []
        for read in (
            lambda: Job.from_json(body, strict=False),
            lambda: decode(body, message.properties, message.headers),
        ):
            try:
                out.append(read())
            except (ValidationError, DecodeError) as exc:
                out.append((type(exc), str(exc), exc.field, getattr(exc, "code", None)))
        return out

    got = readings()
    # The reference: Python's json reads, nothing is taken as native, args/meta are walked.
    monkeypatch.setattr(
        "ojs_kombu.model.body.loads_native",
        lambda data, strip_bom=False: (_loads_json(data, strip_bom=strip_bom), False),
    )
    assert got == readings()


def test_the_consumer_reads_a_common_envelope_natively() -> None:
    body = encode(Job.create("email.send", ["a", {"b": [1.5]}], meta={"m": 1})).body
    assert loads_native(body)[1] is True
