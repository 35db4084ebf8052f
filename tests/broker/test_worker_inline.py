"""Short jobs on the consumer thread, long and waiting ones on the handler threads (runtime/handover.py)."""

from __future__ import annotations

import threading
import time

from support import wait_until

from ojs_kombu import Job


class Running:
    """Counts the jobs running at once; remembers the most and the threads they ran on."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.done = 0
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.threads.add(threading.current_thread().name)

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self.now -= 1
            self.done += 1


def started_meeting(worker) -> Running:
    """Register a ``meet.all`` handler on ``worker`` whose jobs wait for each other (three meet at a
    barrier), start it, and return what counts them."""
    barrier = threading.Barrier(3, timeout=15)
    running = Running()

    @worker.handler("meet.all")
    def meet(i: int) -> None:
        with running:
            barrier.wait()

    worker.start()
    assert worker.wait_until_ready()
    return running


def test_jobs_that_wait_for_each_other_run_at_once(client, worker_factory):
    """Three jobs meet at a barrier: the first one runs on the consumer thread and blocks; the
    stand-in takes the connection and the other two go to handler threads."""
    worker = worker_factory(concurrency=3)
    running = started_meeting(worker)
    client.enqueue_many([Job.create("meet.all", [i]) for i in range(3)])
    wait_until(lambda: running.done == 3, timeout=20, message="the three jobs to meet")
    assert running.most == 3
    assert "ojs-consumer" in running.threads  # the first one ran inline
    assert worker.dispatch.handover.takeovers >= 1


def test_jobs_delivered_while_the_stand_in_serves_go_to_the_handler_threads(client, worker_factory):
    """The first job blocks on the consumer thread; the next two are enqueued only then, so they
    arrive in passes the stand-in serves: it hands them out at once, and the three meet."""
    worker = worker_factory(concurrency=3)
    running = started_meeting(worker)
    client.enqueue("meet.all", [0])
    wait_until(lambda: worker.dispatch.handover.serving, message="the stand-in to serve for the first job")
    assert running.threads == {"ojs-consumer"}
    for i in (1, 2):
        client.enqueue("meet.all", [i])
    wait_until(lambda: running.done == 3, timeout=20, message="the three jobs to meet")
    assert running.most == 3


def test_jobs_that_wait_go_to_the_handler_threads(client, worker_factory):
    """Jobs that sleep (I/O) leave the consumer thread after two of them: they run in parallel."""
    worker = worker_factory(concurrency=8)
    running = Running()

    @worker.handler("io.wait")
    def wait(i: int) -> None:
        with running:
            time.sleep(0.005)

    worker.start()
    assert worker.wait_until_ready()
    client.enqueue_many([Job.create("io.wait", [i]) for i in range(60)])
    wait_until(lambda: running.done == 60, timeout=30, message="the 60 jobs")
    assert running.most >= 2
    assert any(name.startswith("ojs-handler") for name in running.threads)


def run_quick_jobs(client, worker, count: int) -> Running:
    """Start ``worker``, run ``count`` jobs that return at once, and say where and how they ran."""
    running = Running()

    @worker.handler("quick.one")
    def quick(i: int) -> None:
        with running:
            pass

    worker.start()
    assert worker.wait_until_ready()
    client.enqueue_many([Job.create("quick.one", [i]) for i in range(count)])
    wait_until(lambda: running.done == count, timeout=30, message=f"the {count} jobs")
    return running


def test_short_jobs_run_on_the_consumer_thread(client, worker_factory):
    running = run_quick_jobs(client, worker_factory(concurrency=8), 100)
    assert "ojs-consumer" in running.threads
    # Jobs ran at once only if some went to the handler threads (a busy machine can send a few).
    assert running.most == 1 or any(name.startswith("ojs-handler") for name in running.threads)


def test_inline_false_runs_every_job_on_a_handler_thread(client, worker_factory):
    worker = worker_factory(concurrency=4, inline=False)
    running = run_quick_jobs(client, worker, 50)
    assert running.threads and all(name.startswith("ojs-handler") for name in running.threads)
    assert worker.dispatch.handover.takeovers == 0
