"""Which policies the Worker's Limiter applies to a job (ojs-rate-limiting.md §7.2): pure logic, no broker."""

from __future__ import annotations

from typing import Any

from ojs_kombu.model.job import Job
from ojs_kombu.model.ratelimit import RateLimitPolicy
from ojs_kombu.runtime.limits import Limiter


def _limiter(queue_policies: dict[str, RateLimitPolicy]) -> Limiter:
    def unused(*_: Any) -> Any:
        raise AssertionError("no broker call expected")

    return Limiter(unused, queue_policies, settler=unused, resubmit=unused, park_limit=0)  # type: ignore[arg-type]


def test_a_job_is_limited_by_its_queue_and_its_own_policy_one_per_key_the_smaller_wins_sorted() -> None:
    limiter = _limiter({"mail": RateLimitPolicy(key="queue:mail", concurrency=20)})
    assert limiter.park_limit == 1  # at least one parked per key
    job = Job.create("a.b", queue="mail", rate_limit=RateLimitPolicy(key="api", concurrency=3))
    assert [(p.key, p.concurrency) for p in limiter.policies(job)] == [("api", 3), ("queue:mail", 20)]
    same_key = Job.create("a.b", queue="mail", rate_limit={"key": "queue:mail", "concurrency": 5})
    assert [(p.key, p.concurrency) for p in limiter.policies(same_key)] == [("queue:mail", 5)]
    other_queue = Job.create("a.b", queue="other")
    assert limiter.policies(other_queue) == []
    # A policy without a concurrency takes no permit; its windows are start tokens, the fewer starts per key win.
    windows_only = Job.create(
        "a.b", queue="mail", rate_limit={"key": "queue:mail", "rate": {"limit": 1, "period": "PT1S"}}
    )
    assert limiter.policies(windows_only) == [RateLimitPolicy(key="queue:mail", concurrency=20)]
    assert [(p.key, s.kind, s.capacity) for p, s in limiter.windows(windows_only)] == [("queue:mail", "rate", 1)]
    both = _limiter(
        {
            "mail": RateLimitPolicy(
                key="api", rate={"limit": 100, "period": "PT1M"}, throttle={"limit": 2, "period": "PT1S"}
            )
        }
    )
    job = Job.create("a.b", queue="mail", rate_limit={"key": "api", "rate": {"limit": 2, "period": "PT1S"}})
    assert [(s.kind, s.capacity, s.interval) for _, s in both.windows(job)] == [
        ("rate", 100, 60.0),
        ("throttle", 1, 0.5),
    ]


def test_a_job_without_limits_is_admitted_with_no_permit_and_no_broker_call() -> None:
    limiter = _limiter({"mail": RateLimitPolicy(key="queue:mail", concurrency=1)})
    assert limiter.admit(None, Job.create("a.b", queue="other")) == ()  # type: ignore[arg-type]
    assert list(limiter.snapshot()) == []
