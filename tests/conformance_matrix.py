"""What the conformance matrix tests (``tests/unit/test_*_conformance_matrix.py``) share: reading a conformance
module's tests and constants without importing it, and the matrix between two markers of a docs page."""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path


def module_tree(path: Path) -> ast.Module:
    """The parsed module at ``path``."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """The module's top-level functions by name."""
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def constant(tree: ast.Module, name: str) -> object:
    """The literal value of the module's annotated constant ``name``."""
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            assert node.value is not None
            return ast.literal_eval(node.value)
    raise AssertionError(f"the module has no {name}")


def is_xfail(node: ast.FunctionDef) -> bool:
    """Whether the test is marked xfail."""
    return any("xfail" in ast.unparse(decorator) for decorator in node.decorator_list)


def docs_matrix(docs: Path, start: str, end: str) -> str:
    """The text between the markers ``start`` and ``end`` of ``docs``, stripped."""
    text = docs.read_text(encoding="utf-8")
    assert start in text and end in text, f"{docs.name} lacks the matrix markers"
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def write_docs_matrix(docs: Path, start: str, end: str, matrix: str) -> None:
    """Replace what is between the markers of ``docs`` with ``matrix``."""
    text = docs.read_text(encoding="utf-8")
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    docs.write_text(f"{head}{start}\n{matrix}\n{end}{tail}", encoding="utf-8")


def must_lines(spec: str) -> list[str]:
    """Every line of ``spec`` that says MUST, but the RFC 2119 / BCP 14 boilerplate and the lines that only
    talk about MUSTs ("Every MUST requirement …", "Rationale for MUST-level …"), stripped."""
    found = []
    for line in spec.splitlines():
        stripped = line.strip()
        if " MUST" not in f" {stripped}" or "RFC 2119" in stripped or "BCP 14" in stripped:
            continue
        if stripped.startswith(("Every MUST requirement", "**Rationale for MUST-level")):
            continue
        found.append(stripped)
    return found


def _flat(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class MustMatrix:
    """The checks of a conformance module whose ``REQUIREMENTS`` quote every MUST line of one spec
    (:func:`must_lines`): id -> (section, words), plus ``REFERENCES``, ``NOT_MET`` and ``NOT_APPLICABLE``."""

    root: Path
    spec: str  # its file name in ``<root>/../shared/specs`` or ``$OJS_SPECS_DIR``
    module: Path
    docs: Path
    marker: str
    id_prefix: str  # "WF-"
    test_prefix: str  # "test_wf_"
    count: int  # the spec's MUST lines

    @property
    def start(self) -> str:
        return f"<!-- {self.marker}:start -->"

    @property
    def end(self) -> str:
        return f"<!-- {self.marker}:end -->"

    def spec_text(self) -> str:
        specs = Path(os.environ.get("OJS_SPECS_DIR") or self.root.parent / "shared" / "specs")
        return (specs / self.spec).read_text(encoding="utf-8")

    def read(self) -> tuple[dict, dict[str, ast.FunctionDef], dict, dict, dict]:
        tree = module_tree(self.module)
        requirements, references, not_met, not_applicable = (
            constant(tree, name) for name in ("REQUIREMENTS", "REFERENCES", "NOT_MET", "NOT_APPLICABLE")
        )
        assert isinstance(requirements, dict) and isinstance(references, dict)
        assert isinstance(not_met, dict) and isinstance(not_applicable, dict)
        tests = {name: node for name, node in functions(tree).items() if name.startswith(self.test_prefix)}
        return requirements, tests, references, not_met, not_applicable

    def prefix_of(self, requirement: str) -> str:
        """``WF-07`` -> ``test_wf_07_``."""
        return self.test_prefix + requirement.removeprefix(self.id_prefix).lower() + "_"

    def own_tests(self, requirement: str, tests: dict[str, ast.FunctionDef]) -> list[str]:
        return [name for name in tests if name.startswith(self.prefix_of(requirement))]

    def render(self) -> str:
        """The matrix as a Markdown table (what the docs page holds between the markers)."""
        requirements, tests, references, not_met, not_applicable = self.read()
        lines = ["| ID | § | Requirement | Status | Proven by |", "|---|---|---|---|---|"]
        for requirement, (section, text) in requirements.items():
            own = [
                f"`{name}`" + (" (xfail)" if is_xfail(tests[name]) else "")
                for name in self.own_tests(requirement, tests)
            ]
            cited = [f"`{ref.split('/')[-1].replace('.py::', '::')}`" for ref in references.get(requirement, [])]
            if requirement in not_met:
                status = "**partly**: " + not_met[requirement]
            elif requirement in not_applicable:
                status = "n/a: " + not_applicable[requirement]
            else:
                status = "met"
            # the spec's links to its own sections are no anchors of the docs page: their text only
            cell = re.sub(r"\[([^\]]+)\]\(#[^)]*\)", r"\1", text).replace("|", "\\|")
            lines.append(f"| {requirement} | {section} | {cell} | {status} | {', '.join(own + cited)} |")
        return "\n".join(lines)

    def check_quotes_are_the_specs(self) -> None:
        requirements, *_ = self.read()
        spec = _flat(self.spec_text())
        for requirement, (_, text) in requirements.items():
            assert _flat(text) in spec, f"{requirement} is not the spec's words: {text!r}"

    def check_every_must_line_is_quoted(self) -> None:
        requirements, *_ = self.read()
        lines = must_lines(self.spec_text())
        assert len(lines) == len(requirements) == self.count, (len(lines), len(requirements), self.count)
        quotes = [_flat(text) for _, text in requirements.values()]
        for line, quote in zip(lines, quotes, strict=True):
            assert quote in _flat(line), f"not quoted in the spec's order: {line!r}"

    def check_every_requirement_is_covered(self) -> None:
        requirements, tests, references, _, not_applicable = self.read()
        for requirement in requirements:
            assert self.own_tests(requirement, tests) or references.get(requirement) or requirement in not_applicable, (
                f"{requirement}: no {self.test_prefix}…, no REFERENCES entry, not NOT_APPLICABLE"
            )

    def check_no_unknown_ids(self) -> None:
        requirements, tests, references, not_met, not_applicable = self.read()
        known = {self.prefix_of(r) for r in requirements}
        for name in tests:
            assert any(name.startswith(prefix) for prefix in known), f"{name} names no requirement"
        assert set(references) | set(not_met) | set(not_applicable) <= set(requirements)
        assert not set(not_met) & set(not_applicable)

    def check_references_exist(self) -> None:
        _, _, references, _, _ = self.read()
        for requirement, cited in references.items():
            for reference in cited:
                path, _, name = reference.partition("::")
                assert name in functions(module_tree(self.root / path)), f"{requirement}: {reference} does not exist"

    def check_xfails_are_declared(self) -> None:
        """An xfail test is only allowed when NOT_MET says what is missing; every reason says something."""
        _, tests, _, not_met, not_applicable = self.read()
        for name, node in tests.items():
            if is_xfail(node):
                assert any(name.startswith(self.prefix_of(r)) for r in not_met), (
                    f"{name} is xfail, its id not in NOT_MET"
                )
                assert "strict=True" in ast.unparse(node.decorator_list), f"{name}: the xfail must be strict"
        for requirement, why in {**not_met, **not_applicable}.items():
            assert len(why) > 40, f"{requirement}: say what is missing and why"

    def check_docs(self) -> None:
        assert docs_matrix(self.docs, self.start, self.end) == self.render(), (
            f"the matrix in {self.docs.name} is stale: run the matrix test module as a script"
        )
