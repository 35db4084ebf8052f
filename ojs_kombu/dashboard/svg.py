"""Server-rendered SVG charts (no JavaScript): the depth sparkline of the overview."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup


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
