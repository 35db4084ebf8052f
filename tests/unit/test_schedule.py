"""The scheduling cascade's arithmetic and topology (DESIGN §6), without a broker."""

from datetime import UTC, datetime, timedelta

import pytest

from ojs_kombu import Names, ValidationError
from ojs_kombu.model.naming import QUEUE_NAME_RE
from ojs_kombu.policy.schedule import LEVELS, MAX_DELAY_MS, Cascade, bit_key, bit_keys, delay_ms_until
from ojs_kombu.wire.codec import OutgoingMessage
from ojs_kombu.wire.entities import BindingSpec, ExchangeSpec, QueueSpec


def test_range_covers_a_year():
    assert MAX_DELAY_MS >= 365 * 24 * 3600 * 1000
    assert LEVELS == 35


def test_delay_rounds_up_never_early():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert delay_ms_until(now + timedelta(microseconds=1), now) == 1
    assert delay_ms_until(now + timedelta(milliseconds=1500, microseconds=1), now) == 1501
    assert delay_ms_until(now + timedelta(seconds=2), now) == 2000
    assert delay_ms_until(now - timedelta(seconds=2), now) == 0


def test_bit_keys_are_the_set_bits_highest_first():
    assert bit_keys(5) == ["bit:02", "bit:00"]
    assert bit_keys(1024) == ["bit:10"]
    assert sum(2 ** int(k.split(":")[1]) for k in bit_keys(86_400_000)) == 86_400_000


def test_bit_keys_can_never_be_a_queue_name():
    assert not any(QUEUE_NAME_RE.fullmatch(bit_key(k)) for k in range(LEVELS))


def test_delay_beyond_range_is_refused():
    cascade = Cascade(Names("p"))
    with pytest.raises(ValidationError) as info:
        cascade.route(OutgoingMessage(b"{}", {}), MAX_DELAY_MS + 1, "q")
    assert info.value.field == "scheduled_at"


def test_route_adds_the_bits_and_keeps_the_message():
    cascade = Cascade(Names("p"))
    original = OutgoingMessage(b"{}", {"message_id": "m"}, {"x-ojs-attempt": 0})
    message, exchange, key = cascade.route(original, 6, "a.b")
    assert (exchange, key) == (cascade.exchange(2), "a.b")
    assert message.headers == {"x-ojs-attempt": 0, "BCC": ["bit:02", "bit:01"]}
    assert message.properties == original.properties and message.body == original.body
    assert "BCC" not in original.headers


def test_destination_is_the_cascade_for_the_delay_left_then_the_queue():
    """The delay is measured at the call (the publish), not when the job was first looked at."""
    cascade = Cascade(Names("p"))
    original = OutgoingMessage(b"{}", {"message_id": "m"})
    when = datetime(2026, 1, 1, tzinfo=UTC)
    message, exchange, key = cascade.destination(original, when, "a.b", now=when - timedelta(milliseconds=6))
    assert (exchange, key, message.headers["BCC"]) == (cascade.exchange(2), "a.b", ["bit:02", "bit:01"])
    _, exchange, _ = cascade.destination(original, when, "a.b", now=when - timedelta(milliseconds=2))
    assert exchange == cascade.exchange(1)  # the same job a few ms later: a lower level
    for now in (when, when + timedelta(seconds=1)):  # due: straight to its queue
        assert cascade.destination(original, when, "a.b", now=now) == (original, Names("p").direct_exchange, "a.b")


def simulate(cascade: Cascade, delay_ms: int, queue: str) -> tuple[int, list[str]]:
    """Follow a message through the declared entities as RabbitMQ routes it: direct
    matching on the routing key plus the BCC keys, the alternate exchange when nothing
    matches, dead-lettering (same keys) when a queue's TTL runs out.  Returns
    (total TTL waited, final queues)."""
    specs = cascade.specs() + [cascade.queue_binding(queue), cascade.queue_binding("x." + queue)]
    ttl = {s.name: s.argument_dict["x-message-ttl"] for s in specs if isinstance(s, QueueSpec)}
    dlx = {s.name: s.argument_dict["x-dead-letter-exchange"] for s in specs if isinstance(s, QueueSpec)}
    alternate = {s.name: dict(s.arguments).get("alternate-exchange") for s in specs if isinstance(s, ExchangeSpec)}
    bindings = [s for s in specs if isinstance(s, BindingSpec)]
    message, exchange, key = cascade.route(OutgoingMessage(b"", {}), delay_ms, queue)
    keys = {key, *message.headers["BCC"]}
    waited, delivered = 0, []
    while exchange is not None:
        matched = [b.destination for b in bindings if b.exchange == exchange and b.routing_key in keys]
        assert not any(b.to_exchange for b in bindings)
        assert len(matched) <= 1, f"{exchange} would copy the message to {matched}"
        if not matched:
            exchange = alternate.get(exchange)
        elif matched[0] in ttl:
            waited += ttl[matched[0]]
            exchange = dlx[matched[0]]
        else:
            delivered.append(matched[0])
            exchange = None
    return waited, delivered


@pytest.mark.parametrize("delay", [1, 2, 3, 1000, 1023, 1024, 1500, 9_999, 86_400_000, MAX_DELAY_MS])
def test_cascade_delivers_after_exactly_the_delay_to_exactly_one_queue(delay):
    cascade = Cascade(Names("p"))
    waited, delivered = simulate(cascade, delay, "a.b")
    assert waited == delay
    assert delivered == [Names("p").job_queue("a.b")]  # not x.a.b's queue


def test_cascade_entities():
    cascade = Cascade(Names())
    specs = cascade.specs()
    exchanges = [s for s in specs if isinstance(s, ExchangeSpec)]
    queues = [s for s in specs if isinstance(s, QueueSpec)]
    assert len(exchanges) == LEVELS + 1 and all(e.type == "direct" for e in exchanges)
    assert dict(exchanges[1].arguments) == {"alternate-exchange": cascade.delivery_exchange}
    assert len(queues) == LEVELS
    assert dict(queues[10].arguments)["x-message-ttl"] == 1024
    assert dict(queues[10].arguments)["x-dead-letter-exchange"] == cascade.exchange(9)
    assert cascade.queue(3) == "ojs.schedule.03"
    assert cascade.exchange(34) == cascade.top_exchange == "ojs.exchange.schedule.34"
    assert cascade.entry_exchange(1500) == cascade.exchange(10)
    assert cascade.queue_binding("email").routing_key == "email"
