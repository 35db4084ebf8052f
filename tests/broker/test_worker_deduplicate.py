"""Worker(deduplicate=True): execution de-duplication (DESIGN §19) on a real broker."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from support import message_count, wait_until

from ojs_kombu import CompletedOptions, Job, Worker, current_job
from ojs_kombu.observability.metrics import METRICS


class Runs:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def handler(self, *args: object) -> None:
        with self.lock:
            self.counts[current_job().id] += 1

    def total(self) -> int:
        with self.lock:
            return sum(self.counts.values())


def deduplicated_count(queue: str) -> float:
    return METRICS.jobs_deduplicated.labels(queue)._value.get()


def started(worker: Worker, runs: Runs) -> Worker:
    worker.handler("work", runs.handler)
    worker.start()
    assert worker.wait_until_ready(30)
    return worker


@pytest.mark.parametrize("deduplicate", [True, False])
def test_a_job_delivered_twice_runs_once_with_deduplicate_and_twice_without(
    client, worker_factory, amqp_url, names, deduplicate
):
    runs = Runs()
    worker = started(worker_factory(concurrency=8, deduplicate=deduplicate), runs)
    before = deduplicated_count("default")
    job = Job.create("work", [1])
    client.enqueue_job(job)
    wait_until(lambda: runs.total() == 1, timeout=10, message="the first delivery to run")
    client.enqueue_job(job)  # the same message again: a duplicate delivery of a completed job
    if deduplicate:
        wait_until(lambda: worker.deduplicated == 1, timeout=10, message="the duplicate to be acked")
        assert deduplicated_count("default") == before + 1
        assert runs.counts[job.id] == 1
    else:
        wait_until(lambda: runs.counts[job.id] == 2, timeout=10, message="the duplicate to run")
        assert worker.deduplicated == 0
    wait_until(lambda: message_count(amqp_url, names.job_queue("default")) == 0, timeout=10, message="acked")


def test_a_worker_started_later_skips_the_ids_an_earlier_one_completed(client, worker_factory):
    first_runs, later_runs = Runs(), Runs()
    first = started(worker_factory(concurrency=4, deduplicate=True), first_runs)
    jobs = [Job.create("work", [i]) for i in range(50)]
    assert all(r.ok for r in client.enqueue_many(jobs))
    wait_until(lambda: first_runs.total() == len(jobs), timeout=20, message="the first worker to run them")
    first.stop(timeout=5)
    assert first.completed_log is not None and first.completed_log.recorded == len(jobs)

    later = started(worker_factory(concurrency=4, deduplicate=True), later_runs)
    assert later.completed_log is not None and later.completed_log.replayed == len(jobs)
    assert all(r.ok for r in client.enqueue_many(jobs))  # every one of them again
    fresh = Job.create("work", [99])
    client.enqueue_job(fresh)
    wait_until(lambda: later_runs.total() == 1 and later.deduplicated == len(jobs), timeout=20, message="skipped")
    assert later_runs.counts == Counter({fresh.id: 1})


def test_two_workers_share_their_completions_live(client, worker_factory):
    runs_a, runs_b = Runs(), Runs()
    a = started(worker_factory(concurrency=2, deduplicate=True), runs_a)
    b = started(worker_factory(concurrency=2, deduplicate=True), runs_b)
    jobs = [Job.create("work", [i]) for i in range(40)]
    assert all(r.ok for r in client.enqueue_many(jobs))
    wait_until(lambda: runs_a.total() + runs_b.total() == len(jobs), timeout=20, message="every job to run")
    assert a.completed_log is not None and b.completed_log is not None
    wait_until(
        lambda: all(a.completed_log.is_completed(j.id) and b.completed_log.is_completed(j.id) for j in jobs),
        timeout=10,
        message="both workers to know every completion",
    )
    assert all(r.ok for r in client.enqueue_many(jobs))
    wait_until(lambda: a.deduplicated + b.deduplicated == len(jobs), timeout=20, message="every duplicate acked")
    assert runs_a.total() + runs_b.total() == len(jobs)


def test_a_duplicate_delivered_after_max_age_runs_again(client, worker_factory):
    runs = Runs()
    worker = started(
        worker_factory(concurrency=2, deduplicate=True, completed_options=CompletedOptions(max_age="2s")), runs
    )
    job = Job.create("work", [1])
    client.enqueue_job(job)
    wait_until(lambda: runs.total() == 1, timeout=10, message="the first delivery to run")
    log = worker.completed_log
    assert log is not None and log.is_completed(job.id)
    wait_until(lambda: (log.ids.expire(), not log.is_completed(job.id))[1], timeout=10, message="forgotten")
    client.enqueue_job(job)
    wait_until(lambda: runs.counts[job.id] == 2, timeout=10, message="the late duplicate to run")
    assert worker.deduplicated == 0
