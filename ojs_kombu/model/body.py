"""An envelope as JSON text (an AMQP body, a string): the size limit, UTF-8, JSON, an object at the top.

One reading serves :meth:`ojs_kombu.model.job.Job.from_json` and the consumer's
:func:`ojs_kombu.wire.codec.decode`; each words the failure for its caller.
"""

from __future__ import annotations

from typing import Any, Literal

from ojs_kombu.model.jsonvalue import JsonTextError, loads_native

MAX_ENVELOPE_BYTES = 1024 * 1024
"""Largest envelope accepted or produced, in UTF-8 bytes (ojs-json-format: support up to 1 MiB)."""

BodyErrorCode = Literal["envelope_too_large", "decode_error", "invalid_envelope"]
"""The OJS error codes a consumer reports for a body that is not an envelope."""


class BodyError(ValueError):
    """Why a text is not an envelope.

    Its message completes a sentence about the text (``f"envelope {exc}"``); ``code``
    is the error code a consumer writes to ``x-ojs-error-code``.
    """

    def __init__(self, text: str, code: BodyErrorCode) -> None:
        super().__init__(text)
        self.code: BodyErrorCode = code


def read_envelope(data: str | bytes | bytearray | memoryview, *, tolerant: bool) -> tuple[dict[str, Any], bool]:
    """Decode an envelope's JSON text into a dict, without validating its fields, and say if it is JSON-native.

    Parameters:
        data: JSON text, or its UTF-8 encoding.
        tolerant: strip a leading byte order mark instead of refusing it (the consumer path, DESIGN §2).

    Returns:
        The decoded JSON object, and whether its values are JSON-native by construction
        (see :func:`ojs_kombu.model.jsonvalue.loads_native`).

    Raises:
        BodyError: over :data:`MAX_ENVELOPE_BYTES` (``envelope_too_large``), not UTF-8 or not JSON
            (``decode_error``), or JSON that is not an object (``invalid_envelope``).
    """
    if isinstance(data, str):
        # A str of n characters is n..4n UTF-8 bytes: only measure when it matters.
        if len(data) > MAX_ENVELOPE_BYTES or (
            4 * len(data) > MAX_ENVELOPE_BYTES and len(data.encode("utf-8", "surrogatepass")) > MAX_ENVELOPE_BYTES
        ):
            raise BodyError(f"is larger than {MAX_ENVELOPE_BYTES} bytes", "envelope_too_large")
    elif len(data) > MAX_ENVELOPE_BYTES:
        raise BodyError(f"is {len(data)} bytes, over the {MAX_ENVELOPE_BYTES}-byte limit", "envelope_too_large")
    try:
        obj, native = loads_native(data, strip_bom=tolerant)
    except JsonTextError as exc:
        raise BodyError(str(exc), "decode_error") from None
    if not isinstance(obj, dict):
        raise BodyError(f"must be a JSON object, got a JSON {type(obj).__name__}", "invalid_envelope")
    return obj, native


__all__ = ["MAX_ENVELOPE_BYTES", "BodyError", "BodyErrorCode", "read_envelope"]
