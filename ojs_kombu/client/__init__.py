"""The producer side: :class:`Client`, a small front over capability services sharing one session.

* :mod:`~ojs_kombu.client.session` — :class:`Session`: the connection pool, the reconnect
  budget (:mod:`ojs_kombu.amqp.reconnect`) and the settings every service shares, and
  :class:`Service`, the base of a service;
* :mod:`~ojs_kombu.client.publishing` — ``enqueue``, ``enqueue_job``, ``enqueue_many``;
* :mod:`~ojs_kombu.client.control` — ``cancel``, ``pause``, ``resume``, ``info``;
* :mod:`~ojs_kombu.client.deadletters` — ``dead_letters``, ``replay_dead_letters``,
  ``purge_dead_letters`` (:class:`~ojs_kombu.client.deadletters.DeadLetterWalk`);
* :mod:`~ojs_kombu.client.observation` — ``events``, ``workers``, ``queue_counts``, ``paused_queues``.

A new capability (workflows, cron) is one more module: a :class:`Service` subclass that runs
its broker work with ``self.session.run(operation)``, built by :class:`Client` over its
session, and one-line delegates on :class:`Client` for its public methods.
"""

from ojs_kombu.client.control import INFO_SETTLE_WINDOW, best_answer
from ojs_kombu.client.deadletters import DEFAULT_REPLAY_WINDOW
from ojs_kombu.client.front import DEFAULT_PUBLISH_TIMEOUT, Client
from ojs_kombu.client.observation import DEFAULT_STALE_AFTER
from ojs_kombu.client.publishing import GC_PAUSE_MIN_JOBS
from ojs_kombu.client.results import EnqueueResult, JobOptions, QueueCounts
from ojs_kombu.client.session import Service, Session

__all__ = [
    "DEFAULT_PUBLISH_TIMEOUT",
    "DEFAULT_REPLAY_WINDOW",
    "DEFAULT_STALE_AFTER",
    "GC_PAUSE_MIN_JOBS",
    "INFO_SETTLE_WINDOW",
    "Client",
    "EnqueueResult",
    "JobOptions",
    "QueueCounts",
    "Service",
    "Session",
    "best_answer",
]
