"""The binding's AMQP headers: the ``x-ojs-*`` names (binding §6.2), error headers, and
RabbitMQ's ``x-death*`` headers that every republish strips (DESIGN §6)."""

from __future__ import annotations

from typing import Any


class Header:
    """The ``x-ojs-*`` header names of binding §6.2."""

    QUEUE = "x-ojs-queue"
    ATTEMPT = "x-ojs-attempt"
    MAX_ATTEMPTS = "x-ojs-max-attempts"
    CREATED_AT = "x-ojs-created-at"
    ENQUEUED_AT = "x-ojs-enqueued-at"
    SCHEDULED_AT = "x-ojs-scheduled-at"
    TAGS = "x-ojs-tags"
    TRACE_ID = "x-ojs-trace-id"
    TRACE_STATE = "x-ojs-trace-state"
    IDEMPOTENCY_KEY = "x-ojs-idempotency-key"
    ERROR_MESSAGE = "x-ojs-error-message"
    ERROR_CODE = "x-ojs-error-code"


#: Headers RabbitMQ adds on dead-lettering; stripped on every republish (DESIGN §6).
DEATH_HEADERS = (
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
)


_DEATH_HEADER_SET = frozenset(DEATH_HEADERS)


def strip_death_headers(headers: dict[str, Any]) -> dict[str, Any]:
    """``headers`` without RabbitMQ's ``x-death*`` / ``x-first-death-*`` / ``x-last-death-*`` (a new dict)."""
    if _DEATH_HEADER_SET.isdisjoint(headers):  # most deliveries were never dead-lettered: a plain copy
        return dict(headers)
    return {k: v for k, v in headers.items() if k not in _DEATH_HEADER_SET}


#: Longest error message carried in ``x-ojs-error-message``.
MAX_ERROR_HEADER = 4096


def error_headers(code: str, message: str) -> dict[str, Any]:
    """``x-ojs-error-code`` and ``x-ojs-error-message`` (truncated to :data:`MAX_ERROR_HEADER`)."""
    return {Header.ERROR_CODE: code, Header.ERROR_MESSAGE: message[:MAX_ERROR_HEADER]}


__all__ = ["DEATH_HEADERS", "MAX_ERROR_HEADER", "Header", "error_headers", "strip_death_headers"]
