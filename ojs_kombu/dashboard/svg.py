"""Server-rendered SVG charts (no JavaScript): the depth sparkline of the overview, the stacked bars
of the jobs per minute / hour."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from markupsafe import Markup, escape

from ojs_kombu.model.timefmt import format_timestamp


def sparkline(values: Sequence[int], *, width: int = 120, height: int = 24) -> Markup:
    """An inline SVG polyline of ``values`` scaled to the box; an empty SVG when there are none.

    Parameters:
        values: the samples, oldest first.
        width, height: the box in pixels.

    Returns:
        Safe markup to embed in a page.
    """
    if not values:
        return Markup(f'<svg class="spark" width="{width}" height="{height}"></svg>')
    top = max(values) or 1
    step = width / max(len(values) - 1, 1)
    points = " ".join(f"{i * step:.1f},{height - 1 - (v / top) * (height - 2):.1f}" for i, v in enumerate(values))
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
        f"<title>depth, max {max(values)}</title>"
        f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{points}"/></svg>'
    )


def bars(
    starts: Sequence[datetime],
    stacks: Sequence[tuple[str, str, Sequence[int]]],
    *,
    title: str,
    width: int = 720,
    height: int = 120,
) -> Markup:
    """A stacked bar chart: one bar per bucket, one coloured segment per series (colours set by the
    page's CSS on ``.s-{key}``: the dashboard's colour-blind safe palette, light and dark).

    Each bar is a ``<g class="bar">`` with ``data-start`` (the bucket's RFC 3339 start) and a
    ``data-{key}`` count per series, and a ``<title>`` a pointer shows; the numbers are also in the
    table the page puts beside the chart (which a screen reader reads).

    Parameters:
        starts: each bucket's start, oldest first.
        stacks: ``(key, label, counts)`` per series, bottom first; each ``counts`` as long as ``starts``.
        title: the chart's accessible name.
        width, height: the box in pixels (a bar is ``width / len(starts)`` wide).

    Returns:
        Safe markup.
    """
    top = max((sum(s[2][i] for s in stacks) for i in range(len(starts))), default=0)
    scale = (height - 14) / top if top else 0.0
    step = width / max(len(starts), 1)
    parts = [
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img"'
        f' aria-label="{escape(title)}"><title>{escape(title)}</title>',
        f'<line class="axis" x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}"/>',
        f'<text class="peak" x="2" y="10">{top}</text>',
    ]
    for i, start in enumerate(starts):
        values = [(key, label, counts[i]) for key, label, counts in stacks]
        stamp = format_timestamp(start)
        data = " ".join(f'data-{key}="{n}"' for key, _, n in values)
        tip = f"{stamp}: " + ", ".join(f"{label} {n}" for _, label, n in values)
        parts.append(f'<g class="bar" data-start="{stamp}" {data}><title>{escape(tip)}</title>')
        parts.append(f'<rect class="hit" x="{i * step:.1f}" y="0" width="{step:.1f}" height="{height}"/>')
        y = height - 1.0
        for key, _, n in values:
            if n:
                h = n * scale
                y -= h
                parts.append(
                    f'<rect class="s-{key}" x="{i * step + 0.5:.1f}" y="{y:.1f}" width="{max(step - 1, 1):.1f}" height="{h:.1f}"/>'
                )
        parts.append("</g>")
    parts.append("</svg>")
    return Markup("".join(parts))
