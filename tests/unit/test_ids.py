"""Job ids (ojs_kombu.model.ids): the UUIDv7 layout, the one pattern, and the monotonic generator."""

from __future__ import annotations

import os
import re
import time
import uuid

from ojs_kombu.model.ids import JOB_ID_PATTERN, JOB_ID_RE, new_job_id, uuid7


def test_uuid7_matches_the_rfc_9562_example():
    # RFC 9562 Appendix A.6: unix_ts_ms 0x017F22E279B0, rand_a 0xCC3, rand_b 0x18C4DC0C0C07398F.
    assert uuid7(0x017F22E279B0, 0xCC3, 0x18C4DC0C0C07398F) == "017f22e2-79b0-7cc3-98c4-dc0c0c07398f"


def test_uuid7_keeps_only_the_bits_of_each_field():
    value = uuid.UUID(uuid7(2**48 + 5, 2**12 + 7, 2**62 + 9))
    assert (value.version, value.variant) == (7, uuid.RFC_4122)
    assert value.int >> 80 == 5 and (value.int >> 64) & 0xFFF == 7 and value.int & (2**62 - 1) == 9


def test_job_id_pattern_and_its_compiled_form_agree():
    assert JOB_ID_RE.pattern == JOB_ID_PATTERN
    assert JOB_ID_RE.fullmatch(new_job_id())
    for bad in ["019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F", str(uuid.uuid4()), "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f\n"]:
        assert JOB_ID_RE.fullmatch(bad) is None


def test_job_ids_are_monotonic_uuidv7_that_keep_to_the_clock():
    before_ms = time.time_ns() // 1_000_000
    ids = [new_job_id() for _ in range(100_000)]
    after_ms = time.time_ns() // 1_000_000
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(re.fullmatch(JOB_ID_PATTERN, i) for i in ids[::997])
    stamps = [int(i.replace("-", ""), 16) >> 80 for i in (ids[0], ids[-1])]
    assert before_ms <= stamps[0]
    # uuid6.uuid7() ends ~100 s ahead here; ours at most a few ms (2048+ ids in one ms borrow the next).
    assert stamps[1] <= after_ms + 50


def test_a_forked_child_draws_its_own_random_bits():
    new_job_id()  # the parent has random bits in its pool now
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then out without running the test session's exit handlers
        os.write(write_end, new_job_id().encode())
        os._exit(0)
    os.close(write_end)
    child_id = os.read(read_end, 64).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    parent_id = new_job_id()
    assert JOB_ID_RE.fullmatch(child_id)
    rand_b = [int(i.replace("-", ""), 16) & (2**62 - 1) for i in (child_id, parent_id)]
    assert rand_b[0] != rand_b[1]


def test_every_id_carries_62_fresh_random_bits():
    ids = [new_job_id() for _ in range(2000)]
    rand_b = [int(i.replace("-", ""), 16) & (2**62 - 1) for i in ids]
    assert len(set(rand_b)) == len(ids)
    assert {i[19] for i in ids} == set("89ab")  # the variant's digit: 0b10 and two random bits
    assert {i[14] for i in ids} == {"7"}  # the version
