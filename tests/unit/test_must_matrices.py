"""The conformance matrices of the workflows and rate-limiting specs cannot drift from the specs, the
tests or the docs.

``ojs-workflows.md`` and ``ojs-rate-limiting.md`` (``<repo>/../shared/specs``, or ``$OJS_SPECS_DIR``;
missing is an error, not a skip) number none of their requirements, so ``REQUIREMENTS`` of
``tests/broker/test_workflow_conformance.py`` and ``tests/broker/test_ratelimit_conformance.py`` (read by
parsing, not importing them) give each line that says MUST an id and quote it; every check below is one of
:class:`conformance_matrix.MustMatrix`'s, run for each spec.  Regenerate the matrices in
``docs/workflows.md`` and ``docs/limits.md`` with ``python tests/unit/test_must_matrices.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, when run as a script
from conformance_matrix import MustMatrix, write_docs_matrix

ROOT = Path(__file__).resolve().parents[2]
MATRICES = {
    "workflows": MustMatrix(
        root=ROOT,
        spec="ojs-workflows.md",
        module=ROOT / "tests" / "broker" / "test_workflow_conformance.py",
        docs=ROOT / "docs" / "workflows.md",
        marker="workflow-conformance-matrix",
        id_prefix="WF-",
        test_prefix="test_wf_",
        count=64,
    ),
    "rate-limiting": MustMatrix(
        root=ROOT,
        spec="ojs-rate-limiting.md",
        module=ROOT / "tests" / "broker" / "test_ratelimit_conformance.py",
        docs=ROOT / "docs" / "limits.md",
        marker="ratelimit-conformance-matrix",
        id_prefix="RL-",
        test_prefix="test_rl_",
        count=25,
    ),
}

CHECKS = {
    "every quoted requirement is in the spec": MustMatrix.check_quotes_are_the_specs,
    "every MUST line of the spec is quoted": MustMatrix.check_every_must_line_is_quoted,
    "every requirement has a test, a reference or does not apply": MustMatrix.check_every_requirement_is_covered,
    "no test or reference names a requirement that is not listed": MustMatrix.check_no_unknown_ids,
    "every reference is an existing test": MustMatrix.check_references_exist,
    "a failing requirement is declared not met": MustMatrix.check_xfails_are_declared,
    "the docs matrix is the generated one": MustMatrix.check_docs,
}


@pytest.mark.parametrize("check", CHECKS.values(), ids=list(CHECKS))
@pytest.mark.parametrize("spec", MATRICES)
def test_the_conformance_matrix(spec, check):
    check(MATRICES[spec])


if __name__ == "__main__":
    for matrix in MATRICES.values():
        write_docs_matrix(matrix.docs, matrix.start, matrix.end, matrix.render())
    sys.exit(0)
