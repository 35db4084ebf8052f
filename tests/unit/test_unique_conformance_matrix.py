"""The unique-jobs conformance matrix cannot drift from the spec, the tests or the docs.

``ojs-unique-jobs.md`` (``<repo>/../shared/specs``, or ``$OJS_SPECS_DIR``; missing is an error, not a skip)
numbers none of its requirements, so ``REQUIREMENTS`` of ``tests/broker/test_unique_conformance.py`` (read by
parsing, not importing it) gives each an id and quotes it; here every quote must be in the spec, and every
MUST of the spec (each line that says MUST, each item of a "… MUST:" list, each scenario of §14) must be
quoted.  Then, as for cron: every id has a ``test_uniq_…`` or a ``REFERENCES`` entry (or is
``NOT_APPLICABLE``), xfails are declared in ``NOT_MET``, and the matrix between the markers of
``docs/unique-jobs.md`` is the generated one (regenerate it with
``python tests/unit/test_unique_conformance_matrix.py``).
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
CONFORMANCE = ROOT / "tests" / "broker" / "test_unique_conformance.py"
DOCS = ROOT / "docs" / "unique-jobs.md"
START, END = "<!-- unique-conformance-matrix:start -->", "<!-- unique-conformance-matrix:end -->"
_MUST = re.compile(r"\bMUST\b")
_SCENARIO = re.compile(r"^\d+\. \*\*")


def _flat(text: str) -> str:
    return " ".join(text.split())


def spec_text() -> str:
    specs = Path(os.environ.get("OJS_SPECS_DIR") or ROOT.parent / "shared" / "specs")
    return (specs / "ojs-unique-jobs.md").read_text(encoding="utf-8")


def spec_requirement_lines() -> list[str]:
    """Every line of the spec that states a requirement: a MUST (but the RFC 2119 boilerplate and the heads
    of lists, whose items are the requirements), an item of a "… MUST:" list, a scenario of §14."""
    lines = spec_text().splitlines()
    found: list[str] = []
    in_list = in_scenarios = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("## "):
            in_scenarios = stripped.startswith("## 14.")
        if in_list and (stripped.startswith("- ") or not stripped):
            if stripped:
                found.append(stripped)
            continue
        in_list = False
        if stripped.endswith(("MUST:", "MUST additionally:")):
            in_list = True
        elif in_scenarios and _SCENARIO.match(stripped):
            found.append(stripped)
        elif _MUST.search(stripped) and "RFC 2119" not in stripped and not stripped.endswith("MUST be tested:"):
            found.append(stripped)
    return found


def conformance() -> tuple[
    dict[str, tuple[str, str]], dict[str, ast.FunctionDef], dict[str, list[str]], dict[str, str], dict[str, str]
]:
    tree = module_tree(CONFORMANCE)
    requirements = constant(tree, "REQUIREMENTS")
    tests = {name: node for name, node in functions(tree).items() if name.startswith("test_uniq_")}
    references, not_met, not_applicable = (constant(tree, name) for name in ("REFERENCES", "NOT_MET", "NOT_APPLICABLE"))
    assert isinstance(requirements, dict) and isinstance(references, dict)
    assert isinstance(not_met, dict) and isinstance(not_applicable, dict)
    return requirements, tests, references, not_met, not_applicable


def prefix_of(requirement: str) -> str:
    """``UNIQ-07`` -> ``test_uniq_07_``; ``UNIQ-T03`` -> ``test_uniq_t03_``."""
    return "test_uniq_" + requirement.removeprefix("UNIQ-").lower() + "_"


def render() -> str:
    """The matrix as a Markdown table (what ``docs/unique-jobs.md`` holds between the markers)."""
    requirements, tests, references, not_met, not_applicable = conformance()
    lines = ["| ID | Level | Requirement | Status | Proven by |", "|---|---|---|---|---|"]
    for requirement, (level, text) in requirements.items():
        own = [
            f"`{name}`" + (" (xfail)" if is_xfail(node) else "")
            for name, node in tests.items()
            if name.startswith(prefix_of(requirement))
        ]
        cited = [f"`{ref.split('/')[-1].replace('.py::', '::')}`" for ref in references.get(requirement, [])]
        if requirement in not_met:
            status = "**partly**: " + not_met[requirement]
        elif requirement in not_applicable:
            status = "n/a: " + not_applicable[requirement]
        else:
            status = "met"
        cell = text.replace("|", "\\|")
        lines.append(f"| {requirement} | {level} | {cell} | {status} | {', '.join(own + cited)} |")
    return "\n".join(lines)


def test_every_quoted_requirement_is_in_the_spec():
    requirements, *_ = conformance()
    spec = _flat(spec_text())
    for requirement, (_, text) in requirements.items():
        assert _flat(text) in spec, f"{requirement} is not the spec's words: {text!r}"


def test_every_requirement_of_the_spec_is_quoted():
    requirements, *_ = conformance()
    quotes = [_flat(text) for _, text in requirements.values()]
    lines = spec_requirement_lines()
    assert len(lines) == len(requirements) == 46, (len(lines), len(requirements))
    for line in lines:
        assert any(quote in _flat(line) for quote in quotes), f"not in REQUIREMENTS: {line!r}"


def test_every_requirement_has_a_test_a_reference_or_does_not_apply():
    requirements, tests, references, _, not_applicable = conformance()
    for requirement in requirements:
        own = [name for name in tests if name.startswith(prefix_of(requirement))]
        assert own or references.get(requirement) or requirement in not_applicable, (
            f"{requirement}: no test_uniq_…, no REFERENCES entry, not NOT_APPLICABLE"
        )


def test_no_test_or_reference_names_a_requirement_that_is_not_listed():
    requirements, tests, references, not_met, not_applicable = conformance()
    known = {prefix_of(r) for r in requirements}
    for name in tests:
        assert any(name.startswith(prefix) for prefix in known), f"{name} names no requirement"
    assert set(references) | set(not_met) | set(not_applicable) <= set(requirements)
    assert not set(not_met) & set(not_applicable)


def test_every_reference_is_an_existing_test():
    _, _, references, _, _ = conformance()
    for requirement, cited in references.items():
        for reference in cited:
            path, _, name = reference.partition("::")
            assert name in functions(module_tree(ROOT / path)), f"{requirement}: {reference} does not exist"


def test_a_failing_requirement_is_declared_not_met():
    """An xfail test of a requirement is only allowed when NOT_MET says what is missing, and the reverse."""
    _, tests, _, not_met, not_applicable = conformance()
    for name, node in tests.items():
        if is_xfail(node):
            assert any(name.startswith(prefix_of(r)) for r in not_met), f"{name} is xfail but its id is not in NOT_MET"
    for requirement, why in {**not_met, **not_applicable}.items():
        assert len(why) > 40, f"{requirement}: say what is missing and why"


def test_the_docs_matrix_is_the_generated_one():
    assert docs_matrix(DOCS, START, END) == render(), (
        f"the matrix in {DOCS.name} is stale: run python {Path(__file__).relative_to(ROOT)}"
    )


if __name__ == "__main__":
    write_docs_matrix(DOCS, START, END, render())
    sys.exit(0)
