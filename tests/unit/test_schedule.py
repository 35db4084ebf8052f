"""The scheduling cascade's arithmetic and topology (DESIGN §6), without a broker."""

import fnmatch
import re
from datetime import datetime, timedelta, timezone

import pytest

from ojs_kombu import Names, ValidationError
from ojs_kombu.schedule import LEVELS, MAX_DELAY_MS, Cascade, delay_ms_until, routing_key
from ojs_kombu.topology import BindingSpec, ExchangeSpec, QueueSpec


def topic_match(pattern: str, key: str) -> bool:
    """AMQP topic matching: * is one word, # is zero or more words."""
    regex = "^" + r"\.".join(
        "[^.]+" if w == "*" else ".*" if w == "#" else re.escape(w) for w in pattern.split(".")
    ) + "$"
    regex = regex.replace(r"\..*", r"(\..*)?").replace(r".*\.", r"(.*\.)?")
    return re.match(regex, key) is not None


def test_range_covers_a_year():
    assert MAX_DELAY_MS >= 365 * 24 * 3600 * 1000
    assert LEVELS == 35


def test_delay_rounds_up_never_early():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert delay_ms_until(now + timedelta(microseconds=1), now) == 1
    assert delay_ms_until(now + timedelta(milliseconds=1500, microseconds=1), now) == 1501
    assert delay_ms_until(now + timedelta(seconds=2), now) == 2000
    assert delay_ms_until(now - timedelta(seconds=2), now) == 0


def test_routing_key_is_bits_then_queue():
    key = routing_key(5, "a.b")
    words = key.split(".")
    assert len(words) == LEVELS + 2
    assert "".join(words[:LEVELS]) == format(5, f"0{LEVELS}b")
    assert words[LEVELS:] == ["a", "b"]


def test_delay_beyond_range_is_refused():
    with pytest.raises(ValidationError) as info:
        routing_key(MAX_DELAY_MS + 1, "q")
    assert info.value.field == "scheduled_at"


def simulate(cascade: Cascade, delay_ms: int, queue: str, entry: str | None = None) -> tuple[int, list[str]]:
    """Follow a message published to ``entry`` (default: the top exchange) through the
    declared bindings: (total TTL waited, final queues)."""
    specs = cascade.specs() + [cascade.queue_binding(queue), cascade.queue_binding("x." + queue)]
    ttl = {s.name: dict(s.arguments)["x-message-ttl"] for s in specs if isinstance(s, QueueSpec)}
    dlx = {s.name: dict(s.arguments)["x-dead-letter-exchange"] for s in specs if isinstance(s, QueueSpec)}
    bindings = [s for s in specs if isinstance(s, BindingSpec)]
    key = routing_key(delay_ms, queue)
    waited, delivered = 0, []
    frontier = [entry or cascade.top_exchange]
    while frontier:
        exchange = frontier.pop()
        for b in bindings:
            if b.exchange == exchange and topic_match(b.routing_key, key):
                if b.to_exchange:
                    frontier.append(b.destination)
                elif b.destination in ttl:
                    waited += ttl[b.destination]
                    frontier.append(dlx[b.destination])
                else:
                    delivered.append(b.destination)
    return waited, delivered


@pytest.mark.parametrize("delay", [0, 1, 2, 3, 1000, 1500, 86_400_000, MAX_DELAY_MS])
def test_cascade_delivers_after_exactly_the_delay_to_exactly_one_queue(delay):
    cascade = Cascade(Names("p"))
    waited, delivered = simulate(cascade, delay, "a.b")
    assert waited == delay
    assert delivered == [Names("p").job_queue("a.b")]  # not x.a.b's queue


@pytest.mark.parametrize("delay", [1, 2, 3, 1000, 1023, 1024, 9_999, 86_400_000, MAX_DELAY_MS])
def test_entering_at_the_highest_set_bit_is_the_same_route(delay):
    cascade = Cascade(Names("p"))
    entry = cascade.entry_exchange(delay)
    assert entry == cascade.exchange(delay.bit_length() - 1)
    assert simulate(cascade, delay, "a.b", entry) == (delay, [Names("p").job_queue("a.b")])


def test_cascade_entities():
    cascade = Cascade(Names())
    specs = cascade.specs()
    exchanges = [s for s in specs if isinstance(s, ExchangeSpec)]
    queues = [s for s in specs if isinstance(s, QueueSpec)]
    assert len(exchanges) == LEVELS + 1 and all(e.type == "topic" for e in exchanges)
    assert len(queues) == LEVELS
    assert dict(queues[10].arguments)["x-message-ttl"] == 1024
    assert cascade.queue(3) == "ojs.schedule.03"
    assert cascade.exchange(34) == cascade.top_exchange == "ojs.exchange.schedule.34"
    assert cascade.queue_binding("email").routing_key == "*." * LEVELS + "email"
