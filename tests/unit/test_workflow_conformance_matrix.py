"""The workflow conformance matrix cannot drift from the spec, the tests or the docs.

``ojs-workflows.md`` (``<repo>/../shared/specs``, or ``$OJS_SPECS_DIR``; missing is an error, not a skip)
numbers none of its requirements, so ``REQUIREMENTS`` of ``tests/broker/test_workflow_conformance.py`` (read
by parsing, not importing it) gives each line that says MUST an id and quotes it; the checks are the shared
ones of ``tests/conformance_matrix.py`` (as for unique jobs and cron). Regenerate the matrix in
``docs/workflows.md`` with ``python tests/unit/test_workflow_conformance_matrix.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, when run as a script
from conformance_matrix import MustMatrix, write_docs_matrix

ROOT = Path(__file__).resolve().parents[2]
MATRIX = MustMatrix(
    root=ROOT,
    spec="ojs-workflows.md",
    module=ROOT / "tests" / "broker" / "test_workflow_conformance.py",
    docs=ROOT / "docs" / "workflows.md",
    marker="workflow-conformance-matrix",
    id_prefix="WF-",
    test_prefix="test_wf_",
    count=64,
)


def test_every_quoted_requirement_is_in_the_spec():
    MATRIX.check_quotes_are_the_specs()


def test_every_must_line_of_the_spec_is_quoted():
    MATRIX.check_every_must_line_is_quoted()


def test_every_requirement_has_a_test_a_reference_or_does_not_apply():
    MATRIX.check_every_requirement_is_covered()


def test_no_test_or_reference_names_a_requirement_that_is_not_listed():
    MATRIX.check_no_unknown_ids()


def test_every_reference_is_an_existing_test():
    MATRIX.check_references_exist()


def test_a_failing_requirement_is_declared_not_met():
    MATRIX.check_xfails_are_declared()


def test_the_docs_matrix_is_the_generated_one():
    MATRIX.check_docs()


if __name__ == "__main__":
    write_docs_matrix(MATRIX.docs, MATRIX.start, MATRIX.end, MATRIX.render())
    sys.exit(0)
