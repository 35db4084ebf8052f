"""The Worker's public API as a type checker sees it: ``handler`` keeps the decorated
function's signature (ParamSpec), ``on_conflict`` takes only its literal values."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mypy import api as mypy_api

SNIPPET = """
from ojs_kombu import Worker

worker = Worker(queues=["email"], on_conflict="use-existing")

@worker.handler("email.send")
def send(to: str, template: str, *, lang: str = "en") -> bool:
    return True

def notify(user_id: int) -> None: ...

registered = worker.handler("user.notify", notify)

reveal_type(send)
reveal_type(registered)
send("ada@example.com", 3)
Worker(on_conflict="replace")
"""


def test_handler_keeps_the_signature_and_on_conflict_is_a_literal(tmp_path: Path) -> None:
    module = tmp_path / "snippet.py"
    module.write_text(textwrap.dedent(SNIPPET))
    out, err, _ = mypy_api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", str(module)]
    )
    # "builtins.str" (older mypy) and "str" name the same type
    lines = [
        line.split(": ", 1)[1].replace("builtins.", "") for line in out.splitlines() if line.startswith(str(module))
    ]
    assert lines == [
        'note: Revealed type is "def (to: str, template: str, *, lang: str =) -> bool"',
        'note: Revealed type is "def (user_id: int)"',
        'error: Argument 2 to "send" has incompatible type "int"; expected "str"  [arg-type]',
        'error: Argument "on_conflict" to "Worker" has incompatible type "Literal[\'replace\']"; '
        "expected \"Literal['use-existing', 'raise']\"  [arg-type]",
    ], out + err
