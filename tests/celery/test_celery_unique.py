"""Unique jobs from Celery (issue 30): ``apply_async(..., ojs_unique={...})`` and ``@app.task(ojs_unique=...)``;
a duplicate raises ``ojs_kombu.DuplicateJobError`` in the caller and nothing more is published."""

from __future__ import annotations

import json

import pytest
from support import get_messages, message_count

from ojs_kombu import DuplicateJobError

UNIQUE = {"keys": ["type", "args"], "period": "PT1H"}


def test_apply_async_ojs_unique_refuses_a_duplicate(celery_app, amqp_url, names):
    @celery_app.task
    def report(day):
        return day

    first = report.apply_async(("2026-11-27",), ojs_unique=UNIQUE)
    with pytest.raises(DuplicateJobError) as info:
        report.apply_async(("2026-11-27",), ojs_unique=UNIQUE)
    assert info.value.existing_id == first.id
    report.apply_async(("2026-11-28",), ojs_unique=UNIQUE)  # another key
    ignored = report.apply_async(("2026-11-27",), ojs_unique={**UNIQUE, "on_conflict": "ignore"})
    assert ignored.id != first.id  # Celery made its id; nothing was published for it
    assert message_count(amqp_url, names.job_queue("celery")) == 2
    envelopes = [json.loads(body) for _, _, body in get_messages(amqp_url, names.job_queue("celery"), 2)]
    assert [e["unique"] for e in envelopes] == [UNIQUE, UNIQUE]


def test_the_task_option_applies_to_every_call(celery_app):
    @celery_app.task(ojs_unique={"keys": ["type"], "period": "PT10M"})
    def singleton(n):
        return n

    first = singleton.delay(1)
    with pytest.raises(DuplicateJobError) as info:
        singleton.delay(2)
    assert info.value.existing_id == first.id
