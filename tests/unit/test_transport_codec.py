"""The ``ojs://`` transport's task message codec: registered by the framework adapter, never named by the core."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ojs_celery.protocol import CeleryCodec
from ojs_kombu.transport import settings
from ojs_kombu.transport.settings import Settings, register_codec

ROOT = Path(__file__).resolve().parents[2]


class _Codec:
    """A codec of a framework of our own (the protocol only: nothing is called)."""


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """An empty registry and no installed adapter for the test (the process's own come back after)."""
    empty: list[object] = []
    monkeypatch.setattr(settings, "_REGISTERED", empty)
    monkeypatch.setattr(settings, "CODEC_ENTRY_POINTS", "ojs_kombu.codecs.none-in-this-test")
    return empty


def test_without_an_option_a_registration_or_an_installed_adapter_there_is_no_codec(registry: list[object]) -> None:
    assert Settings.from_options({}).load_codec() is None


def test_an_installed_adapter_declares_its_codec_in_its_package_metadata() -> None:
    """``ojs_celery``'s entry point: a stock ``celery.Celery(broker="ojs://…")`` app, which never imports
    ``ojs_celery``, still gets Celery's codec (the transport names no framework)."""
    assert settings.installed_codec() == "ojs_celery.protocol:CeleryCodec"


def test_the_registered_codec_is_the_default_and_a_class_is_made_per_connection(registry: list[object]) -> None:
    register_codec(_Codec)
    first, second = Settings.from_options({}).load_codec(), Settings.from_options({}).load_codec()
    assert isinstance(first, _Codec) and isinstance(second, _Codec) and first is not second


def test_the_last_registration_wins_and_the_option_overrides_it(registry: list[object]) -> None:
    own = _Codec()
    register_codec("ojs_celery.protocol:CeleryCodec")
    assert isinstance(Settings.from_options({}).load_codec(), CeleryCodec)
    register_codec(own)
    assert Settings.from_options({}).load_codec() is own
    assert isinstance(Settings.from_options({"codec": CeleryCodec}).load_codec(), CeleryCodec)


def test_the_core_names_no_adapter_and_importing_ojs_celery_registers_its_codec() -> None:
    """In a fresh process: importing the core imports no adapter; ``import ojs_celery`` (what ``from
    ojs_celery import Celery`` does) registers Celery's codec, without importing Celery; without that
    import the installed adapter's entry point gives the same codec on first use."""
    script = (
        "import sys\n"
        "import ojs_kombu\n"
        "from ojs_kombu.transport.settings import Settings\n"
        "assert 'ojs_celery' not in sys.modules\n"
        "import ojs_celery\n"
        "codec = Settings.from_options({}).load_codec()\n"
        "assert type(codec).__name__ == 'CeleryCodec', codec\n"
        "assert 'celery' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    stock = (
        "import sys\n"
        "from ojs_kombu.transport.settings import Settings\n"
        "codec = Settings.from_options({}).load_codec()\n"
        "assert type(codec).__name__ == 'CeleryCodec', codec\n"
    )
    done = subprocess.run([sys.executable, "-c", stock], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
