"""Alternated pairs: the comparison every throughput benchmark in this folder prints.

Each round runs every side once, the order rotating from round to round (A B, B A, A B, ...),
so a drift in the machine's load falls on both sides alike.  The ratio of a round is
``ours / reference`` within that round; the figure to quote is the median of the rounds.
Each rate is printed with the machine's 1-minute load average at the time it was measured.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence


def load() -> float:
    """The 1-minute load average (``uptime``)."""
    return os.getloadavg()[0]


def alternate(
    sides: Sequence[tuple[str, Callable[[], float]]], rounds: int = 3, unit: str = "/s"
) -> dict[str, list[float]]:
    """Run each side once per round, rotating the order; print and return the rates per side.

    Parameters:
        sides: ``(label, run)`` pairs; ``run()`` measures once and returns a rate.
        rounds: how many rounds (3 alternated pairs for two sides).
        unit: printed after each rate.

    Returns:
        ``{label: [rate of round 1, rate of round 2, ...]}``.
    """
    rates: dict[str, list[float]] = {label: [] for label, _ in sides}
    width = max(len(label) for label, _ in sides)
    for index in range(rounds):
        shift = index % len(sides)
        for label, run in list(sides[shift:]) + list(sides[:shift]):
            rate = run()
            rates[label].append(rate)
            print(f"  round {index + 1}  {label:<{width}} {rate:>10,.0f}{unit}  (load {load():.2f})", flush=True)
    return rates


def report_ratio(rates: dict[str, list[float]], ours: str, reference: str, target: str = "") -> float:
    """Print the per-round ratios ``ours / reference``, their median and spread; return the median.

    Parameters:
        rates: what :func:`alternate` returned.
        ours, reference: two of its labels.
        target: printed after the median, e.g. ``"target >= 1.0x"``.

    Returns:
        The median of the per-round ratios.
    """
    ratios = [a / b for a, b in zip(rates[ours], rates[reference], strict=True)]
    median = statistics.median(ratios)
    each = " ".join(f"{r:.2f}" for r in ratios)
    suffix = f"  ({target})" if target else ""
    spread = f"{min(ratios):.2f}–{max(ratios):.2f}"
    print(f"  ratio {ours} / {reference}: median {median:.2f}x, spread {spread}  (rounds: {each}){suffix}", flush=True)
    return median
