"""DeadLetterEntry's final failure, read from every kind of letter, and the final-failure records."""

from __future__ import annotations

from datetime import UTC, datetime

from amqp import Message

from ojs_kombu.model.job import Job
from ojs_kombu.policy.retry import Failure, record_failure
from ojs_kombu.runtime.deadletter import DeadLetterEntry, FinalFailure, SameDeath, final_failure_of, replayable
from ojs_kombu.runtime.settle import failed_message, final_failure_record
from ojs_kombu.wire.codec import OutgoingMessage, encode
from ojs_kombu.wire.control import MAX_FAILURE_MESSAGE, decode_control

WHEN = datetime(2026, 11, 27, 12, 0, 0, 123000, tzinfo=UTC)
DEATH_TIME = datetime(2026, 11, 27, 12, 0, 1)  # py-amqp reads x-death times as naive UTC


def letter(message: OutgoingMessage, *deaths: dict) -> Message:
    headers = dict(message.headers)
    if deaths:
        headers["x-death"] = list(deaths)
    return Message(message.body, application_headers=headers, **message.properties)


def waiting_after(attempts: int) -> tuple[Job, OutgoingMessage]:
    """A job as it waits after ``attempts`` failures ("fail #1" ...): the retry path's message."""
    job = Job.create("a.b", [1], queue="q")
    message = encode(job)
    for attempt in range(1, attempts + 1):
        failure = Failure("handler_error", "RuntimeError", f"fail #{attempt}")
        job = record_failure(job, attempt, failure, WHEN)
        message = failed_message(message, job, failure)
    return job, message


def rejected(queue: str = "q") -> dict:
    return {"reason": "rejected", "queue": f"ojs.queue.{queue}", "time": DEATH_TIME, "count": 1}


def test_a_republished_letter_carries_its_final_failure():
    job, waiting = waiting_after(2)
    final = Failure("handler_error", "RuntimeError", "fail #3")
    entry = DeadLetterEntry.from_message(letter(failed_message(waiting, record_failure(job, 3, final, WHEN), final)))
    assert entry.reason == "republished" and not entry.awaits_final_failure
    assert (entry.attempt, entry.error_code, entry.error_type, entry.error_message) == (
        3,
        "handler_error",
        "RuntimeError",
        "fail #3",
    )
    assert entry.failed_at == WHEN and entry.dead_at == WHEN


def test_a_nacked_letter_never_shows_the_previous_attempts_error():
    _, waiting = waiting_after(2)  # delivered as attempt 3, its headers say "fail #2"
    entry = DeadLetterEntry.from_message(letter(waiting, rejected()))
    assert entry.reason == "rejected" and entry.awaits_final_failure
    assert entry.attempt == 3 and entry.failed_at == DEATH_TIME.replace(tzinfo=UTC)
    assert entry.error_code is None and entry.error_message is None and entry.error_type is None
    assert entry.job is not None and [e["message"] for e in entry.job.errors or []] == ["fail #1", "fail #2"]


def test_a_nacked_letter_takes_the_record_of_its_job_attempt_and_replay_count():
    job, waiting = waiting_after(2)
    record = decode_control(
        *_parts(final_failure_record(job, 3, Failure("handler_error", "KeyError", "fail #3"), WHEN))
    )
    key, failure = final_failure_of(record) or (None, None)
    assert key == (job.id, 3, 0) and failure == FinalFailure(3, "handler_error", "KeyError", "fail #3", WHEN)
    other_life = {(job.id, 3, 1): FinalFailure(3, "x", "Y", "another life", WHEN)}

    entry = DeadLetterEntry.from_message(letter(waiting, rejected()))
    assert entry.join(other_life).error_message is None  # another replay's record is not this letter's
    assert entry.join({key: failure}).error_message == "fail #3"
    assert (entry.error_code, entry.error_type, entry.failed_at) == ("handler_error", "KeyError", WHEN)
    assert "KeyError" in entry.error_codes and not entry.awaits_final_failure

    replayed = replayable(Job.create("a.b", [], queue="q"))
    entry = DeadLetterEntry.from_message(letter(encode(replayed), rejected()))
    assert entry.failure_key == (replayed.id, 1, 1)


def test_a_letter_that_expired_while_waiting_shows_the_last_failure_it_had():
    _, waiting = waiting_after(1)
    entry = DeadLetterEntry.from_message(letter(waiting, {"reason": "expired", "time": DEATH_TIME, "count": 1}))
    assert entry.reason == "expired" and not entry.awaits_final_failure
    assert (entry.attempt, entry.error_message, entry.failed_at) == (1, "fail #1", WHEN)


def test_a_record_keeps_a_bounded_message_and_bad_records_are_ignored():
    job = Job.create("a.b", [], queue="q")
    long = Failure("handler_error", "ValueError", "x" * (MAX_FAILURE_MESSAGE + 10))
    key, failure = final_failure_of(decode_control(*_parts(final_failure_record(job, 0, long, WHEN)))) or (None, None)
    assert key == (job.id, 1, 0) and failure is not None and len(failure.message or "") == MAX_FAILURE_MESSAGE
    for body in (b'{"job_id": "x"}', b'{"job_id": "x", "attempt": "1", "error": {}}', b'{"attempt": 1, "error": {}}'):
        assert final_failure_of(decode_control(body, {"type": "ojs.control.final-failure"})) is None
    assert final_failure_of(decode_control(b'{"job_id": "x"}', {"type": "ojs.control.cancel"})) is None


def _parts(message: OutgoingMessage) -> tuple[bytes, dict]:
    return message.body, message.properties


def test_same_death_is_a_republished_letter_of_the_same_job_attempt_and_replay_count():
    job, waiting = waiting_after(0)
    final = Failure("handler_error", "DeadLetter", "blocked")
    republished = letter(failed_message(waiting, record_failure(job, 1, final, WHEN), final))
    first, again = DeadLetterEntry.from_message(republished), DeadLetterEntry.from_message(republished)
    other = DeadLetterEntry.from_message(letter(encode(Job.create("a.b", [], queue="q"))))
    nacked = DeadLetterEntry.from_message(letter(waiting, rejected()))
    deaths = SameDeath()
    assert not deaths.repeats(first)
    deaths.add(first)
    deaths.add(nacked)
    assert deaths.repeats(again) and not deaths.repeats(other)
    assert not deaths.repeats(DeadLetterEntry.from_message(letter(waiting, rejected())))  # a nack is never twice
