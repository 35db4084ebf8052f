"""GcPause: the cyclic collector is off inside, and restored on every way out."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator

import pytest

from ojs_kombu.client._gc_pause import GcPause


@pytest.fixture(autouse=True)
def collector_enabled() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_disabled_inside_enabled_after():
    with GcPause():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_end_lifts_the_pause_early_and_lets_the_next_batch_pause():
    with GcPause() as pause:
        pause.end()
        assert gc.isenabled()
        pause.end()  # idempotent
        with GcPause():  # the lock is free again: another batch may pause
            assert not gc.isenabled()
        assert gc.isenabled()
    assert gc.isenabled()


def test_restored_when_left_by_an_exception():
    with pytest.raises(KeyError), GcPause():
        assert not gc.isenabled()
        raise KeyError("boom")
    assert gc.isenabled()


def test_a_program_that_disabled_the_collector_keeps_it_disabled():
    gc.disable()
    with GcPause():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_a_nested_pause_leaves_it_to_the_outer_one():
    with GcPause():
        with GcPause():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner one did not enable it
    assert gc.isenabled()


def test_a_pause_started_by_another_thread_is_ended_by_that_thread():
    inside, release, done = threading.Event(), threading.Event(), threading.Event()

    def other() -> None:
        with GcPause():
            inside.set()
            release.wait(5)
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert inside.wait(5)
        with GcPause():  # overlapping: runs unpaused, so it does not keep the collector off
            assert not gc.isenabled()
        assert not gc.isenabled()  # still the other thread's pause
        release.set()
        assert done.wait(5)
        assert gc.isenabled()
    finally:
        release.set()
        thread.join(5)


def test_after_the_pause_a_new_one_can_start():
    with GcPause():
        pass
    with GcPause():
        assert not gc.isenabled()
    assert gc.isenabled()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_during_a_pause_gets_its_collector_back_and_can_pause():
    read_end, write_end = os.pipe()
    with GcPause():
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running the parent's cleanup
            try:
                enabled = gc.isenabled()
                with GcPause():
                    paused = not gc.isenabled()
                os.write(write_end, f"{int(enabled)}{int(paused)}{int(gc.isenabled())}".encode())
            finally:
                os._exit(0)
    os.close(write_end)
    report = os.read(read_end, 16)
    os.close(read_end)
    os.waitpid(pid, 0)
    assert report == b"111"
    assert gc.isenabled()
