"""Entity names (binding §4.1) and the framework-name -> job-type mapping (DESIGN §3)."""

import pytest

from ojs_kombu import Job, Names, ValidationError, job_type_for
from ojs_kombu.model.naming import (
    JOB_TYPE_PATTERN,
    JOB_TYPE_RE,
    QUEUE_NAME_PATTERN,
    QUEUE_NAME_RE,
    validate_job_type,
    validate_queue_name,
)


def test_spec_names_without_prefix():
    n = Names()
    assert n.direct_exchange == "ojs.exchange.direct"
    assert n.dead_letter_exchange == "ojs.exchange.dlx"
    assert n.retry_exchange == "ojs.exchange.retry"
    assert n.delayed_exchange == "ojs.exchange.delayed"
    assert n.job_queue("email") == "ojs.queue.email"
    assert n.dead_letter_queue("email") == "ojs.queue.dlx.email"
    assert n.retry_queue("email", 5000) == "ojs.queue.retry.email.5000"
    assert n.retry_routing_key("email", 5000) == "email.5000"
    assert n.control_queue("email") == "ojs.queue.control.email"


def test_prefix_applies_to_every_entity():
    n = Names("tenant1")
    assert n.job_queue("email") == "tenant1.ojs.queue.email"
    assert n.direct_exchange == "tenant1.ojs.exchange.direct"
    assert n.retry_queue("a.b", 10) == "tenant1.ojs.queue.retry.a.b.10"


@pytest.mark.parametrize("prefix", ["has space", ".dot", "a/b"])
def test_bad_prefix_refused(prefix):
    with pytest.raises(ValidationError):
        Names(prefix)


@pytest.mark.parametrize("queue", ["default", "email", "high-priority", "a.b.c", "0queue"])
def test_valid_queue_names(queue):
    assert validate_queue_name(queue) == queue


@pytest.mark.parametrize(
    "queue", ["", "Email", "-x", ".x", "a b", "x" * 129, "dlx.email", "retry.email.5", "control.x"]
)
def test_invalid_or_reserved_queue_names(queue):
    with pytest.raises(ValidationError) as info:
        validate_queue_name(queue)
    assert info.value.field == "queue"


def test_the_sweep_job_type_is_reserved_to_the_library_yet_decodes():
    from ojs_kombu.model.naming import SWEEP_JOB_TYPE
    from ojs_kombu.runtime.workflow import sweep_job
    from ojs_kombu.wire.codec import decode, encode

    for refused in (lambda: Job.create(SWEEP_JOB_TYPE, ["w"]), lambda: validate_job_type(SWEEP_JOB_TYPE)):
        with pytest.raises(ValidationError, match="reserved") as info:
            refused()
        assert info.value.field == "type"
    job = sweep_job("wf-1", "emails", 3600)
    assert (job.type, job.args, job.queue) == (SWEEP_JOB_TYPE, ["wf-1"], "emails")
    assert job.scheduled_at is not None and job.scheduled_at > job.created_at
    encoded = encode(job)
    assert decode(encoded.body, encoded.properties, encoded.headers).type == SWEEP_JOB_TYPE  # a consumer reads it


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "60", True])
def test_a_bad_workflow_retention_is_refused_where_it_is_given(value):
    from ojs_kombu.runtime.workflow import check_retention
    from ojs_kombu.transport.settings import Settings

    assert check_retention(None) is None and check_retention(60) == 60.0
    with pytest.raises(ValidationError) as info:
        Settings.from_options({"workflow_retention": value})
    assert info.value.field == "workflow_retention"


def test_reserved_prefix_message_explains_the_collision():
    with pytest.raises(ValidationError, match="reserved"):
        validate_queue_name("dlx.email")


@pytest.mark.parametrize(
    "name,expected",
    [
        ("email.send", "email.send"),
        ("Reports.BuildPDF", "reports.build_pdf"),
        ("LegacyActor", "legacy_actor"),
        ("send-email", "send_email"),
        ("tasks.2fa", "tasks.x2fa"),
        ("myapp.tasks.HTTPRequest", "myapp.tasks.http_request"),
        ("a..b", "a.b"),
        ("__main__.add", "main.add"),
    ],
)
def test_job_type_for_maps_framework_names(name, expected):
    assert job_type_for(name) == expected
    assert JOB_TYPE_RE.match(job_type_for(name))


def test_job_type_for_is_deterministic_and_always_valid():
    for name in ["ÄÖÜ.task", "!!!", "x" * 400, "A.B.C", "9", "_"]:
        mapped = job_type_for(name)
        assert mapped == job_type_for(name)
        assert validate_job_type(mapped) == mapped


def test_queue_from_job_queue():
    n = Names("p")
    assert n.queue_from_job_queue("p.ojs.queue.email") == "email"
    assert n.queue_from_job_queue("p.ojs.queue.dlx.email") is None
    assert n.queue_from_job_queue("ojs.queue.email") is None


def test_compiled_patterns_are_the_schema_patterns():
    assert (JOB_TYPE_RE.pattern, QUEUE_NAME_RE.pattern) == (JOB_TYPE_PATTERN, QUEUE_NAME_PATTERN)


@pytest.mark.parametrize("queue", ["Email", "x" * 129, "dlx.email", "control.x", 7])
def test_a_queue_name_is_refused_in_the_same_words_everywhere(queue):
    with pytest.raises(ValidationError) as by_name:
        validate_queue_name(queue)
    with pytest.raises(ValidationError) as by_job:
        Job.create("a.b", queue=queue)
    assert (by_name.value.field, str(by_name.value)) == (by_job.value.field, str(by_job.value))


@pytest.mark.parametrize("job_type", ["Email.send", "a" * 256, "a..b", None])
def test_a_job_type_is_refused_by_the_same_rule_everywhere(job_type):
    with pytest.raises(ValidationError) as by_name:
        validate_job_type(job_type)
    with pytest.raises(ValidationError) as by_job:
        Job.create(job_type)
    assert by_name.value.field == by_job.value.field == "type"
    assert str(by_name.value).startswith(str(by_job.value))
    assert "job_type_for()" in str(by_name.value)
