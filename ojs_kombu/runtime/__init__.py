"""Running jobs: the consumer loop, the one settle path, the Worker, dead-letter entries, the cron leader lease, the cron registry and scheduler,
the completed ids of execution de-duplication."""

from ojs_kombu.runtime.completed import CompletedIds, CompletedLog
from ojs_kombu.runtime.consumer import Consumer, Delivery
from ojs_kombu.runtime.cron import CronRegistry, CronScheduler, RegisteredCron
from ojs_kombu.runtime.deadletter import DeadLetterEntry
from ojs_kombu.runtime.leader import LeaderLease
from ojs_kombu.runtime.refill import WindowRefiller
from ojs_kombu.runtime.settle import Settler
from ojs_kombu.runtime.worker import Worker, current_job

__all__ = [
    "CompletedIds",
    "CompletedLog",
    "Consumer",
    "CronRegistry",
    "CronScheduler",
    "RegisteredCron",
    "DeadLetterEntry",
    "Delivery",
    "LeaderLease",
    "Settler",
    "Worker",
    "WindowRefiller",
    "current_job",
]
