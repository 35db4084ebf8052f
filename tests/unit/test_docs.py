"""The documentation holds together without building it: links resolve, the nav names real pages,
and the README's quick start commands are the Makefile's.

`make docs` (`mkdocs build --strict`) checks the rest, including the API reference.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    """The relative link targets of a Markdown text, outside code blocks and code spans.

    Parameters:
        text: Markdown source.

    Returns:
        Each target without its ``#fragment``, in order; links to URLs, to e-mail addresses and
        to a fragment of the same page are left out.
    """
    prose = CODE.sub("", FENCE.sub("", text))
    targets = []
    for target in LINK.findall(prose):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def nav_pages(node: object) -> list[str]:
    """Every page path named in a mkdocs ``nav`` (nested lists of ``{title: path-or-list}``)."""
    if isinstance(node, str):
        return [] if re.match(r"^[a-z]+://", node) else [node]
    if isinstance(node, list):
        return [page for item in node for page in nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in nav_pages(value)]
    return []


def load_mkdocs() -> dict[str, object]:
    # mkdocs.yml may use !!python/name tags (pymdownx options); none of its values matter here.
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
    assert isinstance(config, dict)
    return config


def test_the_link_finder_sees_links_but_not_code() -> None:
    text = "[a](docs/x.md#y) ![i](img.png) [u](https://e.org) [f](#z)\n`[c](no.md)`\n```\n[d](no2.md)\n```\n"
    assert relative_links(text) == ["docs/x.md", "img.png"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file(path: Path) -> None:
    broken = [
        target
        for target in relative_links(path.read_text(encoding="utf-8"))
        if target and not (path.parent / target).resolve().exists()
    ]
    assert broken == [], f"{path.relative_to(ROOT)} links to missing files"


def test_every_page_of_the_nav_exists_and_every_page_is_in_the_nav() -> None:
    config = load_mkdocs()
    pages = nav_pages(config["nav"])
    assert pages, "mkdocs.yml has no nav"
    assert [page for page in pages if not (DOCS / page).is_file()] == []
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert on_disk - set(pages) == set(), "pages missing from the nav"


def test_readme_quick_start_commands_are_make_targets() -> None:
    readme = README.read_text(encoding="utf-8")
    commands = re.findall(r"^make ([a-z-]+)", readme, re.MULTILINE)
    assert {"demo", "test"} <= set(commands)
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.MULTILINE))
    assert set(commands) <= targets, "the README names make targets the Makefile lacks"


def test_make_test_builds_the_docs_strictly() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    test_rule = re.search(r"^test:(.*)$", makefile, re.MULTILINE)
    assert test_rule and "docs" in test_rule.group(1).split()
    docs_rule = re.search(r"^docs:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert docs_rule and "mkdocs build --strict" in docs_rule.group(1)
    # mkdocs -q raises the log level above WARNING, and --strict counts only the warnings it logs:
    # a broken link then builds "successfully" (seen with mkdocs 1.6.1).
    assert not re.search(r"mkdocs build[^\n]* (-q|--quiet)\b", docs_rule.group(1))
