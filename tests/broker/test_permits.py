"""Concurrency permits across connections and processes (``ojs_kombu.amqp.permits``, DESIGN §21, RL-001).

Against a real broker: N permits are never held by more than N holders at once (recorded start and
end times), a SIGKILLed holder's permit goes back through the broker, seeding by many connections
at once mints exactly N tokens, duplicates are removed, resizing, renewal of a worn token, a lost
connection reconnected by the next call (over a failover list whose first node is down).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from ojs_kombu.amqp.management import ManagementClient
from ojs_kombu.amqp.permits import MAX_PERMITS, Permits
from ojs_kombu.errors import PermitLostError, ValidationError
from ojs_kombu.model.naming import Names
from ojs_kombu.model.ratelimit import RateLimitPolicy
from tests.support import wait_until


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, delta in events:  # an end sorts before a start at the same instant
        running += delta
        peak = max(peak, running)
    return peak


def _ready(permits: Permits, key: str) -> int:
    with permits._io:
        permits._open()
        ok = permits._control_channel().queue_declare(permits.names.limit_permit_queue(key), passive=True)
    return int(ok.message_count)


def _await_ready(permits: Permits, key: str, count: int) -> None:
    """The queue holds ``count`` ready tokens (a returned token reaches it asynchronously)."""
    wait_until(lambda: _ready(permits, key) == count, timeout=5, message=f"{count} ready tokens of {key}")


def test_four_connections_never_run_more_than_the_limit(amqp_url: str, names: Names) -> None:
    policy = RateLimitPolicy(key="payment-api", concurrency=2)
    intervals: list[tuple[float, float]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with Permits(amqp_url, names=names) as permits:
                permits.ensure(policy)
                for _ in range(50):
                    permit = permits.acquire(policy, timeout=30)
                    assert permit is not None
                    with permit:
                        start = time.monotonic()
                        time.sleep(0.002)  # the job
                        end = time.monotonic()
                    with lock:
                        intervals.append((start, end))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert len(intervals) == 200
    assert _max_overlap(intervals) == 2
    with Permits(amqp_url, names=names) as permits:
        permits.ensure(policy)
        _await_ready(permits, "payment-api", 2)  # both tokens back, none lost or added


def test_seeding_by_many_connections_at_once_mints_exactly_the_limit(amqp_url: str, names: Names) -> None:
    instances = [Permits(amqp_url, names=names) for _ in range(8)]
    barrier = threading.Barrier(len(instances))
    minted: list[int] = []

    def seed(permits: Permits) -> None:
        barrier.wait()
        minted.append(permits.ensure("k", 3))

    threads = [threading.Thread(target=seed, args=(p,)) for p in instances]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert sorted(minted) == [0] * 7 + [3]
        _await_ready(instances[0], "k", 3)
        held = [instances[i].acquire("k", timeout=2) for i in range(4)]
        assert sorted(p.index for p in held if p is not None) == [0, 1, 2]
        assert held[3] is None
    finally:
        for permits in instances:
            permits.close()


def test_a_duplicate_token_never_makes_a_second_holder_and_is_removed(amqp_url: str, names: Names) -> None:
    with Permits(amqp_url, names=names, dedupe_grace=0.2) as a, Permits(amqp_url, names=names, dedupe_grace=0.2) as b:
        a.ensure("k", 1)
        b.ensure("k", 1)
        a._mint(names.limit_permit_queue("k"), "k", 0)  # a copy of token 0, as a renewal cut short leaves
        _await_ready(a, "k", 2)
        first = a.acquire("k", timeout=2)
        assert first is not None and first.index == 0
        assert b.acquire("k", timeout=1) is None  # b met the copy, found index 0 held, removed it
        assert b.duplicates_removed == 1
        first.release()
        second = b.acquire("k", timeout=2)
        assert second is not None and second.index == 0
        second.release()
        _await_ready(a, "k", 1)


def test_a_sigkilled_holder_gives_its_permit_back(amqp_url: str, names: Names) -> None:
    child_code = (
        "import sys, time\n"
        "from ojs_kombu.amqp.permits import Permits\n"
        "from ojs_kombu.model.naming import Names\n"
        "p = Permits(sys.argv[1], names=Names(sys.argv[2]))\n"
        "p.ensure('k', 1)\n"
        "permit = p.acquire('k', timeout=10)\n"
        "print('held', permit.index, flush=True)\n"
        "time.sleep(60)\n"
    )
    with Permits(amqp_url, names=names) as permits:
        permits.ensure("k", 1)
        child = subprocess.Popen(
            [sys.executable, "-c", child_code, amqp_url, names.prefix],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "held 0"
            assert permits.acquire("k", timeout=0.3) is None
            child.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            permit = permits.acquire("k", timeout=10)
            took = time.monotonic() - killed
        finally:
            child.kill()
            child.wait()
        assert permit is not None and permit.index == 0
        assert permits.duplicates_removed == 0  # the dead holder's token was not taken for a copy
        print(f"\nSIGKILLed holder: its permit taken by another connection {took * 1000:.1f} ms later")
        permit.release()


def test_resizing_grows_and_shrinks_the_tokens(amqp_url: str, names: Names) -> None:
    with Permits(amqp_url, names=names) as permits:
        assert permits.ensure("k", 2) == 2
        held = permits.acquire("k", timeout=2)
        assert held is not None
        assert permits.ensure("k", 4) == 2  # two more; the held one is not minted again
        taken = [permits.acquire("k", timeout=1) for _ in range(4)]
        assert len([p for p in taken if p is not None]) == 3
        for permit in [held, *taken]:
            if permit is not None:
                permit.release()
        assert permits.ensure("k", 1) == 0
        _await_ready(permits, "k", 1)  # indexes 1..3 removed
        first = permits.acquire("k", timeout=1)
        assert first is not None and first.index == 0
        assert permits.acquire("k", timeout=0.3) is None
        first.release()
        assert permits.ensure("k", 0) == 0
        assert permits.acquire("k", timeout=0.3) is None  # concurrency 0 pauses the key


def test_a_worn_token_is_renewed_not_dropped(amqp_url: str, names: Names) -> None:
    with Permits(amqp_url, names=names, renew_after=0) as permits:  # renew on every release
        permits.ensure("k", 1)
        for _ in range(30):  # more than RabbitMQ 4.x's default delivery limit of 20
            permit = permits.acquire("k", timeout=2)
            assert permit is not None
            permit.release()
        assert permits.renewed == 30
        _await_ready(permits, "k", 1)


def test_returning_a_permit_thousands_of_times_never_drops_it(amqp_url: str, names: Names) -> None:
    with Permits(amqp_url, names=names) as permits:
        permits.ensure("k", 1)
        for _ in range(2000):
            permit = permits.acquire("k", timeout=2)
            assert permit is not None
            permit.release()
        _await_ready(permits, "k", 1)


def test_misuse_is_a_typed_error(amqp_url: str, names: Names) -> None:
    with Permits(amqp_url, names=names) as permits:
        with pytest.raises(ValidationError) as info:
            permits.acquire("never-ensured", timeout=0)
        assert info.value.field == "key"
        with pytest.raises(ValidationError) as info:
            permits.ensure("k", -1)
        assert info.value.field == "concurrency"
        with pytest.raises(ValidationError) as info:
            permits.ensure("k", MAX_PERMITS + 1)
        assert info.value.field == "concurrency"
        with pytest.raises(ValidationError) as info:
            permits.ensure(RateLimitPolicy(key="k", rate={"limit": 1, "period": "PT1S"}))  # no concurrency
        assert info.value.field == "concurrency"
        with pytest.raises(ValidationError) as info:
            permits.ensure("bad key", 1)
        assert info.value.field == "key"
        permits.ensure("k", 1)
        permit = permits.acquire("k", timeout=2)
        assert permit is not None
    with pytest.raises(PermitLostError):
        permit.release()  # the Permits was closed: the broker took the permit back


HOLDER_PROCESS = """
import json, sys, threading, time
from ojs_kombu.amqp.management import ManagementClient
from ojs_kombu.amqp.permits import MAX_PERMITS, Permits
from ojs_kombu.model.naming import Names

url, prefix = sys.argv[1], sys.argv[2]
intervals, lock = [], threading.Lock()

def run():
    with Permits(url, names=Names(prefix)) as permits:
        permits.ensure("k", 3)
        for _ in range(15):
            with permits.acquire("k", timeout=60) as permit:
                start = time.monotonic()
                time.sleep(0.003)
                end = time.monotonic()
            with lock:
                intervals.append((start, end))

threads = [threading.Thread(target=run) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(intervals))
"""


def test_two_processes_of_eight_threads_never_run_more_than_three(amqp_url: str, names: Names) -> None:
    """Issue 31: two worker processes with concurrency 8 each, a key of concurrency 3 (CLOCK_MONOTONIC is system-wide)."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER_PROCESS, amqp_url, names.prefix],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        for _ in range(2)
    ]
    intervals: list[tuple[float, float]] = []
    for child in children:
        out, _ = child.communicate(timeout=180)
        assert child.returncode == 0
        intervals += [tuple(pair) for pair in json.loads(out)]  # type: ignore[misc]
    assert len(intervals) == 2 * 8 * 15
    assert _max_overlap(intervals) == 3


def test_a_held_permit_outlives_many_heartbeats_while_its_thread_is_busy(amqp_url: str, names: Names) -> None:
    with Permits(amqp_url, names=names, heartbeat=1) as holder, Permits(amqp_url, names=names) as other:
        holder.ensure("k", 1)
        other.ensure("k", 1)
        permit = holder.acquire("k", timeout=2)
        assert permit is not None
        time.sleep(4.5)  # the job: four heartbeat intervals in which this thread never touches the connection
        assert permit.held
        assert other.acquire("k", timeout=0.5) is None  # the broker did not take it back
        permit.release()
        assert not permit.held
        taken = other.acquire("k", timeout=2)
        assert taken is not None
        taken.release()


def test_inspect_counts_available_active_and_waiting(amqp_url: str, names: Names) -> None:
    with Permits(amqp_url, names=names) as permits, Permits(amqp_url, names=names) as waiter:
        permits.ensure("k", 2)
        waiter.ensure("k", 2)
        _await_ready(permits, "k", 2)
        state = permits.inspect("k")
        assert (state.limit, state.available, state.active, state.holding, state.waiting) == (2, 2, 0, 0, 0)
        held = [permits.acquire("k", timeout=2) for _ in range(2)]
        got: list[object] = []
        waiting = threading.Thread(target=lambda: got.append(waiter.acquire("k", timeout=10)))
        waiting.start()
        wait_until(lambda: waiter.inspect("k").waiting == 1, timeout=5, message="one waiter")
        state = permits.inspect("k")
        assert (state.available, state.active, state.holding, state.waiting) == (0, 2, 2, 0)
        for permit in held:
            assert permit is not None
            permit.release()
        waiting.join(15)
        assert got and got[0] is not None
        wait_until(lambda: waiter.inspect("k").available == 1, timeout=5, message="the other token back")
        state = waiter.inspect("k")
        assert (state.active, state.holding, state.waiting) == (1, 1, 0)


def test_seeding_while_permits_are_taken_and_returned_never_exceeds_the_limit(amqp_url: str, names: Names) -> None:
    """``ensure`` racing releases may mint a copy of a token in flight; the index queues keep it harmless."""
    intervals: list[tuple[float, float]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    stop = threading.Event()

    def cycle() -> None:
        try:
            with Permits(amqp_url, names=names, dedupe_grace=0.2) as permits:
                permits.ensure("k", 2)
                while not stop.is_set():
                    permit = permits.acquire("k", timeout=10)
                    assert permit is not None
                    with permit:
                        start = time.monotonic()
                        time.sleep(0.001)
                        end = time.monotonic()
                    with lock:
                        intervals.append((start, end))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=cycle) for _ in range(3)]
    for thread in threads:
        thread.start()
    with Permits(amqp_url, names=names) as seeder:
        minted = ensures = 0
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            minted += seeder.ensure("k", 2)
            ensures += 1
        stop.set()
        for thread in threads:
            thread.join(30)
        assert not errors, errors
        assert len(intervals) > 20
        assert _max_overlap(intervals) <= 2
        seeder.ensure("k", 2)  # quiet now: copies left over are removed, a missing token minted
        _await_ready(seeder, "k", 2)
        print(
            f"\nensure x{ensures} racing 3 cyclers: {minted} token(s) minted in the race, {len(intervals)} jobs, at most 2 at once"
        )


def test_a_lost_connection_loses_its_permits_and_the_next_call_reconnects(
    amqp_url: str, names: Names, management: ManagementClient
) -> None:
    name = f"{names.prefix}-lost"
    with socket.socket() as probe:  # a port nothing listens on: the first node of the list is down
        probe.bind(("127.0.0.1", 0))
        down = f"amqp://guest:guest@127.0.0.1:{probe.getsockname()[1]}//"
    # One pass over the nodes: a call connects to the next node at once when the first is down.
    nodes = f"{down};{amqp_url}"
    with Permits(nodes, names=names, connection_name=name) as permits, Permits(amqp_url, names=names) as other:
        permits.ensure("k", 1)
        other.ensure("k", 1)
        permit = permits.acquire("k", timeout=2)
        assert permit is not None and permit.held

        def connection_named() -> str | None:
            for connection in management.connections():
                if (connection.get("client_properties") or {}).get("connection_name") == name:
                    return str(connection["name"])
            return None

        assert management.close_connection(wait_until(connection_named, timeout=15, message="the connection listed"))
        taken = other.acquire("k", timeout=5)  # the broker returned the permit
        assert taken is not None
        wait_until(lambda: not permit.held, timeout=5, message="the holder noticing")
        with pytest.raises(PermitLostError):
            permit.release()
        assert permits.acquire("k", timeout=0.3) is None  # reconnected; the permit is the other's now
        taken.release()
        again = permits.acquire("k", timeout=2)
        assert again is not None and again.held
        again.release()
