"""What the conformance matrix tests (``tests/unit/test_*_conformance_matrix.py``) share: reading a conformance
module's tests and constants without importing it, and the matrix between two markers of a docs page."""

from __future__ import annotations

import ast
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
