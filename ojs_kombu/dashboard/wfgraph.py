"""A workflow drawn as server-rendered SVG (no JavaScript): its steps, how they follow each other, each one's state.

The shape is the definition's (:attr:`~ojs_kombu.model.workflow_info.WorkflowInfo.definition`): a chain
is a row (step after step, left to right), a group a column (its jobs run side by side), a batch its
jobs' column then its callbacks' column.  A group and a batch are framed and labelled, so nesting reads.
A column of more than :data:`GRID_AFTER` plain jobs is drawn as a grid of small cells (a batch of 200
still fits a screen).  Every job is a link (``<a href>``, reached with Tab) to its story page, with
its state written out and a ``<title>``: the colour (``.st-{state}``, the dashboard's colour-blind safe
palette, set by the page's CSS) is never the only cue.

Pure: :func:`graph` lays out and renders; :func:`step_states` folds in the jobs the workers run now.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

from ojs_kombu.model.job import Job
from ojs_kombu.model.workflow import Batch, Chain, Node, Path
from ojs_kombu.model.workflow_info import StepInfo, WorkflowInfo

#: A job's box, the gaps between boxes, a frame's padding and its label's height (pixels).
BOX_W, BOX_H, GAP_X, GAP_Y, PAD, LABEL_H = 168, 40, 44, 10, 8, 16
#: A column of more plain jobs than this is drawn as a grid of cells, :data:`GRID_COLUMNS` a row.
GRID_AFTER = 12
GRID_COLUMNS = 20
CELL, CELL_GAP = 14, 3
#: Characters of a job type shown in its box (the full type is in its ``<title>``).
TYPE_CHARS = 20
#: What each state reads as in a box (the step states of ojs-workflows.md §4.4; ``pending`` is enqueued).
STATE_LABELS = {
    "waiting": "waiting",
    "pending": "enqueued",
    "active": "running",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}

Point = tuple[float, float]

_ARROW = (
    '<defs><marker id="wf-arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7"'
    ' orient="auto"><path class="arrow" d="M0,0 L8,4 L0,8 z"/></marker></defs>'
)


@dataclass
class _Block:
    """A laid-out part: its size, what it draws (SVG fragments, drawn at an offset), where lines enter and leave."""

    width: float
    height: float
    draw: list[Callable[[float, float], str]] = field(default_factory=list)
    entries: list[Point] = field(default_factory=list)
    exits: list[Point] = field(default_factory=list)

    def at(self, dx: float, dy: float) -> _Block:
        """This block moved by ``(dx, dy)``."""
        return _Block(
            self.width,
            self.height,
            [_shifted(d, dx, dy) for d in self.draw],
            [(x + dx, y + dy) for x, y in self.entries],
            [(x + dx, y + dy) for x, y in self.exits],
        )


def _shifted(draw: Callable[[float, float], str], dx: float, dy: float) -> Callable[[float, float], str]:
    return lambda x, y: draw(x + dx, y + dy)


def step_states(info: WorkflowInfo, running: Collection[str]) -> dict[Path, str]:
    """Each step's state, ``active`` for an enqueued job a worker runs now.

    Parameters:
        info: the workflow's state.
        running: the ids of the jobs the workers run (their presence).

    Returns:
        The state by path.
    """
    return {s.path: "active" if s.state == "pending" and s.job_id in running else s.state for s in info.steps}


def graph(info: WorkflowInfo, states: Mapping[Path, str], *, link: Callable[[StepInfo, Job], str]) -> Markup:
    """The SVG of ``info``'s workflow.

    Parameters:
        info: the workflow's state, with its definition.
        states: each step's state (:func:`step_states`).
        link: the URL of a step's page.

    Returns:
        Safe markup; an empty string when ``info`` has no definition.
    """
    if info.definition is None:
        return Markup("")
    steps = {s.path: s for s in info.steps}
    block = _layout(info.definition, (), steps, states, link)
    width, height = block.width + 2 * PAD, block.height + 2 * PAD
    body = "".join(d(PAD, PAD) for d in block.draw)
    title = escape(f"{info.type} {info.name or info.id}: {info.state}")
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="wfgraph" width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}"'
        f' role="group" aria-label="{title}"><title>{title}</title>{_ARROW}{body}</svg>'
    )


def _layout(
    node: Node,
    path: Path,
    steps: Mapping[Path, StepInfo],
    states: Mapping[Path, str],
    link: Callable[[StepInfo, Job], str],
) -> _Block:
    if isinstance(node, Job):
        return _job(node, path, steps, states, link)
    members = [(path + (i,), member) for i, member in enumerate(node.members)]
    if isinstance(node, Chain):
        return _row([_layout(m, p, steps, states, link) for p, m in members])
    jobs = _column(members, steps, states, link)
    if isinstance(node, Batch) and node.callbacks:
        callbacks = [(path + (name,), job) for name, job in node.callbacks.items()]
        jobs = _row([jobs, _column(callbacks, steps, states, link, named=True)])
    label = f"{node.type} {node.name}" if node.name else node.type
    return _frame(jobs, label, node.type)


def _job(
    job: Job,
    path: Path,
    steps: Mapping[Path, StepInfo],
    states: Mapping[Path, str],
    link: Callable[[StepInfo, Job], str],
    *,
    named: bool = False,
) -> _Block:
    step = steps.get(path)
    state = states.get(path, step.state if step is not None else "waiting")
    where = ".".join(str(p) for p in path)
    kind = job.type if len(job.type) <= TYPE_CHARS else job.type[: TYPE_CHARS - 1] + "…"
    top = f"{path[-1]}: {kind}" if named else kind
    tip = _tip(job, where, state, step)

    def draw(x: float, y: float) -> str:
        href = link(step, job) if step is not None else ""
        return (
            f'<a href="{escape(href)}" data-path="{where}" data-state="{state}" aria-label="{tip}"><title>{tip}</title>'
            f'<rect class="box st-{state}" x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" height="{BOX_H}" rx="5"/>'
            f'<text class="type" x="{x + 8:.1f}" y="{y + 16:.1f}">{escape(top)}</text>'
            f'<text class="state" x="{x + 8:.1f}" y="{y + 32:.1f}">{STATE_LABELS.get(state, state)}</text></a>'
        )

    return _Block(BOX_W, BOX_H, [draw], [(0, BOX_H / 2)], [(BOX_W, BOX_H / 2)])


def _tip(job: Job, where: str, state: str, step: StepInfo | None) -> Markup:
    attempt = f", attempt {step.attempt}" if step is not None and step.attempt else ""
    return escape(f"step {where}: {job.type} ({job.queue}): {STATE_LABELS.get(state, state)}{attempt}")


def _column(
    members: Sequence[tuple[Path, Node]],
    steps: Mapping[Path, StepInfo],
    states: Mapping[Path, str],
    link: Callable[[StepInfo, Job], str],
    *,
    named: bool = False,
) -> _Block:
    if len(members) > GRID_AFTER and all(isinstance(m, Job) for _, m in members):
        return _grid(members, steps, states, link)
    blocks = [
        _job(m, p, steps, states, link, named=named) if isinstance(m, Job) else _layout(m, p, steps, states, link)
        for p, m in members
    ]
    width = max(b.width for b in blocks)
    out = _Block(width, 0)
    for block in blocks:
        placed = block.at(0, out.height + (GAP_Y if out.height else 0))
        out.height += block.height + (GAP_Y if out.height else 0)
        out.draw += placed.draw
        out.entries += placed.entries
        out.exits += [(width, y) for _, y in placed.exits]
        out.draw += [_line(e, (width, e[1])) for e in placed.exits if e[0] < width]
    return out


def _grid(
    members: Sequence[tuple[Path, Node]],
    steps: Mapping[Path, StepInfo],
    states: Mapping[Path, str],
    link: Callable[[StepInfo, Job], str],
) -> _Block:
    columns = min(GRID_COLUMNS, len(members))
    rows = -(-len(members) // columns)
    pitch = CELL + CELL_GAP
    width, height = columns * pitch - CELL_GAP, rows * pitch - CELL_GAP

    def cell(i: int, path: Path, job: Job) -> Callable[[float, float], str]:
        step = steps.get(path)
        state = states.get(path, step.state if step is not None else "waiting")
        tip = _tip(job, ".".join(str(p) for p in path), state, step)
        href = link(step, job) if step is not None else ""
        dx, dy = (i % columns) * pitch, (i // columns) * pitch
        return lambda x, y: (
            f'<a href="{escape(href)}" data-path="{".".join(str(p) for p in path)}" data-state="{state}"'
            f' aria-label="{tip}"><title>{tip}</title><rect class="cell st-{state}" x="{x + dx:.1f}"'
            f' y="{y + dy:.1f}" width="{CELL}" height="{CELL}" rx="2"/></a>'
        )

    draw = [cell(i, p, m) for i, (p, m) in enumerate(members) if isinstance(m, Job)]
    return _Block(width, height, draw, [(0, height / 2)], [(width, height / 2)])


def _row(blocks: Sequence[_Block]) -> _Block:
    height = max(b.height for b in blocks)
    out = _Block(0, height)
    previous: _Block | None = None
    for block in blocks:
        placed = block.at(out.width + (GAP_X if previous else 0), (height - block.height) / 2)
        if previous is not None:
            out.draw += _joints(previous.exits, placed.entries)
        out.width += block.width + (GAP_X if previous else 0)
        out.draw += placed.draw
        previous = placed
        if not out.entries:
            out.entries = placed.entries
    out.exits = previous.exits if previous is not None else []
    return out


def _joints(exits: Sequence[Point], entries: Sequence[Point]) -> list[Callable[[float, float], str]]:
    """Lines from each exit to each entry; through one junction when both are many (n + m lines, not n × m)."""
    if len(exits) > 1 and len(entries) > 1:
        hub = ((exits[0][0] + entries[0][0]) / 2, (exits[0][1] + exits[-1][1]) / 2)
        return [_line(e, hub) for e in exits] + [_line(hub, e, arrow=True) for e in entries] + [_dot(hub)]
    return [_line(a, b, arrow=True) for a in exits for b in entries]


def _frame(inner: _Block, label: str, kind: str) -> _Block:
    placed = inner.at(PAD, PAD + LABEL_H)
    width, height = inner.width + 2 * PAD, inner.height + 2 * PAD + LABEL_H

    def draw(x: float, y: float) -> str:
        return (
            f'<rect class="frame frame-{kind}" x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height:.1f}" rx="7"/>'
            f'<text class="frame-label" x="{x + PAD:.1f}" y="{y + 13:.1f}">{escape(label)}</text>'
        )

    entry, exit_ = (0.0, height / 2), (width, height / 2)
    draw_in = [_line(entry, e) for e in placed.entries]
    draw_out = [_line(e, exit_) for e in placed.exits]
    return _Block(width, height, [draw, *placed.draw, *draw_in, *draw_out], [entry], [exit_])


def _line(a: Point, b: Point, *, arrow: bool = False) -> Callable[[float, float], str]:
    marker = ' marker-end="url(#wf-arrow)"' if arrow else ""
    return lambda x, y: (
        f'<line class="edge" x1="{a[0] + x:.1f}" y1="{a[1] + y:.1f}" x2="{b[0] + x:.1f}" y2="{b[1] + y:.1f}"{marker}/>'
    )


def _dot(at: Point) -> Callable[[float, float], str]:
    return lambda x, y: f'<circle class="hub" cx="{at[0] + x:.1f}" cy="{at[1] + y:.1f}" r="3"/>'


__all__ = ["STATE_LABELS", "graph", "step_states"]
