"""Pure logic of issue 29: the management URL derived from the broker URL, the one password mask, job id checks."""

from __future__ import annotations

import uuid

import pytest
from click.testing import CliRunner

from ojs_kombu.amqp.management import management_client
from ojs_kombu.amqp.urls import management_url_for, redact, safe_url, vhost_of
from ojs_kombu.cli import main
from ojs_kombu.cli.common import redact as cli_redact
from ojs_kombu.cli.common import remember_secrets
from ojs_kombu.errors import ValidationError


@pytest.mark.parametrize(
    ("broker_url", "expected"),
    [
        ("amqp://guest:guest@127.0.0.1:25672//", "http://guest:guest@127.0.0.1:15672/"),
        ("amqps://app:s3cret@rabbit.example:5671/prod", "http://app:s3cret@rabbit.example:15672/"),
        ("amqp://n1.example;amqp://u:p@n2.example", "http://guest:guest@n1.example:15672/"),  # first host
        ("amqp://a%40b:p%2Fw@[::1]:5672/%2F", "http://a%40b:p%2Fw@[::1]:15672/"),  # quoting kept, IPv6
        ("amqp://app@h:1//", "http://app:guest@h:15672/"),
    ],
)
def test_management_url_is_derived_from_the_first_broker_url(broker_url, expected):
    assert management_url_for(broker_url) == expected


def test_management_url_derivation_needs_a_host():
    with pytest.raises(ValidationError, match="names no host"):
        management_url_for("amqp:///vh")


@pytest.mark.parametrize(
    ("broker_url", "vhost"), [("amqp://h//", "/"), ("amqp://h", "/"), ("amqp://h/", "/"), ("amqp://h/v%2Fx", "v/x")]
)
def test_vhost_of_the_broker_url(broker_url, vhost):
    assert vhost_of(broker_url) == vhost


def test_management_client_derives_overrides_or_goes_without():
    derived = management_client(None, "amqp://app:s3cret@rabbit:5672/prod;amqp://other:x@n2//")
    assert derived is not None and derived.derived
    assert (derived.base_url, derived.user, derived.vhost) == ("http://rabbit:15672", "app", "prod")
    given = management_client("http://mon:pw@rabbit:8080/api-root/", "amqp://app:s3cret@rabbit//")
    assert given is not None and not given.derived
    assert (given.base_url, given.user, given.vhost) == ("http://rabbit:8080/api-root", "mon", "/")
    own = management_client("http://rabbit:8080", "amqp://app:s3cret@rabbit/vh")
    assert own is not None and own.user == "app" and own.vhost == "vh"  # the broker URL's credentials
    assert management_client("", "amqp://app:s3cret@rabbit//") is None


def test_one_mask_for_every_url_and_message():
    assert safe_url("amqp://guest:guest@127.0.0.1:25672//") == "amqp://guest:***@127.0.0.1:25672//"
    assert safe_url("amqp://u:a@h1//;amqp://v:b@h2:5673//") == "amqp://u:***@h1:5672//;amqp://v:***@h2:5673//"
    assert redact("at amqps://user:p@ss@host:5671/vh: refused") == "at amqps://user:***@host:5671/vh: refused"
    # a user named like the password keeps its name in a URL; the password alone is hidden elsewhere
    assert redact("login guest to amqp://guest:guest@h//", ["guest"]) == "login *** to amqp://guest:***@h//"
    remember_secrets("amqp://guest:guest@h//")
    assert cli_redact("cannot reach amqp://guest:guest@h:5672//") == "cannot reach amqp://guest:***@h:5672//"


def invoke(*argv: str) -> tuple[int, str, str]:
    with CliRunner().isolation() as (out, err, _):
        code = main(list(argv))
    return code, out.getvalue().decode(), err.getvalue().decode()


@pytest.mark.parametrize("command", ["cancel", "info"])
@pytest.mark.parametrize("bad", ["12345", "not-a-uuid", "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0"])
def test_cancel_and_info_refuse_what_is_not_a_job_id_before_connecting(command, bad):
    # port 1: nothing listens, so an exit 2 (not 1 after the retries) shows nothing was tried
    code, out, err = invoke(command, bad, "--queue", "q", "--url", "amqp://guest:guest@127.0.0.1:1//")
    assert (code, out) == (2, "")
    assert f"{bad!r} is not a job id: expected a UUID" in err and "Usage:" in err


def test_any_uuid_is_a_job_id_for_the_cli():
    from ojs_kombu.cli.control import job_id_arg

    ojs_id = "019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F"
    dramatiq_id = str(uuid.uuid4())  # Dramatiq's message_id, a Celery task id: UUIDv4
    assert job_id_arg(None, None, f" {ojs_id} ") == ojs_id.lower()  # type: ignore[arg-type]
    assert job_id_arg(None, None, dramatiq_id) == dramatiq_id  # type: ignore[arg-type]
