"""``ssl=`` forms -> py-amqp TLS options, and TLS verification failures -> typed errors (no broker)."""

from __future__ import annotations

import logging
import ssl

import pytest

from ojs_kombu.amqp import connection
from ojs_kombu.amqp.connection import make_connection, tls_options, transport_tls_options
from ojs_kombu.amqp.errors import is_permanent, map_exception
from ojs_kombu.errors import BrokerConnectionError, BrokerRefusedError, TlsVerificationError, ValidationError


def _ssl_of(url: str, ssl_option: object = None) -> object:
    conn = make_connection(url, heartbeat=0, ssl=ssl_option, transport_options=None, connection_name="t")
    return conn.ssl


def test_amqps_url_alone_verifies_chain_and_host_name():
    assert _ssl_of("amqps://u:p@broker.example:5671//") == {
        "cert_reqs": ssl.CERT_REQUIRED,
        "server_hostname": "broker.example",
    }


def test_ssl_true_on_an_amqp_url_verifies_the_host_name_too():
    # kombu/py-amqp alone: ssl=True checks the chain but never the host name.
    assert _ssl_of("amqp://u:p@broker.example//", True) == {
        "cert_reqs": ssl.CERT_REQUIRED,
        "server_hostname": "broker.example",
    }


def test_plain_amqp_without_ssl_stays_plain():
    assert not _ssl_of("amqp://u:p@broker.example//")


def test_dict_form_maps_to_py_amqp_options():
    options = tls_options(
        {"ca_certs": "/ca.pem", "certfile": "/c.pem", "keyfile": "/c.key", "server_hostname": "alias.example"},
        host="broker.example",
    )
    assert options == {
        "ca_certs": "/ca.pem",
        "certfile": "/c.pem",
        "keyfile": "/c.key",
        "cert_reqs": ssl.CERT_REQUIRED,
        "server_hostname": "alias.example",
    }


def test_failover_list_leaves_the_host_name_to_kombu_per_host():
    # None: kombu's establish_connection puts each host's name there.
    assert _ssl_of("amqps://u:p@a.example//;amqps://u:p@b.example//")["server_hostname"] is None  # type: ignore[index]


def test_verify_false_turns_both_checks_off_and_warns_once(caplog):
    connection._warn_unverified.cache_clear()
    with caplog.at_level(logging.WARNING, logger="ojs_kombu.amqp.connection"):
        first = tls_options({"verify": False, "ca_certs": "/ca.pem"}, host="h")
        second = tls_options({"verify": False}, host="h")
    assert first == second == {"cert_reqs": ssl.CERT_NONE}  # no server_hostname: py-amqp would check it
    warnings = [r for r in caplog.records if "verification is OFF" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"cafile": "/ca.pem"}, "unknown option(s) cafile"),
        ({"verify": "no"}, "verify must be True or False"),
        (ssl.create_default_context(), "cannot use an ssl.SSLContext"),
        ("yes", "must be True, None or a dict"),
    ],
    ids=["unknown-key", "verify-not-bool", "sslcontext", "string"],
)
def test_bad_ssl_options_are_validation_errors(bad, words):
    with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        make_connection("amqps://h//", heartbeat=0, ssl=bad, transport_options=None, connection_name="t")


def _verify_error(message: str) -> ssl.SSLCertVerificationError:
    exc = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message}")
    exc.verify_message = message
    exc.reason = "CERTIFICATE_VERIFY_FAILED"
    return exc


def test_certificate_verification_failure_is_a_permanent_connection_error():
    exc = _verify_error("Hostname mismatch, certificate is not valid for 'other.example'.")
    mapped = map_exception(exc, url="amqps://guest:s3cret@other.example:5671//")

    assert isinstance(mapped, TlsVerificationError)
    assert isinstance(mapped, BrokerConnectionError) and isinstance(mapped, BrokerRefusedError)
    assert is_permanent(exc) and is_permanent(mapped)
    text = str(mapped)
    assert "verification failed" in text and "other.example" in text and "s3cret" not in text


def test_other_ssl_errors_stay_transient():
    assert not is_permanent(ssl.SSLEOFError(8, "EOF occurred in violation of protocol"))
    assert map_exception(ssl.SSLEOFError(8, "EOF")) is None


def test_transport_given_ssl_directly_gets_verified_options():
    assert transport_tls_options(True) == {"cert_reqs": ssl.CERT_REQUIRED, "server_hostname": None}
    assert transport_tls_options({"ca_certs": "/ca.pem"}) == {
        "ca_certs": "/ca.pem",
        "cert_reqs": ssl.CERT_REQUIRED,
        "server_hostname": None,
    }
    built = tls_options({"ca_certs": "/ca.pem"}, host="h")  # by make_connection: kept
    assert transport_tls_options(built) == built
    assert transport_tls_options({"cert_reqs": ssl.CERT_NONE}) == {"cert_reqs": ssl.CERT_NONE}


def test_py_amqp_own_options_are_kept_with_the_host_name_added():
    # Celery's broker_use_ssl, reaching make_connection through ojs_celery's presence beacon.
    given = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": "/ca.pem", "certfile": "/c.pem", "keyfile": "/c.key"}
    assert _ssl_of("amqps://u:p@broker.example//", given) == {**given, "server_hostname": "broker.example"}
    assert _ssl_of("amqps://u:p@b//", {"cert_reqs": ssl.CERT_NONE}) == {"cert_reqs": ssl.CERT_NONE}
    assert _ssl_of("amqps://u:p@b//", {**given, "server_hostname": "x"})["server_hostname"] == "x"  # type: ignore[index]
