"""Job ids: lowercase UUIDv7 (job.schema.json), the one pattern that checks them, and their generator.

>>> JOB_ID_RE.fullmatch(new_job_id()) is not None
True
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid as _uuid
from typing import Any

from ojs_kombu.model._problems import Problem, short_repr

JOB_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
"""Job id: a lowercase UUIDv7 (job.schema.json)."""

JOB_ID_RE = re.compile(JOB_ID_PATTERN)
""":data:`JOB_ID_PATTERN` compiled; use ``fullmatch``."""

UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""Any canonical lowercase UUID (the tolerant consumer accepts non-v7 ids); use ``fullmatch``."""

_RANDOM_POOL_BYTES = 4096  # os.urandom bytes drawn at once: 512 ids

EXAMPLE_JOB_ID = "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f"
"""A valid job id, quoted by error messages."""


def uuid7(unix_ms: int, rand_a: int, rand_b: int) -> str:
    """The UUIDv7 (RFC 9562 §5.7) of a millisecond timestamp and its two random fields, as a lowercase string.

    Parameters:
        unix_ms: milliseconds since the Unix epoch (the low 48 bits are used).
        rand_a: the 12-bit field after the version (the low 12 bits are used).
        rand_b: the 62-bit field after the variant (the low 62 bits are used).

    Returns:
        The canonical ``8-4-4-4-12`` form, e.g. ``'019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f'``.
    """
    value = (
        (unix_ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | (rand_a & 0xFFF) << 64 | 0b10 << 62 | rand_b & ((1 << 62) - 1)
    )
    hex_ = f"{value:032x}"  # what str(uuid.UUID(int=value)) gives, without building the UUID
    return f"{hex_[:8]}-{hex_[8:12]}-{hex_[12:16]}-{hex_[16:20]}-{hex_[20:]}"


_HEX3 = tuple(f"{n:03x}" for n in range(0x1000))  # rand_a, the counter, as text
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}  # 0b10 and 2 random bits


class _MonotonicUUIDv7:
    """Monotonic UUIDv7 ids (RFC 9562 §6.2, method 1: a 12-bit counter in ``rand_a``).

    ``uuid6.uuid7()`` keeps ids ordered by adding a millisecond to the timestamp
    for every id made within the same millisecond: at 10k jobs/s the ids' clock
    runs ahead of real time by seconds per second (measured: 200,000 ids took
    0.8 s and ended 199 s in the future).  Here ids made within one millisecond
    share its timestamp and count up; only after 2048+ ids in one millisecond
    does the timestamp borrow the next one.  Thread-safe.

    The random bits come from ``os.urandom`` (as ``secrets``), drawn 4 KiB at a time
    rather than one system call per id, and kept as hex digits: an id is its
    millisecond's text (formatted once per millisecond), its counter's and 16 random
    digits, the first of which carries the variant (62 random bits, as :func:`uuid7`'s
    ``rand_b``).  A forked child draws its own (the pool a parent had would give both
    processes the same ids).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._prefix = ""  # the id's text up to rand_a, for _last_ms
        self._counter = 0
        self._random = ""
        self._taken = 0
        os.register_at_fork(after_in_child=self._forget_random)

    def _forget_random(self) -> None:
        self._random, self._taken = "", 0

    def _random_digits(self) -> str:
        """16 random hex digits (64 bits); called under the lock."""
        start = self._taken
        if start >= len(self._random):
            self._random, start = os.urandom(_RANDOM_POOL_BYTES).hex(), 0
        self._taken = start + 16
        return self._random[start : start + 16]

    def _next_ms(self, ms: int) -> None:
        """Move to millisecond ``ms``: its text, a random counter start (11 bits, room to count up)."""
        self._last_ms = ms
        hex_ = f"{ms & 0xFFFF_FFFF_FFFF:012x}"
        self._prefix = f"{hex_[:8]}-{hex_[8:]}-7"
        self._counter = int(self._random_digits()[:3], 16) >> 1

    def __call__(self) -> str:
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            if now_ms > self._last_ms:
                self._next_ms(now_ms)
            else:
                self._counter += 1
                if self._counter > 0xFFF:
                    self._next_ms(self._last_ms + 1)
            prefix, counter = self._prefix, self._counter
            start = self._taken
            if start >= len(self._random):
                self._random, start = os.urandom(_RANDOM_POOL_BYTES).hex(), 0
            self._taken = start + 16
            digits = self._random[start : start + 16]
        return f"{prefix}{_HEX3[counter]}-{_VARIANT[digits[0]]}{digits[1:4]}-{digits[4:]}"


new_job_id = _MonotonicUUIDv7()
"""``new_job_id() -> str``: a new lowercase UUIDv7, monotonic within this process."""


def job_id_argument(job_id: Any) -> str:
    """The ``id=`` argument of ``Job.create``: a new id when None, else a lowercase UUIDv7 (a ``uuid.UUID`` too).

    Raises:
        Problem: ``job_id`` is neither None nor a lowercase UUIDv7.
    """
    if job_id is None:
        return new_job_id()
    if isinstance(job_id, _uuid.UUID):
        job_id = str(job_id)
    if not isinstance(job_id, str) or JOB_ID_RE.fullmatch(job_id) is None:
        raise Problem(
            f"{short_repr(job_id)} is not a lowercase UUIDv7 (e.g. {EXAMPLE_JOB_ID!r}); omit id= to get a new one"
        )
    return job_id


__all__ = ["JOB_ID_PATTERN", "JOB_ID_RE", "new_job_id", "uuid7"]
