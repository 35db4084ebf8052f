"""``RateLimitPolicy`` (ojs-rate-limiting.md §6): the spec's examples, its MUSTs, typed errors; window slots."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.job import Job
from ojs_kombu.model.ratelimit import RateLimitPolicy, RateWindow
from ojs_kombu.policy.ratelimit import WindowSchedule

JOB = {
    "specversion": "1.0",
    "id": "019539a4-b68c-7def-8000-1a2b3c4d5e6f",
    "queue": "default",
    "attempt": 0,
}

# The examples of spec §14, each one's job fields.
EXAMPLES = {
    "14.1": {
        "type": "payment.process",
        "args": [{"order_id": "ord_123", "amount": 9999}],
        "rate_limit": {"key": "payment-api", "concurrency": 5},
    },
    "14.2": {
        "type": "email.send",
        "args": [{"to": "user@example.com", "template": "welcome"}],
        "rate_limit": {"key": "email-provider", "rate": {"limit": 1000, "period": "PT1H"}},
    },
    "14.3": {
        "type": "report.generate",
        "args": [{"report_id": "rpt_456"}],
        "meta": {"tenant_id": "acme-corp"},
        "rate_limit": {"key": "tenant:acme-corp:reports", "concurrency": 3, "throttle": {"limit": 1, "period": "PT1S"}},
    },
    "14.4": {
        "type": "notification.push",
        "args": [{"user_id": "u_789", "message": "New follower!"}],
        "rate_limit": {"key": "push-notifications", "rate": {"limit": 10000, "period": "PT1M"}, "on_limit": "drop"},
    },
    "14.5": {
        "type": "api.sync",
        "args": [{"endpoint": "/users", "page": 1}],
        "rate_limit": {
            "key": "api.partner.com",
            "concurrency": 10,
            "rate": {"limit": 500, "period": "PT1M"},
            "throttle": {"limit": 10, "period": "PT1S"},
            "on_limit": "wait",
        },
    },
}


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_spec_examples_read_and_round_trip(example: str, strict: bool) -> None:
    envelope = {**JOB, **EXAMPLES[example]}
    job = Job.from_json(json.dumps(envelope), strict=strict)
    assert isinstance(job.rate_limit, RateLimitPolicy)
    assert job.to_dict() == envelope


def test_the_combined_example_reads_as_the_spec_says() -> None:
    policy = Job.from_json({**JOB, **EXAMPLES["14.5"]}).rate_limit
    assert policy is not None
    assert policy.concurrency == 10
    assert policy.rate == RateWindow(limit=500, period="PT1M")
    assert policy.throttle is not None and policy.throttle.interval_seconds == pytest.approx(0.1)  # 100 ms apart
    assert policy.action == "wait"


def test_on_limit_defaults_to_wait_and_is_not_emitted_when_absent() -> None:
    policy = RateLimitPolicy(key="k", concurrency=1)
    assert policy.on_limit is None and policy.action == "wait" and not policy.lossy
    assert policy.to_dict() == {"key": "k", "concurrency": 1}
    assert RateLimitPolicy(key="k", on_limit="drop").lossy


def test_a_job_carries_the_policy_as_the_rate_limit_object() -> None:
    job = Job.create("payment.process", [1])
    job.rate_limit = RateLimitPolicy(key="payment-api", concurrency=5)
    assert job.to_dict()["rate_limit"] == {"key": "payment-api", "concurrency": 5}
    job.rate_limit = {"key": "k", "rate": {"limit": 2, "period": timedelta(minutes=1)}}  # type: ignore[assignment]
    assert isinstance(job.rate_limit, RateLimitPolicy)
    assert Job.from_json(job.to_json()).to_dict()["rate_limit"] == {"key": "k", "rate": {"limit": 2, "period": "PT1M"}}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"concurrency": 1}, "key"),
        ({"key": ""}, "key"),
        ({"key": "-starts-with-a-dash"}, "key"),
        ({"key": "has space"}, "key"),
        ({"key": "k" * 161}, "key"),
        ({"key": 7}, "key"),
        ({"key": "k", "concurrency": -1}, "concurrency"),
        ({"key": "k", "concurrency": 1.5}, "concurrency"),
        ({"key": "k", "concurrency": True}, "concurrency"),
        ({"key": "k", "rate": {"period": "PT1M"}}, "rate.limit"),
        ({"key": "k", "rate": {"limit": 10}}, "rate.period"),
        ({"key": "k", "rate": {"limit": 0, "period": "PT1M"}}, "rate.limit"),
        ({"key": "k", "rate": {"limit": 1, "period": "P1M"}}, "rate.period"),
        ({"key": "k", "throttle": {"limit": 1, "period": "PT0S"}}, "throttle.period"),
        ({"key": "k", "throttle": {"limit": 1, "period": "soon"}}, "throttle.period"),
        ({"key": "k", "on_limit": "skip"}, "on_limit"),
        ({"key": "k", "burst": 3}, "burst"),
    ],
)
def test_a_bad_field_is_a_validation_error_naming_it(fields: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        RateLimitPolicy.model_validate(fields)
    assert info.value.field == field
    job = Job.create("a.b")
    with pytest.raises(ValidationError) as info:
        job.rate_limit = fields  # type: ignore[assignment]
    assert info.value.field == f"rate_limit.{field}"
    with pytest.raises(ValidationError) as info:
        Job.create("a.b", rate_limit=fields)
    assert info.value.field == f"rate_limit.{field}"


def test_job_create_carries_rate_limit_as_the_spec_object_read_back_by_job() -> None:
    policy = RateLimitPolicy(key="tenant:acme", concurrency=3, throttle={"limit": 1, "period": "PT1S"})
    job = Job.create("report.generate", [1], rate_limit=policy)
    assert job.rate_limit is policy
    wire = json.loads(job.to_json())
    assert wire["rate_limit"] == {"key": "tenant:acme", "concurrency": 3, "throttle": {"limit": 1, "period": "PT1S"}}
    for strict in (True, False):
        back = Job.from_json(job.to_json_bytes(), strict=strict)
        assert back.rate_limit == policy
        assert back.rate_limit is not None and back.rate_limit.action == "wait"
    as_dict = Job.create("a.b", rate_limit={"key": "k", "concurrency": 0, "on_limit": "reschedule"})
    assert as_dict.rate_limit == RateLimitPolicy(key="k", concurrency=0, on_limit="reschedule")
    assert "rate_limit" not in Job.create("a.b").to_dict()
    with pytest.raises(ValidationError) as info:
        Job.create("a.b", rate_limit="k")  # type: ignore[arg-type]
    assert info.value.field == "rate_limit"


def test_keys_of_the_spec_patterns_are_accepted() -> None:
    for key in ("api.stripe.com", "tenant:acme-corp", "queue:email", "type:report.generate", "tenant:acme:api:stripe"):
        assert RateLimitPolicy(key=key).key == key


def test_a_received_envelope_with_a_bad_rate_limit_is_refused_with_the_path() -> None:
    envelope = {**JOB, "type": "a.b", "args": [], "rate_limit": {"key": "k", "concurrency": "three"}}
    with pytest.raises(ValidationError) as info:
        Job.from_json(envelope, strict=False)
    assert info.value.field == "rate_limit.concurrency"


def test_window_schedules_of_rate_and_throttle() -> None:
    policy = RateLimitPolicy.model_validate(EXAMPLES["14.5"]["rate_limit"])
    rate, throttle = WindowSchedule.for_policy(policy)
    assert (rate.kind, rate.capacity, rate.interval) == ("rate", 500, 60.0)
    assert (throttle.kind, throttle.capacity) == ("throttle", 1)
    assert throttle.interval == pytest.approx(0.1)
    assert WindowSchedule.for_policy(RateLimitPolicy(key="k", concurrency=1)) == []


def test_slots_are_fixed_windows_aligned_to_the_epoch() -> None:
    schedule = WindowSchedule("rate", 10, 60.0)
    assert schedule.slot(120.0) == 2 and schedule.slot(179.999) == 2 and schedule.slot(180.0) == 3
    assert (schedule.start(2), schedule.end(2)) == (120.0, 180.0)
    assert schedule.until_next(150.0) == 30.0
    assert schedule.until_next(120.0) == 60.0  # at a boundary: the whole next window


def test_the_entities_of_a_key_are_named_under_the_deployment_prefix() -> None:
    from ojs_kombu.amqp.permits import MAX_PERMITS
    from ojs_kombu.model.naming import Names

    names = Names("acme")
    assert names.limit_permit_queue("tenant:acme:api") == "acme.ojs.limit.tenant:acme:api.permits"
    assert names.limit_holder_queue("k", 3) == "acme.ojs.limit.k.held.3"
    assert names.limit_seed_lock("k") == "acme.ojs.limit.k.seeding"
    assert Names().limit_window_queue("k", "throttle") == "ojs.limit.k.throttle"
    longest = Names("p" * 60).limit_holder_queue("k" * 160, MAX_PERMITS - 1)
    assert len(longest.encode()) <= 255  # RabbitMQ's limit on a queue name
