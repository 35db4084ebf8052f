"""Finding limit keys and unique locks in a management API queue listing (pure: no broker)."""

from __future__ import annotations

from ojs_kombu.dashboard.holds import limit_rows, lock_rows

LIMIT = "t1.ojs.limit."
LOCK = "t1.ojs.lock."


def q(name: str, **fields: object) -> dict[str, object]:
    return {"name": name, **fields}


def test_limit_keys_are_found_by_their_permit_queue_and_count_their_held_indexes():
    queues = [
        q("t1.ojs.limit.api.partner.com.permits", consumers=5),
        q("t1.ojs.limit.api.partner.com.held.0", consumers=1),
        q("t1.ojs.limit.api.partner.com.held.1", consumers=0),
        q("t1.ojs.limit.api.partner.com.held.10", consumers=1),
        q("t1.ojs.limit.api.partner.com.seeding", consumers=0),
        q("t1.ojs.limit.api.partner.com.rate"),
        q("t1.ojs.limit.api.held.0", consumers=1),  # another key's name, a prefix of this one: no permit queue
        q("t1.ojs.limit.b.permits"),
        q("t1.ojs.lock.abc"),
    ]
    assert limit_rows(queues, LIMIT) == {"api.partner.com": (3, [0, 10]), "b": (0, [])}


def test_locks_are_lock_queues_with_a_token_their_holder_records_skipped():
    queues = [
        q("t1.ojs.lock.aa", messages=1, node="rabbit@a"),
        q("t1.ojs.lock.aa.holder", messages=1, node="rabbit@a"),
        q("t1.ojs.lock.bb", messages=0, node="rabbit@b"),  # released or expired: idle
        q("t1.ojs.lock.fanin.wf-1", messages=1, node="rabbit@b"),
        q("t1.ojs.lock.x.holder", messages=1, node="rabbit@a"),  # no lock "x": itself a lock named x.holder
        q("t1.ojs.limit.k.permits", messages=3),
        q("t2.ojs.lock.cc", messages=1),
    ]
    held, idle = lock_rows(queues, LOCK)
    assert held == [("aa", "rabbit@a"), ("fanin.wf-1", "rabbit@b"), ("x.holder", "rabbit@a")]
    assert idle == 1


def test_nothing_listed_nothing_found():
    assert limit_rows([], LIMIT) == {}
    assert lock_rows([], LOCK) == ([], 0)
