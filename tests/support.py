"""Test-side helpers that talk to the broker directly (pika), independent of the library."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pika

from ojs_kombu.amqp.version import parse_version


def pika_url(amqp_url: str) -> str:
    """pika's form of a kombu-style URL (``amqp://u:p@h:port//`` means vhost ``/``, which pika spells ``%2F``)."""
    parts = urlsplit(amqp_url.replace("ojs://", "amqp://", 1))
    vhost = parts.path[1:] if parts.path.startswith("/") else parts.path
    vhost = vhost or "/"
    return urlunsplit(("amqp", parts.netloc, "/" + quote(vhost, safe=""), "", ""))


def pika_parameters(amqp_url: str) -> pika.URLParameters:
    """pika parameters for a kombu-style URL (see :func:`pika_url`)."""
    return pika.URLParameters(pika_url(amqp_url))


@contextmanager
def raw_channel(amqp_url: str) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    """A pika channel on its own connection, closed afterwards."""
    connection = pika.BlockingConnection(pika_parameters(amqp_url))
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()


def get_messages(amqp_url: str, queue: str, count: int, timeout: float = 10.0, *, ack: bool = True) -> list:
    """Fetch ``count`` messages from ``queue`` (test-side inspection), waiting up to ``timeout``.

    Returns ``(method, properties, body)`` tuples; fewer if the time ran out.
    """
    found = []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        try:
            with raw_channel(amqp_url) as channel:
                while len(found) < count and time.monotonic() < deadline:
                    method, properties, body = channel.basic_get(queue, auto_ack=ack)
                    if method is None:
                        time.sleep(0.02)
                        continue
                    found.append((method, properties, body))
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:  # the queue may not exist yet (declared lazily)
                raise
            time.sleep(0.05)
    return found


def read_stream(
    amqp_url: str,
    stream: str,
    count: int = 0,
    timeout: float = 10.0,
    until: bytes | None = None,
    predicate: Callable[[Any, Any, bytes], bool] | None = None,
) -> list:
    """Read a stream from its start (an independent pika consumer): ``count`` records, or, with
    ``until`` (a body) or ``predicate(method, properties, body)``, every record read up to and
    including the first that matches, which must come within ``timeout``.

    Returns the ``(method, properties, body)`` records read (with ``count``, fewer after ``timeout``)."""
    if until is not None:
        predicate = lambda method, properties, body: body == until  # noqa: E731
    found: list = []
    with raw_channel(amqp_url) as channel:
        channel.basic_qos(prefetch_count=100)

        def on_message(ch, method, properties, body):
            found.append((method, properties, body))
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(stream, on_message, arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + timeout
        while (
            predicate is None and len(found) < count or predicate is not None and not any(predicate(*r) for r in found)
        ):
            if time.monotonic() >= deadline:
                assert predicate is None, f"no matching record in {stream} after {timeout}s"
                break
            channel.connection.process_data_events(time_limit=0.1)
    return found


def message_count(amqp_url: str, queue: str) -> int:
    """Ready messages in ``queue`` right now (passive declare, exact and immediate)."""
    with raw_channel(amqp_url) as channel:
        return channel.queue_declare(queue, passive=True).method.message_count


def total_messages(amqp_url: str, queues: list[str]) -> int:
    """Ready messages in ``queues``, read in that order on one channel (passive declares, exact).

    The reads are not one snapshot: list queues that messages move between (the scheduling
    cascade's levels, whose messages only move down) *destination first*, so a message moving
    between two reads is missed, never counted twice; then poll for the total with :func:`wait_until`.
    A queue that does not exist (yet) counts 0.
    """
    total = 0
    connection = pika.BlockingConnection(pika_parameters(amqp_url))
    try:
        channel = connection.channel()
        for queue in queues:
            try:
                total += channel.queue_declare(queue, passive=True).method.message_count
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != 404:
                    raise
                channel = connection.channel()
    finally:
        if connection.is_open:
            connection.close()
    return total


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05, message: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def rabbitmq_version(management: Any) -> tuple[int, ...]:
    """The broker's RabbitMQ version (management API ``/api/overview``), e.g. ``(4, 3, 6)``."""
    version = parse_version(management.overview()["rabbitmq_version"])
    assert version is not None, "the management API named no RabbitMQ version"
    return version


def ojs_url(amqp_url: str) -> str:
    """``amqp_url`` with the ``ojs://`` scheme (the kombu transport of this project)."""
    return "ojs" + amqp_url[amqp_url.index("://") :]


def slow_first_call(monkeypatch: Any, owner: Any, name: str, extra: float) -> list[float]:
    """Make ``owner.name`` (a method, patched on an object or on its class) take ``extra`` seconds
    longer the first time it is called, after it has done its work: a broker slow to declare (a
    fresh scheduling cascade, 35 quorum queues, takes up to a second on RabbitMQ 4.3 under load).

    The wait is the scenario, not a synchronisation.  Returns the list the duration of every
    call is appended to (the first one is at least ``extra``).
    """
    original = getattr(owner, name)
    took: list[float] = []

    def slow(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return original(*args, **kwargs)
        finally:
            if not took:
                time.sleep(extra)
            took.append(time.monotonic() - started)

    monkeypatch.setattr(owner, name, slow)
    return took


def enqueue_at_once(
    connect: Callable[[], Any], job_type: str, unique: Any, *, warm_up: Callable[[Any], None], clients: int = 16
) -> tuple[list[Any], list[Any]]:
    """``clients`` clients (``connect()``), each warmed up by ``warm_up(client)`` so that only the race is
    left, enqueue the same unique job at one barrier (issue 30's strength test).  Any error other than a
    ``DuplicateJobError`` fails the test.

    Returns:
        ``(accepted jobs, DuplicateJobErrors)``.
    """
    from ojs_kombu import DuplicateJobError

    barrier = threading.Barrier(clients)
    accepted: list[Any] = []
    refused: list[Any] = []
    other: list[BaseException] = []
    lock = threading.Lock()

    def enqueue() -> None:
        with connect() as own:
            warm_up(own)
            barrier.wait()
            try:
                job = own.enqueue(job_type, [42], unique=unique)
                with lock:
                    accepted.append(job)
            except DuplicateJobError as exc:
                with lock:
                    refused.append(exc)
            except BaseException as exc:  # noqa: BLE001 - reported below
                with lock:
                    other.append(exc)

    threads = [threading.Thread(target=enqueue) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not other, other
    return accepted, refused
