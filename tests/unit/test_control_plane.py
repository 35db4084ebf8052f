"""Pure logic of the control plane: messages, stream options, the cancelled-id set, interrupting a thread."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from ojs_kombu import Cancelled, ControlOptions, DecodeError, ValidationError
from ojs_kombu.runtime.control import Cancellations, CancelledIds, PausedQueues
from ojs_kombu.wire.control import cancel_message, decode_control, pause_message


def test_cancel_message_properties_and_body():
    message = cancel_message(" 0190A7E2-0000-7000-8000-000000000001 ")
    assert json.loads(message.body) == {"job_id": "0190a7e2-0000-7000-8000-000000000001"}
    assert message.properties["type"] == "ojs.control.cancel"
    assert message.properties["content_type"] == "application/json"
    assert isinstance(message.properties["timestamp"], int)
    assert message.properties["message_id"] != cancel_message("x").properties["message_id"]


@pytest.mark.parametrize("job_id", ["", "  ", None, 5])
def test_cancel_message_refuses_a_missing_id(job_id):
    with pytest.raises(ValidationError):
        cancel_message(job_id)


def test_decode_control_is_tolerant_and_typed():
    control = decode_control(b'{"job_id":"ABC","extra":1}', {"type": "ojs.control.cancel"})
    assert (control.type, control.job_id, control.message_id) == ("ojs.control.cancel", "abc", None)
    assert decode_control(b'{"job_id":7}', {"type": "ojs.control.cancel"}).job_id is None
    for body, properties in [(b"[]", {"type": "t"}), (b"{", {"type": "t"}), (b"{}", {}), (b"\xff", {"type": "t"})]:
        with pytest.raises(DecodeError):
            decode_control(body, properties)


def test_control_options_arguments_and_validation():
    assert ControlOptions(max_age="7D", max_length_bytes=10, max_segment_size_bytes=5).arguments() == {
        "x-queue-type": "stream",
        "x-max-age": "7D",
        "x-max-length-bytes": 10,
        "x-stream-max-segment-size-bytes": 5,
    }
    for bad in [{"max_age": "7 days"}, {"max_age": "0D"}, {"max_length_bytes": 0}, {"max_segment_size_bytes": True}]:
        with pytest.raises(ValidationError):
            ControlOptions(**bad)


def test_cancelled_ids_are_bounded_oldest_first():
    ids = CancelledIds(limit=3)
    for job_id in "abcd":
        ids.add(job_id)
    assert len(ids) == 3
    assert "a" not in ids and "d" in ids
    assert ids.add("d") is False


def test_cancel_before_start_sets_the_event_at_registration():
    cancellations = Cancellations("cooperative")
    cancellations.cancel("JOB")
    assert cancellations.is_cancelled("job")
    with cancellations.running("job", "q") as entry:
        assert entry.cancelled.is_set()


def test_a_runs_event_is_made_when_first_asked_for_and_carries_an_earlier_cancel():
    """The flag says it without the event; the event, made later, is set already and stays the same."""
    cancellations = Cancellations("cooperative")
    entry = cancellations.enter("job", "q")
    assert entry.is_cancelled is False
    cancellations.cancel("job")
    assert entry.is_cancelled is True
    event = entry.cancelled
    assert isinstance(event, threading.Event) and event.is_set()
    assert entry.cancelled is event
    cancellations.leave(entry)


def test_a_cancel_sets_the_event_asked_for_before_it():
    cancellations = Cancellations("cooperative")
    entry = cancellations.enter("job", "q")
    event = entry.cancelled
    assert not event.is_set()
    cancellations.cancel("job")
    assert event.is_set() and entry.is_cancelled
    cancellations.leave(entry)


def ask_while_cancelling(askers: int) -> list[threading.Event]:
    """``askers`` threads ask a run for its event while another cancels it, all at once."""
    cancellations = Cancellations("cooperative")
    entry = cancellations.enter("job", "q")
    barrier = threading.Barrier(askers + 1)
    seen: list[threading.Event] = []

    def ask() -> None:
        barrier.wait()
        seen.append(entry.cancelled)

    def cancel() -> None:
        barrier.wait()
        cancellations.cancel("job")

    threads = [threading.Thread(target=ask) for _ in range(askers)] + [threading.Thread(target=cancel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    return seen


def test_threads_asking_for_the_event_at_once_with_a_cancel_get_one_event_set():
    for _ in range(50):
        seen = ask_while_cancelling(4)
        assert len(seen) == 4 and len({id(event) for event in seen}) == 1
        assert seen[0].is_set()


def test_interrupt_raises_cancelled_in_a_busy_thread_and_never_after_it_left():
    cancellations = Cancellations("interrupt")
    started, outcome = threading.Event(), []

    def busy():
        try:
            with cancellations.running("job", "q"):
                started.set()
                while True:
                    pass
        except Cancelled:
            outcome.append("cancelled")
        # The interruption is used up: plain code after the block runs undisturbed.
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            pass
        outcome.append("after")

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    assert started.wait(5)
    cancellations.cancel("job")
    thread.join(5)
    assert outcome == ["cancelled", "after"]


def test_cooperative_mode_only_sets_the_event():
    cancellations = Cancellations("cooperative")
    with cancellations.running("job", "q") as entry:
        cancellations.cancel("job")
        assert entry.cancelled.is_set()
        time.sleep(0.05)  # an async exception would be raised at the next bytecodes
    assert entry.interrupted is False


def test_enter_registers_aliases_and_leave_is_idempotent():
    """The non-contextmanager form (Dramatiq's middleware): a cancel may name the job by an alias."""
    cancellations = Cancellations("cooperative")
    cancellations.cancel("earlier")
    assert cancellations.enter("JOB", "q", aliases=("Earlier",)).cancelled.is_set()  # cancelled before it started
    entry = cancellations.enter("job2", "q", aliases=("msg-2", "JOB2"))
    assert entry.keys == ("job2", "msg-2")
    cancellations.cancel("MSG-2")
    assert entry.cancelled.is_set()
    cancellations.leave(entry)
    cancellations.leave(entry)
    assert entry.active is False
    assert cancellations.enter("job3", "q", aliases=("other",)).cancelled.is_set() is False
    assert cancellations._running.keys() == {"job", "earlier", "job3", "other"}  # job2 and msg-2 left


def test_cancel_running_mode_is_validated():
    with pytest.raises(ValidationError):
        Cancellations("kill")


def test_memory_per_cancelled_id_is_about_180_bytes():
    """The figure the module docstring documents."""
    ids = CancelledIds(limit=100_000)
    before = sys.getsizeof(ids._ids)
    job_ids = [f"0190a7e2-0000-7000-8000-{n:012d}" for n in range(20_000)]
    for job_id in job_ids:
        ids.add(job_id)
    per_id = (sys.getsizeof(ids._ids) - before + sum(sys.getsizeof(j) for j in job_ids)) / len(job_ids)
    assert 60 < per_id < 250


def test_pause_and_resume_messages():
    pause, resume = pause_message("emails"), pause_message("emails", paused=False)
    assert (pause.properties["type"], resume.properties["type"]) == ("ojs.control.pause", "ojs.control.resume")
    assert json.loads(pause.body) == json.loads(resume.body) == {"queue": "emails"}
    assert pause.properties["content_type"] == "application/json"
    assert pause.properties["message_id"] != resume.properties["message_id"]
    with pytest.raises(ValidationError):
        pause_message("control.emails")


def test_paused_queues_change_only_on_a_change_and_count_versions():
    paused = PausedQueues()
    assert paused.set("a", True) and paused.queues == {"a"} and "a" in paused
    assert not paused.set("a", True)  # a repeated pause is not a change
    assert paused.version == 1
    assert paused.set("a", False) and paused.queues == frozenset()
    assert not paused.set("b", False)
    assert paused.version == 2


def test_running_registers_on_entry_and_leaves_on_any_exit():
    cancellations = Cancellations("cooperative")
    scope = cancellations.running("JOB", "q")
    assert cancellations._running == {}  # nothing until the block is entered
    with pytest.raises(KeyError), scope as entry:
        assert cancellations._running == {"job": [entry]} and entry.active
        raise KeyError("the handler's own error goes on")
    assert cancellations._running == {} and entry.active is False
    with cancellations.running("job", "q") as first, cancellations.running("job", "q") as second:
        assert cancellations._running == {"job": [first, second]}  # the same job twice (a redelivery)
        cancellations.cancel("job")
        assert first.is_cancelled and second.is_cancelled
    assert cancellations._running == {}
