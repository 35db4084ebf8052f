"""A job stream under a cluster drill: a Client enqueuing, a Worker running, and what each job did.

The drills of ``tests/cluster`` (a node killed and not restarted, a rolling restart) run the same
load: a ``Client`` enqueues ``total`` jobs one after the other to a quorum queue, a quarter of them
scheduled 0-3 s ahead and an eighth failing their first attempt (so they pass through a retry
queue); a ``Worker`` runs them.  :class:`JobStream` records which enqueues returned ok and which
jobs ran (and how often: duplicates); :class:`HeldSampler` samples the dead letters that quorum
queues hold on their way to the next queue (``messages_dlx`` of the management API).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import kombu
import support

from ojs_kombu import Client, Job, OjsError, RetryPolicy, Worker, current_job
from ojs_kombu.amqp.management import ManagementClient, ManagementError
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.testing.cluster import Cluster
from ojs_kombu.wire.entities import QueueOptions

QUEUE = "drill"
CONFIRM_TIMEOUT = 10.0
PUBLISH_TIMEOUT = 10.0
SCHEDULED_WITHIN = 3.0  # seconds ahead a scheduled job is due at most
FLAKY = RetryPolicy(max_attempts=3, initial_interval="PT1S", jitter=False)
RETRY_DELAY_MS = 1000  # the retry queue a flaky job's first failure goes through


def rabbitmq_version(cluster: Cluster) -> tuple[int, ...]:
    """The cluster's RabbitMQ version, e.g. ``(4, 3, 6)`` (its management API's ``rabbitmq_version``)."""
    running = next(node for node in cluster.nodes if node.is_running())
    return support.rabbitmq_version(cluster.management(running))


def set_dlx_resend(cluster: Cluster, ms: int) -> None:
    """``dead_letter_worker_publisher_confirm_timeout`` on every running node (dead-letter workers read it when they start)."""
    for node in cluster.nodes:
        if node.is_running():
            done = node.ctl("eval", f"application:set_env(rabbit, dead_letter_worker_publisher_confirm_timeout, {ms}).")
            assert done is not None and done.returncode == 0, f"cannot set the dead-letter resend time on {node.name}"


def held_dead_letters(queue: dict[str, Any]) -> int:
    """Dead letters a quorum queue holds until their target queue confirms them.

    ``messages_dlx`` where the broker reports it; else what ``messages`` counts beyond the ready
    and the unacknowledged messages (at-least-once dead letters count in ``messages``).
    """
    if "messages_dlx" in queue:
        return int(queue["messages_dlx"] or 0)
    counted = int(queue.get("messages") or 0)
    return max(0, counted - int(queue.get("messages_ready") or 0) - int(queue.get("messages_unacknowledged") or 0))


@dataclass
class HeldSampler:
    """Samples, every ``interval`` s, the dead letters held by the queues under ``prefix``.

    ``management`` gives the management API to ask at each sample (a surviving node's).
    """

    management: Callable[[], ManagementClient]
    prefix: str
    interval: float = 0.5
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-held-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                queues = self.management().queues(self.prefix + ".")
            except ManagementError:
                queues = None  # the node asked is down or busy: no sample
            if queues is not None:
                held = {q["name"]: held_dead_letters(q) for q in queues}
                self.samples.append((time.monotonic(), {name: n for name, n in held.items() if n}))
            self._stop.wait(self.interval)

    def now(self) -> dict[str, int]:
        """The last sample: queue -> held dead letters (non-zero only)."""
        return dict(self.samples[-1][1]) if self.samples else {}

    def peak(self, since: float = 0.0) -> int:
        """The most dead letters held at once (all queues together) in a sample taken after ``since``."""
        return max((sum(held.values()) for at, held in self.samples if at >= since), default=0)

    def held_for(self, since: float) -> float:
        """Seconds from ``since`` to the last sample that saw a held dead letter (0: none seen)."""
        seen = [at for at, held in self.samples if at >= since and held]
        return max(seen) - since if seen else 0.0


@dataclass
class JobStream:
    """``total`` jobs enqueued by a Client and run by a Worker, both on ``urls`` (quorum queues).

    Job ``i`` is scheduled 0-3 s ahead when ``i % 4 == 0``, fails its first attempt (retried 1 s
    later through a retry queue) when ``i % 8 == 1``, and runs at once otherwise.  ``pace``
    seconds pass between two enqueues; :meth:`stop_publishing` ends the stream before ``total``.
    """

    urls: Sequence[str]
    prefix: str
    total: int
    pace: float = 0.0
    concurrency: int = 8
    queue_options: QueueOptions = field(default_factory=lambda: QueueOptions(queue_type="quorum"))
    confirmed: dict[str, float] = field(default_factory=dict)  # job id -> when its enqueue returned ok
    kinds: dict[str, str] = field(default_factory=dict)  # job id -> "now" | "scheduled" | "flaky"
    refused: list[tuple[float, OjsError]] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    done: Counter[str] = field(default_factory=Counter)  # job id -> successful runs
    attempts: dict[str, list[int]] = field(default_factory=dict)  # job id -> the attempts that ran
    early: list[str] = field(default_factory=list)
    ran_at: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self._stop_publishing = threading.Event()
        self.client = Client(
            list(self.urls),
            prefix=self.prefix,
            queue_options=self.queue_options,
            confirm_timeout=CONFIRM_TIMEOUT,
            publish_timeout=PUBLISH_TIMEOUT,
        )
        self.worker = Worker(
            list(self.urls),
            prefix=self.prefix,
            queues=[QUEUE],
            queue_options=self.queue_options,
            concurrency=self.concurrency,
            grace_period=5,
        )
        self.worker.handler("drill.job", self._run_job)
        self.publisher = threading.Thread(target=self._publish, name="test-publisher", daemon=True)

    def _run_job(self, _index: int, kind: str) -> None:
        job = current_job()
        due = job.scheduled_datetime
        with self.lock:
            self.ran_at.append(time.monotonic())
            self.attempts.setdefault(job.id, []).append(job.attempt)
            if due is not None and time.time() < due.timestamp():
                self.early.append(job.id)
        if kind == "flaky" and job.attempt == 1:
            raise RuntimeError("the first attempt fails")
        with self.lock:
            self.done[job.id] += 1

    def _publish(self) -> None:
        rng = random.Random(27)
        for i in range(self.total):
            if self._stop_publishing.is_set():
                return
            kind = "scheduled" if i % 4 == 0 else "flaky" if i % 8 == 1 else "now"
            job = Job.create(
                "drill.job",
                [i, kind],
                queue=QUEUE,
                scheduled_at=timedelta(seconds=rng.uniform(0, SCHEDULED_WITHIN)) if kind == "scheduled" else None,
                retry=FLAKY if kind == "flaky" else None,
            )
            started = time.monotonic()
            try:
                self.client.enqueue_job(job)
            except OjsError as exc:  # not ok: the job may or may not run; nothing is claimed for it
                self.refused.append((time.monotonic(), exc))
            else:
                with self.lock:
                    self.confirmed[job.id] = time.monotonic()
                    self.kinds[job.id] = kind
            self.durations.append(time.monotonic() - started)
            if self.pace:
                time.sleep(self.pace)  # spreads the stream over the drill; not a synchronisation

    def declare(self) -> None:
        """Declare through the first URL's node the job queue, its DLQ, the scheduling cascade and the
        flaky jobs' retry queue (otherwise declared at the first retry, through the Worker's node)."""
        self.client.declare_queue(QUEUE, scheduling=True)
        topology = Topology(self.client.names, queue_options=self.queue_options)
        with kombu.Connection(self.urls[0]) as conn:
            topology.ensure_retry_queue(conn.connection, QUEUE, RETRY_DELAY_MS)

    def start(self) -> None:
        """Start the Worker, then (once it consumes) the stream."""
        self.worker.start()
        assert self.worker.wait_until_ready(30), "the worker did not start"
        self.publisher.start()

    def wait_confirmed(self, count: int, timeout: float = 120) -> None:
        """Until ``count`` enqueues have returned ok."""
        deadline = time.monotonic() + timeout
        while len(self.confirmed) < count:
            assert self.publisher.is_alive(), f"the stream ended with {len(self.confirmed)} ok, not {count}"
            assert time.monotonic() < deadline, f"only {len(self.confirmed)} of {count} enqueues ok"
            time.sleep(0.01)

    def stop_publishing(self) -> None:
        """End the stream after the enqueue under way."""
        self._stop_publishing.set()

    def finish_publishing(self, timeout: float = 180) -> None:
        self.publisher.join(timeout=timeout)
        assert not self.publisher.is_alive(), "the publisher hung"

    def missing(self) -> dict[str, str]:
        """Confirmed jobs that have not run to completion: job id -> kind."""
        with self.lock:
            return {job_id: self.kinds[job_id] for job_id in self.confirmed if not self.done[job_id]}

    def duplicates(self) -> int:
        """Extra successful runs of confirmed jobs (at least once: redeliveries after a node loss)."""
        with self.lock:
            return sum(count - 1 for job_id, count in self.done.items() if job_id in self.confirmed and count > 1)

    def assert_survived(self, duplicates_at_most: float) -> None:
        """What every drill asserts besides "nothing lost": no job early, the Worker alive and reconnected,
        duplicates within ``duplicates_at_most`` of the confirmed jobs, and every refused enqueue a typed
        error within the Client's budgets, never a hang."""
        assert self.early == []
        assert self.worker.error is None
        assert self.worker.consumer.reconnections >= 1
        assert self.duplicates() <= duplicates_at_most * len(self.confirmed)
        assert max(self.durations) < CONFIRM_TIMEOUT + PUBLISH_TIMEOUT + 5

    def close(self) -> None:
        if self.publisher.is_alive():
            self.publisher.join(timeout=60)
        self.worker.stop(timeout=10)
        self.client.close()
