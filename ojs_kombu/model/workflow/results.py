"""Workflow results (§7.5): how large one result and the results carried inline may be.

A job's result carried by a workflow is at most :data:`MAX_RESULT_BYTES`; the results carried
inline in one envelope at most :data:`MAX_INLINE_RESULTS_BYTES` (:func:`fit_parent_results`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ojs_kombu.errors import ResultTooLargeError
from ojs_kombu.model.jsonvalue import dumps, ensure_json_native

MAX_RESULT_BYTES: Final = 64 * 1024
"""Largest result (compact JSON, UTF-8) a job of a workflow may return: 64 KiB, the spec's floor
(§7.5: no limit below 64 KB).  Not more, because results travel inside envelopes of at most 1 MiB
(``MAX_ENVELOPE_BYTES``) and a chain carries every earlier step's result: 64 KiB leaves room for
a dozen steps' results inline.  Above it the job fails with ``result_too_large`` (not retried:
the same handler returns the same result); store the data elsewhere and return a reference
(``{"result_ref": "s3://...", "result_size_bytes": ...}``)."""

MAX_INLINE_RESULTS_BYTES: Final = 512 * 1024
"""Most ``parent_results`` bytes carried inline in one envelope (half of ``MAX_ENVELOPE_BYTES``,
the rest for the job's own arguments and the continuation).  Above it a chain step carries the
most recent results that fit (always the immediately preceding one, §7.2 MUST); a group's or
batch's results are read from its fan-in record instead (:attr:`WorkflowContext.results_from`)."""


def result_size(result: Any) -> int:
    """The size of a result as carried: UTF-8 bytes of its compact JSON.

    Parameters:
        result: a handler's return value.

    Returns:
        The size in bytes.

    Raises:
        ValidationError: the result is not a JSON value.
    """
    ensure_json_native(result, "result")
    return len(dumps(result).encode("utf-8"))


def check_result(result: Any, *, limit: int = MAX_RESULT_BYTES) -> int:
    """Refuse a result a workflow cannot carry (over :data:`MAX_RESULT_BYTES`).

    Parameters:
        result: a handler's return value.
        limit: the limit in bytes.

    Returns:
        Its size in bytes.

    Raises:
        ResultTooLargeError: it is bigger (the job fails with ``result_too_large``, not retried).
        ValidationError: it is not a JSON value.
    """
    size = result_size(result)
    if size > limit:
        raise ResultTooLargeError(
            f"the result is {size} bytes, over the {limit}-byte limit of a workflow's results; store it elsewhere "
            'and return a reference, e.g. {"result_ref": "s3://bucket/key", "result_size_bytes": ...}',
            size=size,
            limit=limit,
        )
    return size


def fit_parent_results(
    parent_results: Mapping[str, Any], *, limit: int = MAX_INLINE_RESULTS_BYTES
) -> dict[str, Any] | None:
    """The ``parent_results`` to carry inline: all of them, or the most recent that fit.

    Keys are step indexes (``"0"``, ``"1"`` ...); the oldest steps are dropped first and the
    newest (the immediately preceding step, §7.2 MUST) never.

    Parameters:
        parent_results: every earlier result, keyed by index.
        limit: the inline budget in bytes.

    Returns:
        The results to carry, or None when even the newest alone is over ``limit`` (then read it
        from the fan-in record: :attr:`WorkflowContext.results_from`).
    """
    if not parent_results:
        return {}
    keys = sorted(parent_results, key=_index_key)
    sizes = {key: len(dumps(parent_results[key]).encode("utf-8")) + len(key) + 4 for key in keys}
    if sizes[keys[-1]] > limit:
        return None
    kept: list[str] = []
    total = 2
    for key in reversed(keys):
        if total + sizes[key] > limit:
            break
        kept.append(key)
        total += sizes[key]
    return {key: parent_results[key] for key in sorted(kept, key=_index_key)}


def _index_key(key: str) -> tuple[int, str]:
    return (int(key), key) if key.isdigit() else (1 << 62, key)
