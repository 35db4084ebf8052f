"""What the dashboard tests share: a served dashboard, and a page visit that checks the page and keeps a screenshot."""

from __future__ import annotations

from pathlib import Path

from selenium import webdriver


class Served:
    """A running dashboard: its base URL, and the broker password that must never be shown."""

    def __init__(self, base: str, password: str) -> None:
        self.base = base
        self.password = password


def visit(browser: webdriver.Chrome, served: Served, path: str, shots: Path, name: str) -> str:
    """Open ``path``, save a screenshot ``name``.png, check the password is not in the page; returns the page text."""
    browser.get(served.base + path)
    browser.save_screenshot(str(shots / f"{name}.png"))
    assert served.password not in browser.page_source
    text: str = browser.find_element("tag name", "body").text
    return text
