"""Window rates across connections (``ojs_kombu.amqp.windows``, ``ojs_kombu.runtime.refill``, spec §5.2/§5.3).

A refiller publishes each slot's tokens; four connections compete for them for three seconds:
never more than ``limit`` starts per window, each token taken inside the window it was published
for; a throttle grants one start per slot.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from ojs_kombu.amqp.connection import connect_once, make_connection
from ojs_kombu.amqp.permits import Permits
from ojs_kombu.amqp.windows import WindowTokens
from ojs_kombu.model.naming import Names
from ojs_kombu.model.ratelimit import RateLimitPolicy
from ojs_kombu.policy.ratelimit import WindowSchedule
from ojs_kombu.runtime.leader import LeaderLease
from ojs_kombu.runtime.refill import CLAIM_INTERVAL, KeyRefills, WindowRefiller
from tests.support import wait_until


def _compete(
    amqp_url: str, names: Names, key: str, schedule: WindowSchedule, seconds: float
) -> list[tuple[int, float, float]]:
    """Four connections take tokens as fast as they can for ``seconds``: ``(slot, asked at, got at)``."""
    takes: list[tuple[int, float, float]] = []
    lock = threading.Lock()
    end = time.time() + seconds

    def run() -> None:
        connection = make_connection(amqp_url, heartbeat=0, ssl=None, transport_options=None, connection_name="t")
        connect_once(connection)
        try:
            tokens = WindowTokens(connection.connection.channel(), names)
            while time.time() < end:
                asked = time.time()
                slot = tokens.acquire(key, schedule, timeout=max(0.0, end - time.time()))
                if slot is not None:
                    with lock:
                        takes.append((slot, asked, time.time()))
        finally:
            connection.release()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)
    return takes


def test_a_rate_of_ten_per_second_grants_at_most_ten_per_window(amqp_url: str, names: Names) -> None:
    policy = RateLimitPolicy(key="email-provider", rate={"limit": 10, "period": "PT1S"})
    (schedule,) = WindowSchedule.for_policy(policy)
    with WindowRefiller([policy], amqp_url, names=names) as refiller:
        wait_until(lambda: refiller.refills, timeout=5, message="a first refill")
        takes = _compete(amqp_url, names, policy.key, schedule, 3.0)
    per_slot = Counter(slot for slot, _, _ in takes)
    assert per_slot and max(per_slot.values()) <= 10
    assert sum(per_slot.values()) >= 20  # three windows were refilled (the first may be partial)
    for slot, asked, got in takes:
        # The broker handed the token out inside its window: asked before the window ended, got after it began.
        assert asked < schedule.end(slot) and got >= schedule.start(slot), (slot, asked, got)
    by_wall_clock = Counter(schedule.slot(got) for _, _, got in takes)
    print(
        f"\nrate 10/s over 3 s: starts per window {sorted(per_slot.values())}, by time taken {sorted(by_wall_clock.values())}"
    )


def test_a_throttle_grants_one_start_per_slot(amqp_url: str, names: Names) -> None:
    policy = RateLimitPolicy(key="reports", throttle={"limit": 5, "period": "PT1S"})
    (schedule,) = WindowSchedule.for_policy(policy)
    with WindowRefiller([policy], amqp_url, names=names) as refiller:
        wait_until(lambda: refiller.refills, timeout=5, message="a first refill")
        takes = _compete(amqp_url, names, policy.key, schedule, 2.0)
    per_slot = Counter(slot for slot, _, _ in takes)
    assert max(per_slot.values()) == 1
    assert len(takes) >= 8  # 10 slots of 200 ms in 2 s
    starts = sorted(got for _, _, got in takes)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    print(
        f"\nthrottle 5/s: {len(takes)} starts, mean gap {sum(gaps) / len(gaps) * 1000:.0f} ms, min {min(gaps) * 1000:.0f} ms"
    )


def test_only_the_leader_refills(amqp_url: str, names: Names) -> None:
    policy = RateLimitPolicy(key="k", rate={"limit": 3, "period": "PT0.5S"})
    with (
        LeaderLease(amqp_url, names=names, heartbeat=10, renew_interval=0.5, renew_timeout=2) as first,
        LeaderLease(amqp_url, names=names, heartbeat=10, renew_interval=0.5, renew_timeout=2) as second,
    ):
        wait_until(lambda: first.is_leader or second.is_leader, timeout=10, message="a leader")
        leader, follower = (first, second) if first.is_leader else (second, first)
        with (
            WindowRefiller([policy], amqp_url, names=names, lease=leader) as active,
            WindowRefiller([policy], amqp_url, names=names, lease=follower) as idle,
        ):
            wait_until(lambda: len(active.refills) >= 3, timeout=10, message="three refills")
            assert idle.refills == []
            leader.stop()
            wait_until(lambda: follower.is_leader, timeout=10, message="failover")
            wait_until(lambda: len(idle.refills) >= 2, timeout=10, message="the new leader refills")
            before = {slot for _, _, slot, _ in active.refills}
            after = {slot for _, _, slot, _ in idle.refills}
            assert not before & after  # no slot refilled twice


def test_a_changed_rate_needs_no_new_queue(amqp_url: str, names: Names) -> None:
    connection = make_connection(amqp_url, heartbeat=0, ssl=None, transport_options=None, connection_name="t")
    connect_once(connection)
    try:
        tokens = WindowTokens(connection.connection.channel(), names)
        slow, fast = WindowSchedule("rate", 2, 60.0), WindowSchedule("rate", 5, 60.0)
        now = time.time()
        channel = tokens.channel
        queue = names.limit_window_queue("k", "rate")
        assert tokens.refill("k", slow, slow.slot(now), now=now) == 2
        # Unconfirmed publishes may still be on their way when a purge runs: a slot apart in real use.
        wait_until(lambda: channel.queue_declare(queue, passive=True).message_count == 2, timeout=5)
        assert tokens.refill("k", fast, fast.slot(now), now=now) == 5  # purged, then refilled at the new rate
        wait_until(lambda: channel.queue_declare(queue, passive=True).message_count == 5, timeout=5)
        taken = [tokens.take("k", fast) for _ in range(6)]
        assert taken[:5] == [fast.slot(now)] * 5 and taken[5] is None
    finally:
        connection.release()


def test_one_workers_refills_hold_a_window_and_the_next_takes_over_when_it_goes(amqp_url: str, names: Names) -> None:
    """``KeyRefills`` (a worker's): of two processes' refills of one window, only the holder of its refill
    permit refills; when its connection goes (a dead worker), the other claims the permit and refills."""
    schedule = WindowSchedule("throttle", 1, 0.2)
    first, second = Permits(amqp_url, names=names), Permits(amqp_url, names=names)
    ones = KeyRefills(lambda: first), KeyRefills(lambda: second)
    try:
        for refills in ones:
            refills.add("k", schedule)
        wait_until(lambda: any(r.refills for r in ones), timeout=5, message="a refill")
        leader, other = ones if ones[0].leading("k", "throttle") else ones[::-1]
        assert not other.leading("k", "throttle") and not other.refills
        (first if leader is ones[0] else second).close()  # the leader's connection is gone
        wait_until(lambda: other.refills, timeout=2 + CLAIM_INTERVAL, message="the other one refilling")
        assert other.leading("k", "throttle")
        slots = [slot for _, _, slot, _ in leader.refills + other.refills]
        assert len(slots) == len(set(slots)), "no slot refilled twice"
    finally:
        for refills in ones:
            refills.stop()
        first.close()
        second.close()
