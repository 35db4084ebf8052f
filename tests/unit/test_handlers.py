"""The Worker's handler registry (runtime/handlers.py): pure logic."""

from __future__ import annotations

import pytest

from ojs_kombu import ValidationError
from ojs_kombu.runtime.handlers import Handlers


def plain(x: int) -> int:
    return x


async def coroutine(x: int) -> int:
    return x


def test_a_handler_is_found_by_its_job_type_and_replaced_by_a_later_one():
    handlers = Handlers()
    assert handlers.get("a.job") is None and "a.job" not in handlers and len(handlers) == 0
    handlers.add("a.job", plain)
    assert handlers.get("a.job") is plain and "a.job" in handlers and len(handlers) == 1
    handlers.add("a.job", coroutine)
    assert handlers.get("a.job") is coroutine and len(handlers) == 1


def test_async_types_follow_the_handler_registered_last():
    handlers = Handlers()
    handlers.add("a.job", coroutine)
    assert handlers.is_async("a.job") and handlers.all_async
    handlers.add("b.job", plain)
    assert not handlers.is_async("b.job") and not handlers.all_async
    handlers.add("b.job", coroutine)
    assert handlers.all_async
    handlers.add("a.job", plain)
    assert not handlers.is_async("a.job") and not handlers.all_async


def test_no_handlers_are_not_all_async():
    assert not Handlers().all_async


def test_an_invalid_job_type_is_refused_and_nothing_registered():
    handlers = Handlers()
    with pytest.raises(ValidationError):
        handlers.add("Not A Type!", plain)
    assert len(handlers) == 0
