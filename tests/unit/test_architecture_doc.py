"""docs/architecture.md names real modules, and its picture is the one tools/architecture.py draws."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools import architecture

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
# A code span that is a module path: `runtime/settle.py`, `ojs_dramatiq/consumer.py`, `ojs_kombu/errors.py`.
MODULE = re.compile(r"`((?:[a-z_]+/)+[a-z_]+\.py)`")


def module_paths() -> list[str]:
    return sorted(set(MODULE.findall(PAGE.read_text())))


def test_the_page_names_modules() -> None:
    assert len(module_paths()) > 40


@pytest.mark.parametrize("path", module_paths())
def test_each_module_the_page_names_exists(path: str) -> None:
    # Paths are written from the repository root (ojs_celery/..., tools/...) or from ojs_kombu/ (runtime/...).
    assert (ROOT / path).is_file() or (ROOT / "ojs_kombu" / path).is_file(), path


def test_the_picture_is_up_to_date() -> None:
    assert architecture.OUTPUT.read_text() == architecture.draw(), "run: python -m tools.architecture"
