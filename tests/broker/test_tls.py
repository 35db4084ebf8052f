"""TLS with certificate and host name verification, against a private RabbitMQ node with a TLS
listener (a throw-away CA; server certificate for ``localhost`` / ``127.0.0.1``)."""

from __future__ import annotations

import logging
import socket
import ssl as _ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection
from support import wait_until

from ojs_kombu import Client, Worker
from ojs_kombu.errors import BrokerConnectionError, TlsVerificationError, WorkerError
from ojs_kombu.testing.broker import PrivateNode
from ojs_kombu.testing.certs import make_test_pki
from ojs_kombu.transport import register_aliases

SECRET = "tls-s3cret-never-shown"


@pytest.fixture(scope="module")
def node() -> Iterator[PrivateNode]:
    """One private node with a TLS listener (client certificates verified when presented), and a
    user ``tlsuser`` whose password is :data:`SECRET`."""
    with PrivateNode(tls=True) as private:
        management = private.management()
        management.request("PUT", "/api/users/tlsuser", body={"password": SECRET, "tags": ""})
        management.request("PUT", "/api/permissions/%2F/tlsuser", body={"configure": ".*", "write": ".*", "read": ".*"})
        yield private


@pytest.fixture
def ca(node: PrivateNode) -> str:
    return str(node.pki.ca_cert)


def _url(node: PrivateNode, host: str = "localhost") -> str:
    return f"amqps://tlsuser:{SECRET}@{host}:{node.tls_port}//"


def test_client_enqueues_and_worker_runs_a_job_over_verified_tls(node, ca):
    prefix = f"t{uuid.uuid4().hex[:12]}"
    ran = threading.Event()
    worker = Worker(_url(node), prefix=prefix, ssl={"ca_certs": ca}, grace_period=1)
    worker.handler("tls.job", lambda value: ran.set() if value == 42 else None)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert worker.wait_until_ready(timeout=30)
        with Client(_url(node), prefix=prefix, ssl={"ca_certs": ca}) as client:
            client.enqueue("tls.job", [42])
        assert ran.wait(20), "the job did not run over TLS"
        assert worker.error is None
    finally:
        worker.stop(timeout=5)
        thread.join(10)


def test_a_host_name_not_in_the_certificate_is_refused_at_once(node, ca):
    client = Client(_url(node, "127.0.0.2"), ssl={"ca_certs": ca}, publish_timeout=30)
    started = time.monotonic()
    with pytest.raises(TlsVerificationError) as info:
        client.enqueue("a.b", [1])
    assert time.monotonic() - started < 5, "a verification failure must not be retried until the budget ends"
    assert isinstance(info.value, BrokerConnectionError)
    assert "verification failed" in str(info.value) and "'127.0.0.2'" in str(info.value)


def test_a_server_hostname_override_is_checked(node, ca):
    client = Client(_url(node), ssl={"ca_certs": ca, "server_hostname": "not-in-cert.example"})
    with pytest.raises(BrokerConnectionError, match="not-in-cert.example"):
        client.enqueue("a.b", [1])


def test_an_unknown_ca_is_refused_with_verification_named(node):
    client = Client(_url(node), ssl=None, publish_timeout=30)  # amqps:// alone: the system CAs
    with pytest.raises(BrokerConnectionError, match="verification failed.*certificate"):
        client.enqueue("a.b", [1])


def test_verify_false_connects_to_a_certificate_nobody_trusts(node):
    prefix = f"t{uuid.uuid4().hex[:12]}"
    with Client(_url(node, "127.0.0.2"), prefix=prefix, ssl={"verify": False}) as client:
        job = client.enqueue("a.b", [1])
    assert job.id


def test_a_client_certificate_is_presented_and_verified(node, ca, tmp_path: Path):
    prefix = f"t{uuid.uuid4().hex[:12]}"
    pki = node.pki
    name = f"{prefix} with client cert"
    options = {"ca_certs": ca, "certfile": str(pki.client_cert), "keyfile": str(pki.client_key)}
    with Client(_url(node), prefix=prefix, ssl=options, connection_name=name) as client:
        client.enqueue("a.b", [1])
        mine = wait_until(
            lambda: [
                c
                for c in node.management().connections()
                if c.get("client_properties", {}).get("connection_name") == name
            ],
            timeout=15,
            message="the client's connection in the management API",
        )
    assert mine[0]["ssl"] is True and "CN=guest" in mine[0]["peer_cert_subject"]

    # A certificate from another CA: the node refuses the handshake.
    stranger = make_test_pki(tmp_path / "stranger")
    options = {"ca_certs": ca, "certfile": str(stranger.client_cert), "keyfile": str(stranger.client_key)}
    with pytest.raises(BrokerConnectionError):
        Client(_url(node), ssl=options, publish_timeout=2).enqueue("a.b", [1])


def test_a_worker_gives_up_on_a_verification_failure(node, ca):
    worker = Worker(_url(node, "127.0.0.2"), ssl={"ca_certs": ca}, grace_period=1)
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        worker.run()
    assert time.monotonic() - started < 15
    assert isinstance(info.value.__cause__, TlsVerificationError)


def test_no_password_in_logs_or_errors(node, ca, caplog):
    with caplog.at_level(logging.DEBUG):
        for host, ssl in (("127.0.0.2", {"ca_certs": ca}), ("localhost", None), ("localhost", {"verify": False})):
            try:
                Client(_url(node, host), ssl=ssl, publish_timeout=2).enqueue("a.b", [1])
            except BrokerConnectionError as exc:
                assert SECRET not in str(exc) and SECRET not in repr(exc)
    assert caplog.records, "expected some log records to check"
    assert not [r for r in caplog.records if SECRET in r.getMessage()]


def test_ojss_transport_given_ssl_directly_verifies_the_host_name(node, ca):
    # Celery passes broker_use_ssl to kombu as is: the ojss:// transport verifies the host name itself.
    register_aliases()
    good = Connection(f"ojss://tlsuser:{SECRET}@localhost:{node.tls_port}//", ssl={"ca_certs": ca})
    try:
        good.ensure_connection(max_retries=0)
        assert good.connected
    finally:
        good.release()
    wrong = Connection(f"ojss://tlsuser:{SECRET}@127.0.0.2:{node.tls_port}//", ssl={"ca_certs": ca})
    try:
        with pytest.raises(Exception, match="not valid for '127.0.0.2'"):
            wrong.ensure_connection(max_retries=0, reraise_as_library_errors=False)
    finally:
        wrong.release()


# -- a failover list over TLS: each node verified against its own name ------------------------------


def _refused_url() -> str:
    """An ``amqps://`` URL whose host, 127.0.0.3, is not in the node's certificate, on a closed port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.3", 0))
        port = probe.getsockname()[1]
    return f"amqps://tlsuser:{SECRET}@127.0.0.3:{port}//"


def test_a_failover_list_verifies_each_node_against_its_own_name(node, ca, caplog):
    # The first node cannot be reached; the second is verified as "localhost", not as the first's 127.0.0.3.
    prefix = f"t{uuid.uuid4().hex[:12]}"
    with caplog.at_level(logging.WARNING):
        with Client(f"{_refused_url()};{_url(node)}", prefix=prefix, ssl={"ca_certs": ca}, publish_timeout=10) as c:
            assert c.enqueue("a.b", [1]).id
    switched = [r.getMessage() for r in caplog.records if "switching to broker" in r.getMessage()]
    assert switched == [f"switching to broker amqps://tlsuser:***@localhost:{node.tls_port}//"]
    assert not [r for r in caplog.records if SECRET in r.getMessage()]


def test_an_ojs_transport_failover_list_verifies_each_node_against_its_own_name(node, ca):
    # Celery's broker_use_ssl with server_hostname None: "the host connected to", for every node of the list.
    register_aliases()
    urls = [_refused_url().replace("amqps://", "ojs://"), _url(node).replace("amqps://", "ojs://")]
    options = {"ca_certs": ca, "cert_reqs": _ssl.CERT_REQUIRED, "server_hostname": None}
    conn = Connection(urls, ssl=options)
    try:
        conn.ensure_connection(max_retries=1, interval_start=0, reraise_as_library_errors=False)
        assert conn.connected and conn.hostname == "127.0.0.1"  # localhost, the second node
    finally:
        conn.release()
    assert options["server_hostname"] is None  # the caller's options are left as they were
