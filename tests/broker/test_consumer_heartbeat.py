"""The consumer loop ticks py-amqp's heartbeat once per interval, not on every pass.

A busy loop makes thousands of passes a second; the heartbeat tick (kombu's
``heartbeat_check``) needs about two per heartbeat.  An idle consumer still sends
its heartbeats, and a busy one still ticks.
"""

from __future__ import annotations

import threading
import time

from support import wait_until

from ojs_kombu import Client, Job
from ojs_kombu.amqp.topology import Topology
from ojs_kombu.model.naming import Names
from ojs_kombu.runtime.consumer import Consumer, Delivery

COUNT = 2000
HEARTBEAT = 2.0  # the loop's interval: 0.5 s


def test_heartbeat_ticks_once_per_interval_and_heartbeats_still_go_out(amqp_url, prefix):
    names = Names(prefix)
    with Client(amqp_url, prefix=prefix) as client:
        client.declare_queue("hb")
        assert all(r.ok for r in client.enqueue_many([Job.create("a.b", [i], queue="hb") for i in range(COUNT)]))
    acked: list[Delivery] = []
    ticks: list[float] = []
    heartbeats: list[float] = []

    def on_delivery(delivery: Delivery) -> None:
        consumer.ack(delivery)
        acked.append(delivery)

    consumer = Consumer(
        amqp_url,
        {names.job_queue("hb"): "hb"},
        50,
        on_delivery,
        topology=Topology(names),
        heartbeat=HEARTBEAT,
    )
    tick = consumer._kombu.heartbeat_check

    def counting_tick(*args, **kwargs):
        ticks.append(time.monotonic())
        return tick(*args, **kwargs)

    consumer._kombu.heartbeat_check = counting_tick
    thread = threading.Thread(target=consumer.run, daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        wait_until(lambda: len(acked) == COUNT, timeout=60, message="every delivery acked")
        busy = time.monotonic() - started
        during_burst = len([t for t in ticks if t <= started + busy])
        assert 1 <= during_burst <= busy / (HEARTBEAT / 4) + 2, f"{during_burst} ticks in {busy:.2f} s"
        # Idle: heartbeat frames still go out (py-amqp sends one when nothing else was sent).
        connection = consumer._kombu.connection
        writer = connection.frame_writer

        def recording_writer(frame_type, *args, **kwargs):
            if frame_type == 8:
                heartbeats.append(time.monotonic())
            return writer(frame_type, *args, **kwargs)

        connection.frame_writer = recording_writer
        wait_until(lambda: heartbeats, timeout=3 * HEARTBEAT, message="a heartbeat frame")
        assert thread.is_alive() and consumer.connected.is_set()
    finally:
        consumer.stop()
        thread.join(10)
        consumer.close()
