"""Check issue 28's size rule: no module over 700 lines, no class over 500, no function over 80, Client 400.

Run from the repository's root: ``python -m tools.sizes``.  It reports every offender in
``ojs_kombu`` (its ``testing/`` aside), ``ojs_celery`` and ``ojs_dramatiq`` and exits 1 when there
is one, 0 otherwise.  A module counts its physical lines; a class or function counts its *lines of
code*: the lines of its body that hold code, so blank lines, comment-only lines and docstrings
(its own and those of nested classes and functions) are left out.  A front class
(:data:`FRONT_CLASSES`: ``Client``) counts its physical lines, docstrings included: a reader
reads them, and a front whose delegates are one line each is read through them.  These numbers are a symptom, not
the goal: split where a reader would, by responsibility, never by line count.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 500
MAX_FUNCTION_LINES = 80

#: Front classes, by module and name, and the most physical lines (docstrings included) each may have.
FRONT_CLASSES = {(Path("ojs_kombu") / "client" / "front.py", "Client"): 400}

PACKAGES = ("ojs_kombu", "ojs_celery", "ojs_dramatiq")
EXCLUDED = (Path("ojs_kombu") / "testing",)

_REPO_ROOT = Path(__file__).resolve().parents[1]

_Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@dataclass(frozen=True, slots=True)
class Offence:
    """One module, class or function over its limit.

    Parameters:
        path: the module, relative to the repository's root.
        line: where the definition starts (1 for a module).
        kind: ``"module"``, ``"class"``, ``"front class"`` or ``"function"``.
        name: the qualified name (empty for a module).
        size: its lines (a module, a front class) or lines of code (a class or function).
        limit: the most it may have.
    """

    path: Path
    line: int
    kind: str
    name: str
    size: int
    limit: int

    def __str__(self) -> str:
        what = f"{self.kind} {self.name}" if self.name else self.kind
        return f"{self.path}:{self.line}: {what}: {self.size} lines (limit {self.limit})"


def modules(root: Path = _REPO_ROOT) -> Iterator[Path]:
    """Yield the checked modules, sorted.

    Parameters:
        root: the repository's root.

    Returns:
        An iterator of absolute paths.
    """
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if not any(relative.is_relative_to(excluded) for excluded in EXCLUDED):
                yield path


def _code_lines(source: str, tree: ast.Module) -> set[int]:
    """The line numbers that hold code: not blank, not only a comment, not part of a docstring."""
    lines: set[int] = set()
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            lines.update(range(token.start[0], token.end[0] + 1))
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.difference_update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def _definitions(body: Sequence[ast.stmt], prefix: str = "") -> Iterator[tuple[str, _Definition]]:
    """Every class and function under ``body``, nested ones included, with its qualified name."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{node.name}"
            yield name, node
            yield from _definitions(node.body, f"{name}.")
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
            yield from _definitions(node.body, prefix)
            yield from _definitions(getattr(node, "orelse", []), prefix)


def check_module(path: Path, root: Path = _REPO_ROOT) -> list[Offence]:
    """The offences of one module.

    Parameters:
        path: the module.
        root: the repository's root (offences name paths relative to it).

    Returns:
        Its offences, in source order.
    """
    source = path.read_text(encoding="utf-8")
    relative = path.relative_to(root)
    offences: list[Offence] = []
    total = len(source.splitlines())
    if total > MAX_MODULE_LINES:
        offences.append(Offence(relative, 1, "module", "", total, MAX_MODULE_LINES))
    tree = ast.parse(source, filename=str(path))
    code = _code_lines(source, tree)
    for name, node in _definitions(tree.body):
        start = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
        size = sum(1 for line in range(start, (node.end_lineno or node.lineno) + 1) if line in code)
        kind, limit = ("class", MAX_CLASS_LINES) if isinstance(node, ast.ClassDef) else ("function", MAX_FUNCTION_LINES)
        if size > limit:
            offences.append(Offence(relative, node.lineno, kind, name, size, limit))
        front_limit = FRONT_CLASSES.get((relative, name))
        if front_limit is not None:
            lines = (node.end_lineno or node.lineno) - start + 1
            if lines > front_limit:
                offences.append(Offence(relative, node.lineno, "front class", name, lines, front_limit))
    return offences


def main(argv: Sequence[str] | None = None) -> int:
    """Report every offender; the exit status is 1 when there is one.

    Parameters:
        argv: the command line's arguments (``sys.argv[1:]`` when ``None``).

    Returns:
        The exit status.
    """
    parser = argparse.ArgumentParser(prog="python -m tools.sizes", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=_REPO_ROOT, help="the repository's root")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    offences = [offence for path in modules(root) for offence in check_module(path, root)]
    for offence in offences:
        print(offence)
    sys.stdout.flush()
    print(f"{len(offences)} over the size limits" if offences else "sizes: ok", file=sys.stderr)
    return 1 if offences else 0


if __name__ == "__main__":
    sys.exit(main())
