"""Pure logic of ojs_kombu.spark (no broker, no Spark session): value mapping, ids, options, schema checks."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from pyspark.sql import Row
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampNTZType

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.ids import JOB_ID_RE
from ojs_kombu.spark.ids import key_id, stream_id
from ojs_kombu.spark.options import check_schema, parse_write_options
from ojs_kombu.spark.publish import RowMapper
from ojs_kombu.spark.values import to_json


def test_values_map_to_json_native():
    moment = datetime(2026, 2, 15, 10, 30, 0, 250, tzinfo=UTC)
    row = Row(a=Decimal("12.50"), d=date(2026, 2, 15), t=moment, nested=[Row(x=1, m={"k": Decimal("1")})], m={7: True})
    assert to_json(row, "c") == {
        "a": "12.50",
        "d": "2026-02-15",
        "t": "2026-02-15T10:30:00.000250Z",
        "nested": [{"x": 1, "m": {"k": "1"}}],
        "m": {"7": True},
    }
    assert to_json(datetime(2026, 2, 15, 10, 30), "c", naive_is_utc=True) == "2026-02-15T10:30:00.000Z"
    assert to_json(Decimal("1E+3"), "c") == "1000"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (b"\x00", "binary"),
        ([1, bytearray(b"x")], "binary"),
        (float("nan"), "not a JSON number"),
        (2**60, "beyond"),
        ({1.5: 1}, "map key"),
    ],
)
def test_values_refused_name_the_column(value, words):
    with pytest.raises(ValidationError, match=words) as caught:
        to_json(value, "payload")
    assert "'payload" in str(caught.value)


def test_ids_are_deterministic_uuid7_shaped():
    first = key_id("run-1", [42], 1_700_000_000_000)
    assert first == key_id("run-1", [42], 1_700_000_000_000) and JOB_ID_RE.fullmatch(first)
    assert first.startswith("018bcfe5-6800-7")  # the timestamp bits
    assert len({first, key_id("run-2", [42], 1_700_000_000_000), key_id("run-1", [43], 1_700_000_000_000)}) == 3
    assert stream_id("q", 3, 1, 7, 0) == stream_id("q", 3, 1, 7, 0) != stream_id("q", 3, 1, 8, 0)


def test_options_are_parsed_and_checked():
    plan = parse_write_options(
        {
            "URL": "amqp://x//",
            "keyColumns": "a, b",
            "BATCHSIZE": "50",
            "max_priority": "10",
            "idTimestamp": "1970-01-01T00:00:01Z",
        }
    )
    assert plan.key_columns == ("a", "b") and plan.batch_size == 50 and plan.id_timestamp_ms == 1000
    assert plan.queue_options is not None and plan.queue_options.max_priority == 10
    for options, words in [
        ({"queu": "email"}, "unknown option"),
        ({"batchSize": "0"}, "batchsize must be an integer >= 1"),
        ({"queue": "dlx.email"}, "queue"),
        ({"type": "Not A Type"}, "type"),
        ({"overflow": "explode"}, "overflow"),
        ({"scheduling": "maybe"}, "true or false"),
    ]:
        with pytest.raises(ValidationError, match=words):
            parse_write_options({"url": "amqp://x//", **options})


def test_schema_checks_fail_on_missing_columns_and_binary():
    schema = StructType(
        [StructField("id", LongType()), StructField("blob", BinaryType()), StructField("s", StringType())]
    )
    plan = parse_write_options({"url": "amqp://x//", "type": "t.x", "argsColumns": "id,nope"})
    with pytest.raises(ValidationError, match="no column 'nope'"):
        check_schema(plan, schema)
    with pytest.raises(ValidationError, match="'blob' holds binary"):
        check_schema(parse_write_options({"url": "amqp://x//", "type": "t.x"}), schema)  # default kwargs: every column
    ok = check_schema(parse_write_options({"url": "amqp://x//", "type": "t.x", "argsColumns": "id,s"}), schema)
    assert ok.args_columns == ("id", "s")
    with pytest.raises(ValidationError, match="no job type"):
        check_schema(parse_write_options({"url": "amqp://x//", "argsColumns": "id"}), schema)
    ntz = StructType([StructField("when", TimestampNTZType())])
    assert check_schema(parse_write_options({"url": "amqp://x//", "type": "t.x"}), ntz).utc_columns == {"when"}


def test_row_mapper_builds_the_job():
    plan = parse_write_options({"url": "amqp://x//", "type": "t.x", "argsColumns": "a", "kwargsColumns": "b"})
    row = Row(a=1, b="x", queue="other", priority=3, meta='{"k": 1}', tags=["t"], scheduled_at=None)
    job = RowMapper(plan, row.__fields__).job(row, None)
    assert (job.args, job.kwargs, job.queue, job.priority) == ([1], {"b": "x"}, "other", 3)
    assert job.meta == {"k": 1, "kwargs": {"b": "x"}, "tags": ["t"]} and job.scheduled_at is None
    with pytest.raises(ValidationError, match="column 'meta'"):
        bad = Row(a=1, b="x", meta="[1]")
        RowMapper(plan, bad.__fields__).job(bad, None)


def test_key_ids_take_their_time_from_created_at_else_id_timestamp():
    created = datetime(2026, 2, 15, 10, 30, tzinfo=UTC)
    ms = int(created.timestamp() * 1000)
    keyed = parse_write_options({"url": "amqp://x//", "type": "t.x", "keyColumns": "k", "idTimestamp": "5"})
    row = Row(k="a", created_at=created)
    mapper = RowMapper(keyed, row.__fields__)
    assert mapper.key_id(row) == key_id("", ["a"], ms)
    assert mapper.job(row, mapper.key_id(row)).kwargs == {"k": "a"}  # created_at is not an argument
    plain = Row(k="a")
    assert RowMapper(keyed, plain.__fields__).key_id(plain) == key_id("", ["a"], 5)
