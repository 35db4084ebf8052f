"""The failover policy (pure logic) and the checks of a failover URL list: no broker."""

from __future__ import annotations

import ssl as _ssl

import pytest
from kombu.connection import Connection

from ojs_kombu.amqp.failover import Failover, Rotation
from ojs_kombu.amqp.urls import resolve_url, safe_url, split_urls
from ojs_kombu.errors import ValidationError
from ojs_kombu.transport import register_aliases


def mid() -> float:
    return 0.5  # no jitter: reconnect_delay(n) == min(2**(n-1), 60)


# -- the rotation ---------------------------------------------------------------------------------


def test_every_node_is_tried_back_to_back_then_one_back_off_per_rotation() -> None:
    rotation = Rotation(3, rand=mid)
    delays = [rotation.failed() for _ in range(9)]
    assert delays == [0, 0, 1, 0, 0, 2, 0, 0, 4]


def test_the_rotation_moves_round_the_nodes_in_order() -> None:
    rotation = Rotation(3, rand=mid)
    seen = [rotation.index]
    for _ in range(4):
        rotation.failed()
        seen.append(rotation.index)
    assert seen == [0, 1, 2, 0, 1]


def test_a_single_url_backs_off_after_every_failure_as_before_failover() -> None:
    rotation = Rotation(1, rand=mid)
    assert [rotation.failed() for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_a_success_starts_a_fresh_rotation_without_back_off() -> None:
    rotation = Rotation(2, rand=mid)
    assert [rotation.failed() for _ in range(4)] == [0, 1, 0, 2]
    rotation.succeeded()
    assert rotation.failures == 0
    assert [rotation.failed(), rotation.failed()] == [0, 1]


def test_a_stale_failure_of_a_node_already_left_neither_moves_nor_counts() -> None:
    rotation = Rotation(3, rand=mid)
    assert rotation.failed(0) == 0  # the first connection finds node 0 dead: on to node 1
    assert rotation.failed(0) == 0  # a second pooled connection on node 0 reports it too
    assert (rotation.index, rotation.failures) == (1, 1)


def test_the_back_off_keeps_its_jitter() -> None:
    low, high = Rotation(2, rand=lambda: 0.0), Rotation(2, rand=lambda: 0.999)
    assert [low.failed(), low.failed()] == [0, 0.75]
    assert [high.failed(), high.failed()][1] == pytest.approx(1.25, abs=0.01)


def test_a_rotation_needs_a_node() -> None:
    with pytest.raises(ValidationError):
        Rotation(0)


# -- the URL list ---------------------------------------------------------------------------------

N1, N2, N3 = "amqp://u:s3cret@n1:5672//", "amqp://u:s3cret@n2:5673//", "amqp://u:s3cret@n3:5674//"


@pytest.mark.parametrize("given", [f"{N1};{N2};{N3}", [N1, N2, N3], (N1, N2, N3), f" {N1} ; {N2} ; {N3} "])
def test_the_list_forms_are_one_normal_form(given: str | list[str]) -> None:
    assert resolve_url(given) == f"{N1};{N2};{N3}"
    assert split_urls(given) == [N1, N2, N3]


def test_a_single_url_is_left_as_it_is() -> None:
    assert resolve_url("amqp://localhost") == "amqp://localhost"
    assert resolve_url([N1]) == N1


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ([], "list is empty"),
        ("  ", "list is empty"),
        (f"{N1};;{N2}", "#2 of the failover list is empty"),
        (f"{N1};", "#2 of the failover list is empty"),
        ([N1, "amqps://u:s3cret@n2:5671//"], "mixes TLS and plain schemes: broker URL #2"),
        ([N1, "ojs://u:s3cret@n2//"], "mixes schemes: broker URL #2"),
        ([N1, "u:s3cret@n2"], "#2 ('u:***@n2') is not a URL"),
        ([N1, "amqp://u:s3cret@n2:99999//"], "#2 ('amqp://u:***@n2:99999//') is malformed"),
        ([N1, "amqp://u:s3cret@:5672//"], "names no host"),
        ([N1, 5672], "must be a string or a list of strings"),
    ],
)
def test_a_bad_list_is_a_validation_error_naming_the_entry(given: object, says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        resolve_url(given)  # type: ignore[arg-type]
    assert says in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_safe_url_masks_every_password_of_a_list() -> None:
    shown = safe_url(f"{N1};{N2}")
    assert "s3cret" not in shown
    assert shown.count("n1") == 1 and shown.count("n2") == 1


# -- the connections a Failover points ------------------------------------------------------------


def failover(url: str, ssl: object = None) -> Failover:
    return Failover(url, heartbeat=0, ssl=ssl, transport_options=None, connection_name="t", rand=mid)


def point(fo: Failover, conn: Connection) -> None:
    fo._point(conn)  # what connect() does before its one attempt


def test_a_connection_follows_the_rotation_and_a_pool_clone_too() -> None:
    fo = failover(f"{N1};{N2};amqp://u:s3cret@n3//")
    conn = fo.connection()
    assert (conn.hostname, conn.port) == ("n1", 5672)
    assert conn.alt == []  # kombu's own failover is out of the way
    fo.failed(conn)
    point(fo, conn)
    assert (conn.hostname, conn.port, conn.userid) == ("n2", 5673, "u")
    clone = conn.clone()
    fo.failed(conn)
    point(fo, clone)
    assert (clone.hostname, clone.port) == ("n3", None)  # not n2's port: the default


def test_each_tls_node_is_verified_against_its_own_name() -> None:
    fo = failover("amqps://u:p@n1.example:5671//;amqps://u:p@n2.example:5671//", ssl={"ca_certs": "/ca.pem"})
    conn = fo.connection()
    assert conn.ssl["server_hostname"] == "n1.example"
    fo.failed(conn)
    point(fo, conn)
    assert conn.ssl == {"ca_certs": "/ca.pem", "cert_reqs": _ssl.CERT_REQUIRED, "server_hostname": "n2.example"}
    fo.failed(conn)
    point(fo, conn)
    assert conn.ssl["server_hostname"] == "n1.example"


def test_a_bad_ssl_option_fails_when_the_failover_is_made() -> None:
    with pytest.raises(ValidationError, match="unknown option"):
        failover("amqps://n1//;amqps://n2//", ssl={"verfy": False})


def test_the_ojs_transport_checks_a_celery_failover_list() -> None:
    register_aliases()
    good = Connection(["ojs://u:s3cret@n1//", "ojs://u:s3cret@n2//"])
    assert good.transport.driver_name == "ojs"  # made without connecting
    bad = Connection("ojs://u:s3cret@n1//;ojss://u:s3cret@n2//")
    with pytest.raises(ValidationError, match="mixes TLS and plain schemes: broker URL #2") as caught:
        bad.transport  # noqa: B018 - the transport is made on first use
    assert "s3cret" not in str(caught.value)
