"""``python -m tools.architecture``: write ``docs/img/architecture.svg``, the picture of ``docs/architecture.md``.

A hand-placed SVG rather than Mermaid: mkdocs-material loads Mermaid from a CDN when the page
is read, and the documentation must read offline.  Edit the boxes here, run the module and
commit both files.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from html import escape
from pathlib import Path

OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "architecture.svg"

WIDTH, HEIGHT = 1200, 640
LAYER = "#e8eef7"
SERVICE = "#eef6ea"
PART = "#fdf3e3"
AMQP = "#f3e9f5"
OUTSIDE = "#ffffff"


class Svg:
    """The drawing, element by element."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def text(
        self, x: float, y: float, value: str, *, size: int = 12, bold: bool = False, anchor: str = "middle"
    ) -> None:
        weight = ' font-weight="bold"' if bold else ""
        self.items.append(
            f'<text x="{x:g}" y="{y:g}" font-size="{size}"{weight} text-anchor="{anchor}">{escape(value)}</text>'
        )

    def box(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        title: str,
        note: str = "",
        *,
        fill: str = LAYER,
        dashed: bool = False,
        size: int = 12,
    ) -> None:
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        self.items.append(
            f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="4" fill="{fill}" stroke="#4a4a4a"{dash}/>'
        )
        if note:
            self.text(x + w / 2, y + h / 2 - 2, title, size=size, bold=True)
            self.text(x + w / 2, y + h / 2 + 12, note, size=10)
        elif h > 50:  # a tall box: its title on top, its lines written by the caller
            self.text(x + w / 2, y + 18, title, size=size, bold=True)
        else:
            self.text(x + w / 2, y + h / 2 + 4, title, size=size, bold=True)

    def arrow(self, x1: float, y1: float, x2: float, y2: float, *, dashed: bool = False) -> None:
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        self.items.append(
            f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="#4a4a4a"{dash} marker-end="url(#head)"/>'
        )

    def path(self, points: Sequence[tuple[float, float]]) -> None:
        """An arrow along ``points``."""
        d = " ".join(f"{x:g},{y:g}" for x, y in points)
        self.items.append(f'<polyline points="{d}" fill="none" stroke="#4a4a4a" marker-end="url(#head)"/>')

    def render(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
            f'font-family="Helvetica, Arial, sans-serif" fill="#1a1a1a">\n'
            "<title>ojs-kombu: the layers, the Client's services and the Worker's parts</title>\n"
            '<defs><marker id="head" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
            'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#4a4a4a"/></marker></defs>\n'
            f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.items) + "\n</svg>\n"


def layers(svg: Svg) -> None:
    """Left panel: the import-linter layers (pyproject.toml), top to bottom."""
    svg.text(20, 24, "Layers of ojs_kombu: imports only go down", size=14, bold=True, anchor="start")
    x, w, h, gap, y = 40, 340, 34, 8, 40
    svg.box(x, y, w / 2 - 4, h, "ojs_celery", "Celery adapter", fill=OUTSIDE)
    svg.box(x + w / 2 + 4, y, w / 2 - 4, h, "ojs_dramatiq", "Dramatiq adapter", fill=OUTSIDE)
    y += h + gap + 6
    rows: list[list[tuple[str, str]]] = [
        [("cli", "ojs-amqp command")],
        [("dashboard", "web UI"), ("spark", "DataFrames"), ("aio", "AsyncClient")],
        [("client", "producer API"), ("transport", "ojs:// for kombu")],
        [("runtime", "Worker, consumer, settler")],
        [("amqp", "every py-amqp internal")],
        [("observability", "metrics, tracing, logs")],
        [("policy", "decisions, no I/O")],
        [("wire", "job <-> AMQP message")],
        [("model", "Job, names, policies")],
        [("errors.py", "one exception hierarchy")],
    ]
    for row in rows:
        cell = (w - 8 * (len(row) - 1)) / len(row)
        for i, (name, note) in enumerate(row):
            svg.box(x + i * (cell + 8), y, cell, h, name, note)
        y += h + gap
    svg.arrow(24, 90, 24, y - gap)  # down: the direction imports may take
    svg.box(396, 88, 130, 100, "ojs_kombu.testing", "", fill=OUTSIDE, dashed=True, size=11)
    svg.text(461, 130, "RabbitMQ for tests", size=10)
    svg.text(461, 144, "(users' and ours);", size=10)
    svg.text(461, 158, "never imported", size=10)
    svg.text(461, 172, "by production", size=10)
    svg.box(396, 218, 130, 80, "tools/", "", fill=OUTSIDE, dashed=True)
    svg.text(461, 256, "repository only:", size=10)
    svg.text(461, 270, "Redis, Java, Chromium,", size=10)
    svg.text(461, 284, "schemas, this picture", size=10)


def client(svg: Svg) -> None:
    """Middle panel: the Client as a front over services sharing one Session."""
    svg.text(560, 24, "Client: a front over services (client/)", size=14, bold=True, anchor="start")
    svg.box(580, 40, 260, 40, "Client", "front.py: one-line delegates")
    services = [
        ("publishing.py", "enqueue(_many)", False),
        ("control.py", "cancel, pause, info", False),
        ("deadletters.py", "browse, replay, purge", False),
        ("observation.py", "events, workers, counts", False),
        ("runtime/cron.py", "CronRegistry", False),
        ("workflows", "to come", True),
    ]
    for i, (name, note, dashed) in enumerate(services):
        col, row = i % 2, i // 2
        bx, by = 580 + col * 134, 110 + row * 50
        svg.box(bx, by, 126, 40, name, note, fill=SERVICE, dashed=dashed)
    svg.arrow(710, 80, 710, 108)
    svg.box(580, 270, 260, 40, "Session", "session.py: pool, Reconnector, settings", fill=SERVICE)
    svg.arrow(710, 260, 710, 268)
    svg.arrow(620, 310, 620, 498)
    svg.box(660, 350, 180, 110, "transport/ (ojs://)", "", fill=LAYER)
    svg.text(750, 390, "kombu's channel for Celery:", size=10)
    svg.text(750, 404, "channel.py consumes,", size=10)
    svg.text(750, 418, "settlement.py hands each", size=10)
    svg.text(750, 432, "delivery to the same Settler", size=10)


def worker(svg: Svg) -> None:
    """Right panel: the Worker's parts, built by the runtime Assembly (shared with Dramatiq)."""
    svg.text(880, 24, "Worker: its parts (runtime/)", size=14, bold=True, anchor="start")
    svg.box(880, 40, 145, 40, "Worker", "worker.py: front")
    svg.box(1035, 40, 145, 40, "OjsBroker", "ojs_dramatiq", fill=OUTSIDE)
    svg.box(880, 100, 92, 40, "handlers.py", "registry", fill=PART, size=11)
    svg.box(978, 100, 92, 40, "dispatch.py", "inline or thread", fill=PART, size=11)
    svg.box(1076, 100, 92, 40, "processing.py", "runs one job", fill=PART, size=11)
    svg.arrow(952, 80, 952, 98)
    svg.box(880, 160, 288, 36, "Assembly", "assembly.py: built once, Worker and Dramatiq")
    svg.path([(1180, 80), (1190, 80), (1190, 178), (1170, 178)])
    svg.arrow(924, 140, 924, 158)
    parts = [
        ("Consumer", "consumer.py: I/O loop"),
        ("settle requests", "requests.py, wakeup.py"),
        ("subscriptions.py", "pause, resume, cancel"),
        ("Settler", "settle.py: every outcome"),
        ("ControlReader", "control.py"),
        ("Beacon", "presence.py"),
        ("Lifecycle", "lifecycle.py: events"),
        ("window.py", "counters, gauges"),
    ]
    for i, (name, note) in enumerate(parts):
        col, row = i % 2, i // 2
        svg.box(880 + col * 148, 216 + row * 50, 140, 40, name, note, fill=PART)
    svg.arrow(1024, 196, 1024, 214)
    svg.arrow(955, 416, 955, 498)


def amqp(svg: Svg) -> None:
    """Bottom band: what every connection goes through in amqp/."""
    svg.text(
        560,
        488,
        "amqp/: shared by the client, the consumer, presence, control readers, Dramatiq",
        size=12,
        bold=True,
        anchor="start",
    )
    svg.box(560, 500, 200, 44, "reconnect.py", "the one reconnect primitive", fill=AMQP)
    svg.box(770, 500, 200, 44, "outbox.py", "one write path per connection", fill=AMQP)
    svg.box(980, 500, 200, 44, "errors.py", "py-amqp errors -> OjsError", fill=AMQP)
    svg.box(560, 554, 200, 40, "publisher.py", "confirmed, pipelined", fill=AMQP)
    svg.box(770, 554, 200, 40, "topology.py", "declarations", fill=AMQP)
    svg.box(980, 554, 200, 40, "failover.py", "node rotation, back-off", fill=AMQP)
    svg.text(
        560, 622, "Arrows: builds or calls.  Dashed: outside the wheel, or not yet built.", size=10, anchor="start"
    )


def draw() -> str:
    """The SVG document."""
    svg = Svg()
    layers(svg)
    client(svg)
    worker(svg)
    amqp(svg)
    return svg.render()


def main(argv: Sequence[str] | None = None) -> int:
    """Write the picture (or, with ``--check``, fail when the committed one differs)."""
    parser = argparse.ArgumentParser(prog="python -m tools.architecture", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/img/architecture.svg is stale")
    args = parser.parse_args(argv)
    content = draw()
    if args.check:
        return 0 if OUTPUT.exists() and OUTPUT.read_text() == content else 1
    OUTPUT.write_text(content)
    print(OUTPUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
