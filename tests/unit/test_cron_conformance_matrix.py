"""The cron conformance matrix cannot drift from the spec, the tests or the docs.

Reads the requirement table of ``ojs-cron.md`` §12 (``<repo>/../shared/specs``, or ``$OJS_SPECS_DIR``;
missing is an error, not a skip), the ``test_cron_NN_…`` / ``test_cron_sNN_…`` names, ``REFERENCES`` and
``NOT_MET`` of ``tests/broker/test_cron_conformance.py`` (by parsing, not importing it), and the matrix
between the markers in ``docs/periodic-jobs.md``.  Regenerate the matrix with
``python tests/unit/test_cron_conformance_matrix.py``.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, when run as a script
from conformance_matrix import constant, docs_matrix, functions, is_xfail, module_tree, write_docs_matrix

ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE = ROOT / "tests" / "broker" / "test_cron_conformance.py"
DOCS = ROOT / "docs" / "periodic-jobs.md"
START, END = "<!-- cron-conformance-matrix:start -->", "<!-- cron-conformance-matrix:end -->"
ROW = re.compile(r"^\| (CRON-S?\d\d) \| (.+?) \| [\d.]+ \|$")


def spec_requirements() -> dict[str, str]:
    """id -> requirement text, from the spec's §12 tables."""
    specs = Path(os.environ.get("OJS_SPECS_DIR") or ROOT.parent / "shared" / "specs")
    text = (specs / "ojs-cron.md").read_text(encoding="utf-8")
    found = {m.group(1): m.group(2) for line in text.splitlines() if (m := ROW.match(line))}
    assert len(found) == 36, f"expected CRON-01…30 and CRON-S01…S06 in {specs / 'ojs-cron.md'}, got {sorted(found)}"
    return found


def prefix_of(requirement: str) -> str:
    """``CRON-16`` -> ``test_cron_16_``; ``CRON-S04`` -> ``test_cron_s04_``."""
    return "test_cron_" + requirement.removeprefix("CRON-").lower() + "_"


def conformance() -> tuple[dict[str, ast.FunctionDef], dict[str, list[str]], dict[str, str]]:
    tree = module_tree(CONFORMANCE)
    tests = {name: node for name, node in functions(tree).items() if name.startswith("test_cron_")}
    references = constant(tree, "REFERENCES")
    not_met = constant(tree, "NOT_MET")
    assert isinstance(references, dict) and isinstance(not_met, dict)
    return tests, references, not_met


def render() -> str:
    """The matrix as a Markdown table (what ``docs/periodic-jobs.md`` holds between the markers)."""
    tests, references, not_met = conformance()
    lines = ["| ID | Level | Requirement | Status | Proven by |", "|---|---|---|---|---|"]
    for requirement, text in spec_requirements().items():
        level = "SHOULD" if requirement.startswith("CRON-S") else "MUST"
        own = [
            f"`{name}`" + (" (xfail)" if is_xfail(node) else "")
            for name, node in tests.items()
            if name.startswith(prefix_of(requirement))
        ]
        cited = [f"`{ref.split('/')[-1].replace('.py::', '::')}`" for ref in references.get(requirement, [])]
        status = "**partly**: " + not_met[requirement] if requirement in not_met else "met"
        proof = ", ".join(own + cited)
        lines.append(f"| {requirement} | {level} | {text} | {status} | {proof} |")
    return "\n".join(lines)


def test_every_requirement_of_the_spec_has_a_test_or_a_reference():
    tests, references, not_met = conformance()
    for requirement in spec_requirements():
        own = [name for name in tests if name.startswith(prefix_of(requirement))]
        assert own or references.get(requirement), f"{requirement}: no test_cron_… and no REFERENCES entry"


def test_no_test_or_reference_names_a_requirement_the_spec_lacks():
    tests, references, not_met = conformance()
    known = {prefix_of(r) for r in spec_requirements()}
    for name in tests:
        assert any(name.startswith(prefix) for prefix in known), f"{name} names no requirement of the spec"
    assert set(references) | set(not_met) <= set(spec_requirements())


def test_every_reference_is_an_existing_test():
    _, references, _ = conformance()
    for requirement, cited in references.items():
        for reference in cited:
            path, _, name = reference.partition("::")
            assert name in functions(module_tree(ROOT / path)), f"{requirement}: {reference} does not exist"


def test_a_failing_requirement_is_declared_not_met():
    """An xfail test of a requirement is only allowed when NOT_MET says what is missing, and the reverse."""
    tests, _, not_met = conformance()
    for name, node in tests.items():
        if is_xfail(node):
            assert any(name.startswith(prefix_of(r)) for r in not_met), f"{name} is xfail but its id is not in NOT_MET"
    for requirement, why in not_met.items():
        assert len(why) > 40, f"{requirement}: say what is missing and why"


def test_the_docs_matrix_is_the_generated_one():
    assert docs_matrix(DOCS, START, END) == render(), (
        f"the matrix in {DOCS.name} is stale: run python {Path(__file__).relative_to(ROOT)}"
    )


if __name__ == "__main__":
    write_docs_matrix(DOCS, START, END, render())
    sys.exit(0)
