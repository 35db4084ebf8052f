"""Conformance of unique jobs to ``ojs-unique-jobs.md``: each of its MUSTs (``UNIQ-01`` … ``UNIQ-35``, in
the spec's order) and each scenario of its §14 (``UNIQ-T01`` … ``UNIQ-T11``), against a real broker.

The spec numbers neither: :data:`REQUIREMENTS` gives every requirement an id and quotes it word for word;
``tests/unit/test_unique_conformance_matrix.py`` checks that each quote is in the spec, that every MUST of
the spec is quoted, that every id has a test here (``test_uniq_07_…``, ``test_uniq_t03_…``) or a
:data:`REFERENCES` entry, and that the matrix in ``docs/unique-jobs.md`` says the same.  A requirement met
in part or not at all is in :data:`NOT_MET` with what is missing (its test, if any, a strict xfail); one
that binds only best-effort implementations (we are strong) is in :data:`NOT_APPLICABLE`.

This binding has no HTTP: the spec's ``409 Conflict`` / ``duplicate`` is :class:`~ojs_kombu.DuplicateJobError`
(``code == "duplicate"``, ``.existing_id``), its ``400 Bad Request`` / ``invalid_request`` is
:class:`~ojs_kombu.ValidationError` (``code == "invalid_request"``, ``.field``), and its ``200 OK`` with
``"deduplicated": true`` is the existing job's id returned by ``enqueue`` / ``enqueue_job`` and
``EnqueueResult.deduplicated`` of ``enqueue_many``.

One worker (concurrency 2, queue ``default``) serves the whole module; jobs that must stay ``available``
go to the queue ``idle``, which nothing consumes.  Every test uses keys of its own (its type or its args).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pika.exceptions
import pytest
from click.testing import CliRunner
from support import message_count, read_stream, wait_until

from ojs_kombu import Client, DuplicateJobError, Job, Names, UniquePolicy, ValidationError, Worker, current_job
from ojs_kombu.cli import cli
from ojs_kombu.policy import job_unique_key

#: Every requirement of the spec: id -> (level, its words in the spec).  Literals: read by the matrix test.
REQUIREMENTS: dict[str, tuple[str, str]] = {
    "UNIQ-01": ("MUST", 'MUST be provided when `"meta"` is in `keys`.'),
    "UNIQ-02": (
        "MUST",
        "Implementations MUST validate the `UniquePolicy` structure at enqueue time and reject invalid policies "
        "with an `invalid_request` error.",
    ),
    "UNIQ-03": (
        "MUST",
        'Implementations MUST include `"type"` in the computed uniqueness fingerprint, regardless of whether it '
        "appears in the `keys` array.",
    ),
    "UNIQ-04": (
        "MUST",
        'Implementations MUST reject a `UniquePolicy` where `keys` contains `"meta"` but `meta_keys` is `null` or empty.',
    ),
    "UNIQ-05": (
        "MUST",
        "Implementations MUST reject a `UniquePolicy` where `args_keys` references keys that do not exist in the "
        "job's `args`.",
    ),
    "UNIQ-06": ("MUST", "Implementations MUST treat `keys` values as case-sensitive."),
    "UNIQ-07": ("MUST", "Implementations MUST use a deterministic hash function for uniqueness key computation."),
    "UNIQ-08": (
        "MUST",
        "Implementations MUST sort object keys lexicographically at every level of nesting when canonicalizing.",
    ),
    "UNIQ-09": ("MUST", "Implementations MUST normalize Unicode strings to NFC form before hashing."),
    "UNIQ-10": (
        "MUST",
        "Implementations MUST return an HTTP `409 Conflict` status (for the HTTP protocol binding) with the "
        "standard `duplicate` error code.",
    ),
    "UNIQ-11": (
        "MUST",
        "The existing job MUST be transitioned to the `cancelled` state before the new job is inserted.",
    ),
    "UNIQ-12": (
        "MUST NOT",
        "Implementations MUST NOT replace a job that is in the `active` state unless the implementation supports "
        "strong uniqueness (see Section 8).",
    ),
    "UNIQ-13": (
        "MUST",
        "If the existing job is `active` and the implementation does not support strong uniqueness, the "
        "implementation MUST fall back to `reject` behavior and return an error indicating that the active job "
        "cannot be replaced.",
    ),
    "UNIQ-14": (
        "MUST",
        "Implementations MUST return an HTTP `200 OK` status (not `201 Created`) to distinguish from a newly "
        "created job.",
    ),
    "UNIQ-15": ("MUST", "The response MUST include the existing job's `id` and SHOULD include its current `state`."),
    "UNIQ-16": ("MUST", "Implementations MUST reject `states` arrays containing invalid state names."),
    "UNIQ-17": (
        "MUST",
        "Implementations MUST evaluate the period relative to the existing job's `created_at` timestamp, not the "
        "current enqueue attempt's timestamp.",
    ),
    "UNIQ-18": (
        "MUST",
        "Implementations MUST use [ISO 8601 duration format](https://en.wikipedia.org/wiki/ISO_8601#Durations) "
        "for the `period` field.",
    ),
    "UNIQ-19": (
        "MUST (strong)",
        "Strong uniqueness MUST guarantee: if two concurrent enqueue calls arrive with the same uniqueness "
        "fingerprint, exactly one succeeds and the other observes the conflict (receiving the appropriate "
        "`on_conflict` behavior).",
    ),
    "UNIQ-20": (
        "MUST",
        "Implementations MUST declare their uniqueness strength level in the OJS conformance manifest.",
    ),
    "UNIQ-21": ("MUST", 'The `strength` field MUST be one of: `"strong"` or `"best-effort"`.'),
    "UNIQ-22": (
        "MUST",
        "Support all four `on_conflict` strategies (`reject`, `replace`, `replace_except_schedule`, `ignore`).",
    ),
    "UNIQ-23": ("MUST", "Support all uniqueness dimensions (`type`, `queue`, `args`, `meta`)."),
    "UNIQ-24": ("MUST", "Support `args_keys` and `meta_keys` for selective dimension filtering."),
    "UNIQ-25": ("MUST", "Support `period` (ISO 8601 duration) for time-windowed uniqueness."),
    "UNIQ-26": ("MUST", "Support configurable `states` for state-scoped uniqueness."),
    "UNIQ-27": ("MUST", "Compute uniqueness keys using the algorithm defined in Section 4."),
    "UNIQ-28": ("MUST", "Validate `UniquePolicy` at enqueue time and reject invalid policies."),
    "UNIQ-29": (
        "MUST (strong)",
        "Guarantee that concurrent enqueue calls with the same uniqueness key never both succeed (when "
        "`on_conflict` is `reject`).",
    ),
    "UNIQ-30": (
        "MUST (strong)",
        "Guarantee that `replace` atomically cancels the existing job and inserts the new one, with no window "
        "where neither or both exist.",
    ),
    "UNIQ-31": ("MUST (best-effort)", "Document the known race conditions and their likelihood."),
    "UNIQ-32": (
        "MUST (best-effort)",
        "Provide guidance on how users can mitigate duplicate risk (e.g., idempotent handlers).",
    ),
    "UNIQ-33": (
        "MUST NOT",
        "When a job transitions from `retryable` back to `available` (i.e., the retry fires), the implementation "
        "MUST NOT re-evaluate the uniqueness constraint.",
    ),
    "UNIQ-34": (
        "MUST NOT",
        "Implementations MUST NOT log uniqueness keys at a verbosity level higher than DEBUG, as the keys are "
        "derived from potentially sensitive job arguments.",
    ),
    "UNIQ-35": (
        "MUST",
        "Implementations MUST parse ISO 8601 durations and MAY additionally accept integer seconds or "
        "milliseconds as a convenience extension.",
    ),
    "UNIQ-T01": (
        "scenario",
        '**Basic deduplication:** Enqueue two identical jobs with `on_conflict: "reject"`. The second MUST be '
        "rejected with `409 Conflict`.",
    ),
    "UNIQ-T02": (
        "scenario",
        "**Args-key filtering:** Enqueue two jobs with the same `args_keys` values but different non-key args. "
        "The second MUST be treated as a duplicate.",
    ),
    "UNIQ-T03": (
        "scenario",
        "**Period expiry:** Enqueue a job with a short `period`. After the period elapses, enqueue the same job "
        "again. The second MUST succeed.",
    ),
    "UNIQ-T04": (
        "scenario",
        "**State filtering:** Enqueue a job, transition it to `completed`. Enqueue the same job again with "
        "default `states`. The second MUST succeed (completed is not in default states).",
    ),
    "UNIQ-T05": (
        "scenario",
        '**State filtering with terminal states:** Enqueue a job with `states` including `"completed"`. Complete '
        "the job. Enqueue again. The second MUST be treated as a duplicate.",
    ),
    "UNIQ-T06": (
        "scenario",
        '**Replace strategy:** Enqueue a job with `on_conflict: "replace"`. Enqueue a duplicate. The original '
        "MUST be cancelled and the new job MUST be enqueued.",
    ),
    "UNIQ-T07": (
        "scenario",
        '**Ignore strategy:** Enqueue a job with `on_conflict: "ignore"`. Enqueue a duplicate. The response MUST '
        'return `200 OK` with the original job\'s ID and `"deduplicated": true`.',
    ),
    "UNIQ-T08": (
        "scenario",
        '**Queue scoping:** Enqueue a job with `keys: ["type", "queue"]` on queue `"a"`. Enqueue the same type on '
        'queue `"b"`. The second MUST succeed (different queue).',
    ),
    "UNIQ-T09": (
        "scenario",
        '**Invalid policy rejection:** Enqueue a job with `keys: ["meta"]` but no `meta_keys`. The request MUST '
        "be rejected with `400 Bad Request`.",
    ),
    "UNIQ-T10": (
        "scenario",
        "**Retry interaction:** Enqueue a job. Let it fail and enter `retryable`. Enqueue a duplicate. The second "
        "MUST be treated as a duplicate.",
    ),
    "UNIQ-T11": (
        "scenario",
        '**Concurrent enqueue:** Send N concurrent enqueue requests for the same uniqueness key with `on_conflict: "reject"`. '
        "Exactly one MUST succeed; all others MUST receive `409 Conflict`.",
    ),
}

#: Requirements an existing test proves exactly: id -> the tests (``path::name``; literals, read by the matrix test).
REFERENCES: dict[str, list[str]] = {
    "UNIQ-01": ["tests/broker/test_unique_conformance.py::test_uniq_t09_keys_with_meta_but_no_meta_keys_is_refused"],
    "UNIQ-04": ["tests/broker/test_unique_conformance.py::test_uniq_t09_keys_with_meta_but_no_meta_keys_is_refused"],
    "UNIQ-06": [
        "tests/broker/test_unique_conformance.py::test_uniq_02_an_invalid_policy_is_refused_at_enqueue_with_invalid_request"
    ],
    "UNIQ-07": ["tests/unit/test_unique_policy.py::test_spec_example_4_3"],
    "UNIQ-08": [
        "tests/unit/test_unique_policy.py::test_key_ignores_key_order_and_unicode_form",
        "tests/unit/test_unique_policy.py::test_canonical_json_rfc8785_sample",
    ],
    "UNIQ-10": [
        "tests/broker/test_unique_conformance.py::test_uniq_t01_a_second_identical_job_is_rejected_as_a_duplicate"
    ],
    "UNIQ-11": [
        "tests/broker/test_unique_conformance.py::test_uniq_t06_replace_cancels_the_original_and_enqueues_the_new_job"
    ],
    "UNIQ-12": [
        "tests/broker/test_unique_jobs.py::test_the_lock_is_freed_when_the_job_ends",
        "tests/broker/test_unique_conformance.py::test_uniq_30_replacing_a_running_job_never_runs_both_at_once",
    ],
    "UNIQ-14": [
        "tests/broker/test_unique_conformance.py::test_uniq_t07_ignore_returns_the_original_id_marked_deduplicated"
    ],
    "UNIQ-15": [
        "tests/broker/test_unique_conformance.py::test_uniq_t07_ignore_returns_the_original_id_marked_deduplicated"
    ],
    "UNIQ-16": [
        "tests/broker/test_unique_conformance.py::test_uniq_02_an_invalid_policy_is_refused_at_enqueue_with_invalid_request"
    ],
    "UNIQ-17": [
        "tests/broker/test_unique_conformance.py::test_uniq_t03_the_period_runs_from_the_existing_jobs_created_at"
    ],
    "UNIQ-18": [
        "tests/broker/test_unique_conformance.py::test_uniq_02_an_invalid_policy_is_refused_at_enqueue_with_invalid_request"
    ],
    "UNIQ-19": [
        "tests/broker/test_unique_jobs.py::test_16_clients_at_once_one_accepted_15_duplicates_and_it_runs_once"
    ],
    "UNIQ-21": [
        "tests/broker/test_unique_conformance.py::test_uniq_20_the_strength_is_declared_in_a_conformance_manifest"
    ],
    "UNIQ-22": [
        "tests/broker/test_unique_conformance.py::test_uniq_t01_a_second_identical_job_is_rejected_as_a_duplicate",
        "tests/broker/test_unique_conformance.py::test_uniq_t06_replace_cancels_the_original_and_enqueues_the_new_job",
        "tests/broker/test_unique_jobs.py::test_replace_except_schedule_keeps_the_existing_schedule",
        "tests/broker/test_unique_conformance.py::test_uniq_t07_ignore_returns_the_original_id_marked_deduplicated",
    ],
    "UNIQ-23": [
        "tests/broker/test_unique_conformance.py::test_uniq_03_type_is_always_part_of_the_fingerprint",
        "tests/broker/test_unique_conformance.py::test_uniq_t08_the_same_type_on_another_queue_is_not_a_duplicate",
        "tests/broker/test_unique_conformance.py::test_uniq_t02_args_keys_values_alone_make_a_duplicate",
    ],
    "UNIQ-24": ["tests/broker/test_unique_conformance.py::test_uniq_t02_args_keys_values_alone_make_a_duplicate"],
    "UNIQ-25": [
        "tests/broker/test_unique_conformance.py::test_uniq_t03_the_period_runs_from_the_existing_jobs_created_at"
    ],
    "UNIQ-26": [
        "tests/broker/test_unique_conformance.py::test_uniq_t05_completed_in_states_keeps_a_completed_job_a_duplicate"
    ],
    "UNIQ-27": [
        "tests/unit/test_unique_policy.py::test_spec_example_4_3",
        "tests/unit/test_unique_policy.py::test_spec_examples_10_2_and_10_7",
    ],
    "UNIQ-28": [
        "tests/broker/test_unique_conformance.py::test_uniq_02_an_invalid_policy_is_refused_at_enqueue_with_invalid_request"
    ],
    "UNIQ-29": [
        "tests/broker/test_unique_jobs.py::test_16_clients_at_once_one_accepted_15_duplicates_and_it_runs_once",
        "tests/broker/test_unique_locks.py::test_sixteen_concurrent_acquirers_one_wins",
    ],
    "UNIQ-33": ["tests/broker/test_unique_jobs.py::test_a_job_waiting_for_its_retry_keeps_the_lock"],
    "UNIQ-35": ["tests/unit/test_unique_policy.py::test_period_end_is_calendar_aware"],
    "UNIQ-T04": [
        "tests/broker/test_unique_conformance.py::test_uniq_t05_completed_in_states_keeps_a_completed_job_a_duplicate",
        "tests/broker/test_unique_jobs.py::test_the_lock_is_freed_when_the_job_ends",
    ],
    "UNIQ-T10": ["tests/broker/test_unique_jobs.py::test_a_job_waiting_for_its_retry_keeps_the_lock"],
    "UNIQ-T11": [
        "tests/broker/test_unique_jobs.py::test_16_clients_at_once_one_accepted_15_duplicates_and_it_runs_once"
    ],
}

#: Requirements met only in part or not at all: id -> what is missing and why (the matrix says "partly").
NOT_MET: dict[str, str] = {}

#: Requirements of best-effort implementations only: id -> why they do not apply (the matrix says "n/a").
NOT_APPLICABLE: dict[str, str] = {
    "UNIQ-13": "binds implementations without strong uniqueness; ours is strong (UNIQ-19, UNIQ-29)",
    "UNIQ-31": "for best-effort implementations; ours is strong (docs/unique-jobs.md still lists its one release race)",
    "UNIQ-32": "for best-effort implementations; ours is strong",
}


@dataclass
class Shared:
    """The module's client and worker, and what the worker ran."""

    client: Client
    worker: Worker
    names: Names
    amqp_url: str
    ran: list[str] = field(default_factory=list)  # job ids, in the order they finished
    running: set[str] = field(default_factory=set)
    overlaps: list[tuple[str, ...]] = field(default_factory=list)
    gates: dict[str, threading.Event] = field(default_factory=dict)  # c.hold jobs wait for gates[args[0]]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def gate(self, name: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(name, threading.Event())


@pytest.fixture(scope="module")
def shared(amqp_url, management) -> Iterator[Shared]:
    prefix = f"t{uuid.uuid4().hex[:12]}"
    worker = Worker(amqp_url, queues=["default"], prefix=prefix, concurrency=2, grace_period=5)
    with Client(amqp_url, prefix=prefix) as client:
        state = Shared(client, worker, Names(prefix), amqp_url)

        def done(*_args) -> None:
            with state.lock:
                state.ran.append(current_job().id)

        def hold(name, *_args) -> None:
            job_id = current_job().id
            with state.lock:
                if state.running:
                    state.overlaps.append((*state.running, job_id))
                state.running.add(job_id)
            try:
                state.gate(name).wait(10)  # a blocking call: a cancel interrupts the handler when it returns
            finally:
                with state.lock:
                    state.running.discard(job_id)
                    state.ran.append(job_id)

        worker.handler("c.done", done)
        worker.handler("c.replace", done)
        worker.handler("c.hold", hold)
        worker.start()
        assert worker.wait_until_ready()
        try:
            yield state
        finally:
            for gate in list(state.gates.values()):
                gate.set()
            worker.stop(timeout=10)
    management.delete_by_prefix(prefix + ".")


def invalid(shared: Shared, field_name: str, **policy) -> ValidationError:
    """Enqueueing with ``policy`` raises an ``invalid_request`` ValidationError naming ``field_name``; nothing is published."""
    with pytest.raises(ValidationError) as raised:
        shared.client.enqueue("c.invalid", [{"user_id": 1}], queue="idle-invalid", unique=policy)
    assert raised.value.code == "invalid_request"
    assert (raised.value.field or "").removeprefix("unique.").split("[")[0] == field_name, raised.value.field
    assert published(shared, "idle-invalid") == 0
    return raised.value


def published(shared: Shared, queue: str) -> int:
    """Jobs waiting in ``queue`` (0 when nothing ever declared it)."""
    try:
        return message_count(shared.amqp_url, shared.names.job_queue(queue))
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return 0


def accepted_eventually(shared: Shared, job: Job, timeout: float = 15.0) -> Job:
    """``enqueue_job(job)`` once the key's lock is free (a worker frees it just after its ack)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return shared.client.enqueue_job(job)
        except DuplicateJobError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_uniq_02_an_invalid_policy_is_refused_at_enqueue_with_invalid_request(shared):
    invalid(shared, "keys", keys=["argz"])
    invalid(shared, "keys", keys=["Type"])  # UNIQ-06: case-sensitive
    invalid(shared, "states", states=["running"])  # UNIQ-16
    invalid(shared, "states", states=["Completed"])
    invalid(shared, "on_conflict", on_conflict="overwrite")
    invalid(shared, "period", period="1h")  # UNIQ-18: ISO 8601 only
    invalid(shared, "period", period="PT")
    job = shared.client.enqueue("c.valid", [1], queue="idle", unique={"period": "P1DT2H30M"})
    assert job.unique is not None and job.unique.period is not None


def test_uniq_03_type_is_always_part_of_the_fingerprint(shared):
    policy = UniquePolicy(keys=["args"])  # "type" left out of keys: included all the same
    first = shared.client.enqueue("c.type_a", [{"n": 3}], queue="idle", unique=policy)
    other = shared.client.enqueue("c.type_b", [{"n": 3}], queue="idle", unique=policy)
    assert other.id != first.id and job_unique_key(other) != job_unique_key(first)
    with pytest.raises(DuplicateJobError) as raised:
        shared.client.enqueue("c.type_a", [{"n": 3}], queue="idle", unique=policy)
    assert raised.value.existing_id == first.id


def test_uniq_05_args_keys_absent_from_args_are_refused(shared):
    invalid(shared, "args_keys", keys=["type", "args"], args_keys=["user"])  # the job has user_id, not user
    # The refused enqueue took no lock: the same key with a valid policy is accepted.
    shared.client.enqueue("c.invalid", [{"user_id": 1}], queue="idle", unique={"keys": ["type"]})


def test_uniq_09_strings_are_nfc_normalised_and_object_keys_sorted(shared):
    policy = UniquePolicy(keys=["args"])
    first = shared.client.enqueue("c.nfc", [{"city": "Caf\u00e9", "n": 1}], queue="idle", unique=policy)
    with pytest.raises(DuplicateJobError) as raised:  # decomposed é, keys in another order
        shared.client.enqueue("c.nfc", [{"n": 1, "city": "Cafe\u0301"}], queue="idle", unique=policy)
    assert raised.value.existing_id == first.id


def test_uniq_34_uniqueness_keys_are_never_logged_above_debug(shared, caplog):
    caplog.set_level(logging.DEBUG)
    policy = UniquePolicy(keys=["type", "args"])
    job = shared.client.enqueue("c.done", [{"secret": "s3cr3t"}], unique=policy)
    key = job_unique_key(job)
    with pytest.raises(DuplicateJobError):
        shared.client.enqueue("c.done", [{"secret": "s3cr3t"}], unique=policy)
    wait_until(lambda: job.id in shared.ran, timeout=20, message="the job to run")
    accepted_eventually(shared, Job.create("c.done", [{"secret": "s3cr3t"}], unique=policy))  # released
    assert caplog.records, "nothing was captured: the check proves nothing"
    assert not [r.getMessage() for r in caplog.records if r.levelno > logging.DEBUG and key in r.getMessage()]


def test_uniq_t01_a_second_identical_job_is_rejected_as_a_duplicate(shared):
    first = shared.client.enqueue("c.basic", [1], queue="idle", unique={"on_conflict": "reject"})
    with pytest.raises(DuplicateJobError) as raised:
        shared.client.enqueue("c.basic", [1], queue="idle", unique={"on_conflict": "reject"})
    assert raised.value.code == "duplicate" and raised.value.existing_id == first.id
    assert raised.value.key == job_unique_key(first)
    assert message_count(shared.amqp_url, shared.names.job_queue("idle")) >= 1


def test_uniq_t02_args_keys_values_alone_make_a_duplicate(shared):
    policy = UniquePolicy(keys=["type", "args"], args_keys=["user_id"])
    first = shared.client.enqueue("c.welcome", [{"user_id": 42, "locale": "en-US"}], queue="idle", unique=policy)
    with pytest.raises(DuplicateJobError) as raised:
        shared.client.enqueue("c.welcome", [{"user_id": 42, "locale": "fr-FR"}], queue="idle", unique=policy)
    assert raised.value.existing_id == first.id
    shared.client.enqueue("c.welcome", [{"user_id": 99, "locale": "en-US"}], queue="idle", unique=policy)


def test_uniq_t03_the_period_runs_from_the_existing_jobs_created_at(shared):
    """A job created 2 s ago with a 4 s period holds its key 2 s more, whatever the attempts in between."""
    policy = UniquePolicy(keys=["type"], period="PT4S")
    created = datetime.now(UTC) - timedelta(seconds=2)
    stamp = created.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    first = shared.client.enqueue_job(
        Job.create("c.period", [1], queue="idle", unique=policy).model_copy(update={"created_at": stamp})
    )
    with pytest.raises(DuplicateJobError):  # a rejected attempt now does not move the window
        shared.client.enqueue("c.period", [2], queue="idle", unique=policy)
    again = accepted_eventually(shared, Job.create("c.period", [3], queue="idle", unique=policy), timeout=10)
    accepted_at = datetime.now(UTC)
    assert again.id != first.id
    # Counted from the attempt, the window would end 4 s after it, 6 s after created_at.
    assert created + timedelta(seconds=3.9) <= accepted_at < created + timedelta(seconds=5.5), accepted_at - created


def test_uniq_t05_completed_in_states_keeps_a_completed_job_a_duplicate(shared):
    """With ``completed`` in ``states`` the key stays held after the job completed; with the default states
    (UNIQ-T04) the same run frees it."""
    keeps = UniquePolicy(
        keys=["type", "args"],
        states=["available", "active", "scheduled", "retryable", "pending", "completed"],
        period="PT1M",
    )
    frees = UniquePolicy(keys=["type", "args"], period="PT1M")
    kept = shared.client.enqueue("c.done", ["t05-keeps"], unique=keeps)
    freed = shared.client.enqueue("c.done", ["t05-frees"], unique=frees)
    wait_until(lambda: {kept.id, freed.id} <= set(shared.ran), timeout=20, message="both jobs to complete")
    again = accepted_eventually(shared, Job.create("c.done", ["t05-frees"], unique=frees))  # T04: released
    wait_until(lambda: again.id in shared.ran, timeout=20, message="the re-enqueued job to complete")
    with pytest.raises(DuplicateJobError) as raised:  # completed, and completed is in its states: still a duplicate
        shared.client.enqueue("c.done", ["t05-keeps"], unique=keeps)
    assert raised.value.existing_id == kept.id


def test_uniq_t06_replace_cancels_the_original_and_enqueues_the_new_job(shared):
    policy = UniquePolicy(keys=["type"], on_conflict="replace")
    old = shared.client.enqueue("c.replace", ["old"], unique=policy, scheduled_at=timedelta(seconds=1))
    new = shared.client.enqueue("c.replace", ["new"], unique=policy)
    assert new.id != old.id
    # The original is cancelled: the cancel is in the queue's control stream.
    read_stream(
        shared.amqp_url, shared.names.control_queue("default"), predicate=lambda m, p, body: old.id.encode() in body
    )
    # A plain job due after the old one: once it ran, the old one was delivered, and dropped as cancelled.
    marker = shared.client.enqueue("c.done", ["t06-marker"], scheduled_at=timedelta(seconds=2))
    wait_until(lambda: marker.id in shared.ran, timeout=30, message="the marker to run")
    assert new.id in shared.ran and old.id not in shared.ran


def test_uniq_t07_ignore_returns_the_original_id_marked_deduplicated(shared):
    policy = UniquePolicy(keys=["type", "args"], on_conflict="ignore")
    first = shared.client.enqueue("c.ignore", [7], queue="idle-7", unique=policy)
    again = shared.client.enqueue("c.ignore", [7], queue="idle-7", unique=policy)
    assert again.id == first.id
    mine = Job.create("c.ignore", [7], queue="idle-7", unique=policy)
    assert shared.client.enqueue_job(mine).id == first.id != mine.id  # told apart from a new job by its id
    [result] = shared.client.enqueue_many([Job.create("c.ignore", [7], queue="idle-7", unique=policy)])
    assert result.ok and result.deduplicated and result.existing_id == first.id and result.job.id == first.id
    assert message_count(shared.amqp_url, shared.names.job_queue("idle-7")) == 1  # nothing else published


def test_uniq_t08_the_same_type_on_another_queue_is_not_a_duplicate(shared):
    policy = UniquePolicy(keys=["type", "queue"])
    on_a = shared.client.enqueue("c.scoped", [1], queue="idle-a", unique=policy)
    on_b = shared.client.enqueue("c.scoped", [1], queue="idle-b", unique=policy)
    assert on_b.id != on_a.id
    with pytest.raises(DuplicateJobError) as raised:
        shared.client.enqueue("c.scoped", [2], queue="idle-a", unique=policy)
    assert raised.value.existing_id == on_a.id


def test_uniq_t09_keys_with_meta_but_no_meta_keys_is_refused(shared):
    invalid(shared, "meta_keys", keys=["meta"])
    invalid(shared, "meta_keys", keys=["type", "meta"], meta_keys=[])
    shared.client.enqueue(
        "c.meta",
        [1],
        queue="idle-meta",
        meta={"tenant_id": "acme"},
        unique={"keys": ["meta"], "meta_keys": ["tenant_id"]},
    )


def test_uniq_30_replacing_a_running_job_never_runs_both_at_once(shared):
    policy = UniquePolicy(keys=["type"], on_conflict="replace")
    gate = shared.gate("t30")
    replaced: list[object] = []
    try:
        old = shared.client.enqueue("c.hold", ["t30"], unique=policy)
        wait_until(lambda: old.id in shared.running, timeout=20, message="the old job to run")
        # A replace that cannot wait long enough for the running holder falls back to reject (spec §5.2).
        with Client(shared.amqp_url, prefix=shared.names.prefix, unique_replace_timeout=0.2) as hasty:
            with pytest.raises(DuplicateJobError, match="cannot be replaced") as raised:
                hasty.enqueue("c.hold", ["t30"], unique=policy)
        assert raised.value.existing_id == old.id and raised.value.key == job_unique_key(old)
        with pytest.raises(ValidationError, match="unique_replace_timeout"):
            Client(shared.amqp_url, unique_replace_timeout=-1)
        assert shared.running == {old.id} and published(shared, "default") == 0  # nothing else published
        # The replace waits for the running holder to end: nothing new is published meanwhile.
        thread = threading.Thread(
            target=lambda: replaced.append(shared.client.enqueue("c.hold", ["t30"], unique=policy))
        )
        thread.start()
        read_stream(  # the INFO asking whether the cancelled holder runs (it is answered: active)
            shared.amqp_url,
            shared.names.control_queue("default"),
            predicate=lambda m, p, body: p.type == "ojs.control.info" and old.id.encode() in body,
        )
        assert not replaced and old.id in shared.running
        gate.set()  # the old job ends (cancelled); only then is the new one published
        thread.join(timeout=20)
        [new] = replaced
        wait_until(lambda: {old.id, new.id} <= set(shared.ran), timeout=20, message="both to end")
        assert not [o for o in shared.overlaps if old.id in o and new.id in o]
        assert shared.ran.index(old.id) < shared.ran.index(new.id)
    finally:
        gate.set()


def test_uniq_20_the_strength_is_declared_in_a_conformance_manifest():
    """``ojs-amqp manifest`` declares the strength, and the mechanism of the configured lock backend (no broker)."""
    for options, mechanism in (
        ([], "RabbitMQ classic queue"),
        (["--unique-backend", "redis://h:6379/0"], "Redis SET NX PX"),
    ):
        result = CliRunner().invoke(cli, ["manifest", *options])
        assert result.exit_code == 0, result.output
        manifest = json.loads(result.output)
        assert manifest["capabilities"]["unique_jobs"]["strength"] == "strong"  # UNIQ-21: one of the two values
        assert manifest["capabilities"]["unique_jobs"]["mechanism"].startswith(mechanism)
        assert manifest["implementation"]["name"] == "ojs-kombu"
