"""Unique jobs without a broker: the policy's effective values, its period and its key (spec §2-7)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest

from ojs_kombu import DuplicateJobError, Job, Names, OjsError, UniquePolicy, ValidationError
from ojs_kombu.policy import (
    DEFAULT_STATES,
    canonical_json,
    effective_keys,
    effective_on_conflict,
    effective_states,
    job_unique_key,
    period_end,
    unique_key,
)
from ojs_kombu.policy.unique import dimensions


def test_defaults_are_the_specs():
    policy = UniquePolicy()
    assert effective_keys(policy) == ("type",)
    assert effective_states(policy) == ("available", "active", "scheduled", "retryable", "pending")
    assert DEFAULT_STATES == effective_states(policy)
    assert effective_on_conflict(policy) == "reject"
    assert period_end(policy, datetime(2026, 1, 1, tzinfo=UTC)) is None


def test_type_is_always_a_dimension():
    assert effective_keys(UniquePolicy(keys=["args"])) == ("type", "args")
    assert effective_keys(UniquePolicy(keys=["meta", "queue"], meta_keys=["t"])) == ("type", "queue", "meta")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"keys": ["argz"]}, "keys"),
        ({"keys": ["Type"]}, "keys"),  # case-sensitive (spec §2.2)
        ({"keys": ["type", "meta"]}, "meta_keys"),
        ({"keys": ["meta"], "meta_keys": []}, "meta_keys"),
        ({"states": ["running"]}, "states"),
        ({"on_conflict": "overwrite"}, "on_conflict"),
        ({"period": "1h"}, "period"),
        ({"period": "PT"}, "period"),
    ],
)
def test_invalid_policies_name_the_field(kwargs, field):
    with pytest.raises(ValidationError) as info:
        UniquePolicy(**kwargs)
    assert info.value.field is not None and info.value.field.split("[")[0].split(".")[0] == field, info.value.field


def test_every_on_conflict_and_state_of_the_spec_is_accepted():
    for mode in ("reject", "replace", "replace_except_schedule", "ignore"):
        assert effective_on_conflict(UniquePolicy(on_conflict=mode)) == mode
    states = ["scheduled", "available", "pending", "active", "completed", "retryable", "cancelled", "discarded"]
    assert effective_states(UniquePolicy(states=states)) == tuple(states)


def test_spec_example_4_3():
    # ojs-unique-jobs.md §4.3: the canonical text is given; its hash is marked illustrative.
    policy = UniquePolicy(keys=["type", "queue", "args"], args_keys=["user_id"])
    args = {"user_id": 42, "template": "welcome", "locale": "en-US"}
    meta = {"tenant_id": "acme", "trace_id": "abc123"}
    chosen = dimensions(policy, type="email.send", queue="notifications", args=args, meta=meta)
    text = b'{"args":{"user_id":42},"queue":"notifications","type":"email.send"}'
    assert canonical_json(chosen) == text
    key = unique_key(policy, type="email.send", queue="notifications", args=args, meta=meta)
    assert key == hashlib.sha256(text).hexdigest()
    assert key == "71f9344b82e66297a49775bbe27752297922842b675330641ebe3ff4fea46c1f"


def test_spec_examples_10_2_and_10_7():
    welcome = UniquePolicy(keys=["type", "args"], args_keys=["user_id"])
    a = unique_key(welcome, type="email.send_welcome", queue="default", args={"user_id": 42, "locale": "en-US"})
    b = unique_key(welcome, type="email.send_welcome", queue="other", args={"user_id": 42, "locale": "fr-FR"})
    c = unique_key(welcome, type="email.send_welcome", queue="default", args={"user_id": 99, "locale": "en-US"})
    assert a == b != c
    tenant = UniquePolicy(keys=["type", "args", "meta"], meta_keys=["tenant_id"])
    acme = unique_key(
        tenant, type="cache.warm", queue="q", args={"resource": "products"}, meta={"tenant_id": "acme", "region": "x"}
    )
    acme2 = unique_key(
        tenant, type="cache.warm", queue="q", args={"resource": "products"}, meta={"tenant_id": "acme", "region": "y"}
    )
    globex = unique_key(tenant, type="cache.warm", queue="q", args={"resource": "products"}, meta={"tenant_id": "g"})
    assert acme == acme2 != globex


def test_queue_scoping_and_type():
    scoped = UniquePolicy(keys=["type", "queue"])
    assert unique_key(scoped, type="t", queue="a", args=[]) != unique_key(scoped, type="t", queue="b", args=[])
    plain = UniquePolicy()
    assert unique_key(plain, type="t", queue="a", args=[1]) == unique_key(plain, type="t", queue="b", args=[2])
    assert unique_key(plain, type="t", queue="a", args=[]) != unique_key(plain, type="u", queue="a", args=[])


def test_key_ignores_key_order_and_unicode_form():
    policy = UniquePolicy(keys=["args"])
    first = unique_key(policy, type="t", queue="q", args=[{"a": 1, "b": "caf\u00e9"}])
    second = unique_key(policy, type="t", queue="q", args=[{"b": "cafe\u0301", "a": 1}])
    assert first == second


def test_args_keys_on_ojs_list_args():
    policy = UniquePolicy(keys=["args"], args_keys=["user_id"])
    one_object = unique_key(policy, type="t", queue="q", args=[{"user_id": 7, "x": 1}])
    kwargs = unique_key(policy, type="t", queue="q", args=["ignored"], meta={"kwargs": {"user_id": 7}})
    assert one_object == kwargs
    by_position = UniquePolicy(keys=["args"], args_keys=["1"])
    assert unique_key(by_position, type="t", queue="q", args=["a", 5]) == unique_key(
        by_position, type="t", queue="q", args=["b", 5]
    )


def test_missing_args_or_meta_keys_are_refused():
    with pytest.raises(ValidationError) as info:
        unique_key(UniquePolicy(keys=["args"], args_keys=["user"]), type="t", queue="q", args=[{"user_id": 1}])
    assert info.value.field == "unique.args_keys"
    with pytest.raises(ValidationError) as info:
        unique_key(UniquePolicy(keys=["meta"], meta_keys=["tenant"]), type="t", queue="q", args=[], meta={})
    assert info.value.field == "unique.meta_keys"


def test_job_unique_key_uses_the_jobs_policy():
    policy = UniquePolicy(keys=["type", "args"])
    job = Job.create("email.send", [1, "x"], queue="mail").model_copy(update={"unique": policy})
    assert job_unique_key(job) == unique_key(policy, type="email.send", queue="mail", args=[1, "x"])
    with pytest.raises(ValidationError) as info:
        job_unique_key(Job.create("email.send", [1], queue="mail"))
    assert info.value.field == "unique"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        # RFC 8785 appendix B numbers
        (0.0, "0"),
        (-0.0, "0"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (333333333.3333333, "333333333.3333333"),
        (1e-7, "1e-7"),
        (0.000001, "0.000001"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (-1.5, "-1.5"),
        (2.0, "2"),
        (9007199254740993, "9007199254740993"),
    ],
)
def test_canonical_numbers(value, text):
    assert canonical_json(value).decode() == text


def test_canonical_json_rfc8785_sample():
    # RFC 8785 §3.2.3 sorts by UTF-16 code units; "\u20ac" (euro) sorts before "\U0001f600" (emoji) there.
    value = {"\U0001f600": 1, "\u20ac": 2, "\r": 3, "1": 4, "\u00f6": 5, "\x80": 6}
    assert canonical_json(value).decode() == '{"\\r":3,"1":4,"\x80":6,"\u00f6":5,"\u20ac":2,"\U0001f600":1}'
    assert canonical_json({"a": [True, False, None, "\u001f"]}) == b'{"a":[true,false,null,"\\u001f"]}'


def test_canonical_json_refuses_what_is_not_json():
    for bad in (float("nan"), {1: "x"}, {"a": {1, 2}}):
        with pytest.raises(ValidationError):
            canonical_json(bad)


def test_period_end_is_calendar_aware():
    start = datetime(2026, 1, 31, 12, tzinfo=UTC)
    assert period_end(UniquePolicy(period="PT1H"), start) == start + timedelta(hours=1)
    assert period_end(UniquePolicy(period="P1M"), start) == datetime(2026, 2, 28, 12, tzinfo=UTC)
    assert period_end(UniquePolicy(period="P1Y2DT1.5S"), start) == datetime(2027, 2, 2, 12, 0, 1, 500000, tzinfo=UTC)
    assert period_end(UniquePolicy(period=timedelta(days=7)), start) == start + timedelta(days=7)
    with pytest.raises(ValidationError) as info:
        period_end(UniquePolicy(period="P9999Y"), start)
    assert info.value.field == "unique.period"


def test_duplicate_job_error():
    error = DuplicateJobError("duplicate", existing_id="019078a3-b5c7-7def-8a12-3456789abcde", key="ab" * 32)
    assert isinstance(error, OjsError) and isinstance(error, Exception)
    assert error.existing_id == "019078a3-b5c7-7def-8a12-3456789abcde"
    assert error.key == "ab" * 32


def test_lock_queue_names():
    key = "ab" * 32
    assert Names().lock_queue(key) == f"ojs.lock.{key}"
    assert Names("tenant1").lock_queue(key) == f"tenant1.ojs.lock.{key}"
    assert Names("tenant1").lock_holder_queue(key) == f"tenant1.ojs.lock.{key}.holder"
    assert Names().queue_from_job_queue(Names().lock_queue(key)) is None


# -- Job.create(unique=...) and what a job that ends releases ------------------------------------


def test_job_create_takes_a_policy_or_a_dict_and_refuses_a_bad_one():
    job = Job.create("a.b", [1], unique={"keys": ["type", "args"], "period": "PT1H"})
    assert job.unique == UniquePolicy(keys=["type", "args"], period="PT1H")
    assert Job.from_json(job.to_json()).unique == job.unique  # it travels in the envelope
    assert Job.create("a.b", unique=UniquePolicy()).unique == UniquePolicy()
    with pytest.raises(ValidationError) as info:
        Job.create("a.b", unique={"on_conflict": "overwrite"})
    assert info.value.field.startswith("unique")
    with pytest.raises(ValidationError):
        Job.create("a.b", unique=["type"])


def test_a_job_releases_its_lock_when_it_ends_outside_its_states():
    from ojs_kombu.runtime.unique import lock_to_release, remaining_period

    job = Job.create("a.b", [1], unique={"keys": ["type", "args"]})
    assert lock_to_release(job, "completed") == job_unique_key(job)
    assert lock_to_release(job, "discarded") == lock_to_release(job, "cancelled") == job_unique_key(job)
    keeps = Job.create("a.b", [1], unique={"states": ["available", "active", "completed"]})
    assert lock_to_release(keeps, "completed") is None
    assert lock_to_release(Job.create("a.b", [1]), "completed") is None  # no policy
    assert remaining_period(job) is None
    hour = Job.create("a.b", [1], unique={"period": "PT1H"})
    assert timedelta(minutes=59) < remaining_period(hour) <= timedelta(hours=1)
    old = hour.model_copy(update={"created_at": "2020-01-01T00:00:00.000Z"})
    assert remaining_period(old) == timedelta(milliseconds=1)  # its window closed: the shortest lock
