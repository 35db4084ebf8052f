"""Settle requests are typed, and a waiting loop is woken by the first request only."""

from __future__ import annotations

import os
import socket

from ojs_kombu.runtime.delivery import Delivery
from ojs_kombu.runtime.requests import Ack, Nack, Republish, SettleRequests
from ojs_kombu.runtime.wakeup import Wakeup


def delivery() -> Delivery:
    return Delivery(b"{}", {}, {}, 1, False, "", "q", "q", 1)


def test_requests_are_taken_in_order_and_typed():
    wakeup = Wakeup()
    try:
        requests = SettleRequests(wakeup)
        d = delivery()
        requests.put(Ack(d))
        requests.put(Nack(d))
        requests.put(Republish(d, (d.outgoing(), "x", "q"), "q"))
        taken = [requests.take() for _ in range(3)]
        assert [type(r) for r in taken] == [Ack, Nack, Republish]
        assert requests.empty()
    finally:
        wakeup.close()


def test_only_an_idle_loop_is_woken_and_once():
    wakeup = Wakeup()
    left, right = socket.socketpair()
    try:
        requests = SettleRequests(wakeup)
        requests.put(Ack(delivery()))  # busy loop: no byte in the pipe
        assert not wakeup.wait(left, 0.0, requests.empty)
        requests.drop_all()
        wakeup.idle = True
        requests.put(Ack(delivery()))
        requests.put(Ack(delivery()))
        assert os.read(wakeup.read_fd, 10) == b"x"  # one byte for both
        wakeup.wake()  # still pending until a wait clears it
        right.send(b"!")
        assert wakeup.wait(left, 1.0, requests.empty)  # the socket is readable
    finally:
        left.close()
        right.close()
        wakeup.close()
    wakeup.wake()  # after close: dropped, never written
    assert wakeup.read_fd == wakeup.write_fd == -1
