"""Pictures of memory: a program's timeline and an arena plan.

- :func:`plot_timeline`: live bytes over the op sequence (run order) of one
  or more :class:`memopt.analysis.Analysis` (e.g. before and after
  ``memory_optimize``), each peak marked and the largest holders at the
  peak named.
- :func:`plot_arena`: an offset plan as rectangles, time (op positions)
  across and bytes up, with the peak of live bytes (the lower bound) drawn.

matplotlib is imported when a picture is drawn, with the non-interactive
Agg backend; nothing else in memopt needs it.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

__all__ = ["plot_timeline", "plot_arena"]

_MIB = float(1 << 20)
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise RuntimeError("plotting needs matplotlib: pip install 'memopt[plot]'") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _unit(max_bytes: float):
    for name, scale in (("GiB", float(1 << 30)), ("MiB", _MIB), ("KiB", 1024.0)):
        if max_bytes >= scale:
            return name, scale
    return "B", 1.0


def plot_timeline(analyses: Sequence, path: str, *, labels: Sequence[str] = (),
                  batch_size: Optional[int] = None, title: str = "", top: int = 5) -> str:
    """Draw live bytes per op for each analysis into ``path`` (PNG, SVG...).

    The x axis is the op position in the first analysis's run order (the
    positions of its :meth:`Analysis.timeline`, ``held_at`` and
    ``peak_position``); the others (the program after rewrites) are drawn
    on it, each op at the position of the same op in the first
    (:mod:`memopt.alignment`: the ops a rewrite adds, release, record and
    recomputed ops, fold into the position of the op before them, the
    highest of their live bytes drawn), so before and after read against
    each other and a peak on one op is at one x.  It starts
    at the first op that is an instruction of the executor
    (:meth:`Analysis.setup_ops` of the first analysis): the
    declarations before it (parameters, feeds) hold no step memory, and a
    training program has hundreds of them.  The axis label says how many
    were left out.  Each curve's peak is marked with a triangle and named in
    the legend (bytes, op position, op type), so no text is drawn over the
    curves.

    Parameters
    ----------
    analyses : :class:`~memopt.analysis.Analysis` objects, drawn in order
        (the first is the reference, e.g. "before").
    labels : a legend label per analysis.
    batch_size : the batch size to draw at (default: each analysis's own).
    title : the figure's title.
    top : how many of the largest holders at the last analysis's peak to name.

    Returns the path written.
    """
    from .alignment import align

    plt = _pyplot()
    lines = [a.timeline(batch_size) for a in analyses]
    peak_all = max((max(line) for line in lines if line), default=0)
    unit, scale = _unit(peak_all)
    first = analyses[0].setup_ops() if analyses else 0
    fig, (ax, side) = plt.subplots(1, 2, figsize=(12, 5.2),
                                   gridspec_kw={"width_ratios": [3.2, 1]})
    for k, (analysis, line) in enumerate(zip(analyses, lines)):
        color = _COLORS[k % len(_COLORS)]
        label = labels[k] if k < len(labels) else f"program {k + 1}"
        if not line:
            continue
        peak_j = analysis.peak_position(batch_size)
        if k == 0:
            ys, pos = [v / scale for v in line], peak_j
        else:  # drawn on the first analysis's op positions (memopt.alignment)
            aligned = align(analyses[0], analysis, batch_size)
            ys, pos = [line[j] / scale for j in aligned.shown], aligned.xs[peak_j]
        if k == 0:  # the reference: a filled area the others are drawn over
            ax.fill_between(range(len(ys)), ys, step="post", color=color, alpha=0.18)
        ax.step(range(len(ys)), ys, where="post", color=color, linewidth=1.5,
                linestyle="-" if k == 0 else "--",
                label=f"{label}: peak {line[peak_j] / scale:.1f} {unit} at op {pos} "
                      f"({analysis.op_types[peak_j]})")
        ax.plot([pos], [ys[pos]], marker="v", color=color, markersize=9,
                markeredgecolor="white", linestyle="none", clip_on=False)
    persistable = analyses[0].persistable_bytes(batch_size) if analyses else 0
    b = analyses[0].batch_for(batch_size) if analyses else 1
    horizon = len(lines[0]) if lines and lines[0] else 1
    margin = max(1.0, 0.015 * (horizon - first))  # room for a peak marker at the last op
    ax.set_xlim(first - margin, horizon - 1 + margin)
    ax.set_xlabel("op position (run order)" + (
        f"; ops 0-{first - 1} declare parameters and feeds (no step memory): not drawn"
        if first else ""), fontsize=9)
    ax.set_ylabel(f"live bytes of the step ({unit})")
    ax.set_title(title or f"memory over one step, batch {b} "
                 f"(+ {persistable / scale:.1f} {unit} persistable)", fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0, top=peak_all / scale * 1.3 if peak_all else 1)
    ax.legend(loc="upper left", fontsize=8)
    # the largest holders at the peak of the last analysis, as a bar list
    last = analyses[-1] if analyses else None
    held = last.held_at(None, batch_size)[:top] if last else []
    names = [f"{_bar_name(h)}\n{h.category}, {h.op.split('.')[-1]}" for h in held][::-1]
    sizes = [h.bytes(b) / scale for h in held][::-1]
    side.barh(range(len(sizes)), sizes, color=_COLORS[(len(analyses) - 1) % len(_COLORS)],
              alpha=0.8)
    for y, v in enumerate(sizes):
        side.text(v, y, f" {v:.1f}", va="center", fontsize=7)
    side.set_yticks(range(len(names)))
    side.set_yticklabels(names, fontsize=7)
    side.set_xlabel(unit)
    side.set_xlim(0, max(sizes, default=1) * 1.25)
    side.set_title(f"largest {len(held)} at the peak"
                   + (f"\n{labels[-1]}" if labels else ""), fontsize=10)
    side.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


#: characters of a holder's name a bar label shows (longer ones are cut
#: short: the figure clipped "workspace of pd_op.rnn_grad at op 28 (rnn_grad)")
BAR_NAME_CHARS = 24


#: A PIR value's label (:func:`memopt.paddle.pir.program.label_values`):
#: ``pd_op.matmul_grad(...).y_grad at op 59, model.py:12 (%66)``.
_MADE_AT = re.compile(r"^(?P<op>[\w.]+)(?:\(\.\.\.\)\.(?P<slot>\w+))? at [^,(]+(?:\([^)]*\))?"
                      r"(?:, (?P<source>[^,]+:\d+))? \((?P<value>%\w+)\)$")
#: A label from a ``name=`` given in Python: ``'my_sum' (%7)``.
_USER_NAMED = re.compile(r"^'(?P<name>[^']+)' \(%\w+\)$")


def _bar_name(holder) -> str:
    """A holder's name short enough for the bar list, as the user knows it:
    the ``name=`` given in Python (``'my_sum'``), else the line of Python
    that made it (``model.py:12``, with the op's output slot when it has
    several: ``model.py:12 .y_grad``), else the op and its ``%N``; a
    kernel's scratch memory as ``workspace`` (its op is on the next line).
    Cut to :data:`BAR_NAME_CHARS`."""
    if holder.category == "workspace" and holder.name.startswith("workspace of "):
        return "workspace"
    name = holder.label or holder.name
    user = _USER_NAMED.match(name)
    made = _MADE_AT.match(name)
    if user:
        name = f"'{user.group('name')}'"
    elif made:
        slot = f" .{made.group('slot')}" if made.group("slot") else ""
        where = made.group("source") or f"{made.group('op').split('.')[-1]} {made.group('value')}"
        name = where + slot
    return name if len(name) <= BAR_NAME_CHARS else name[:BAR_NAME_CHARS - 3] + "..."


def plot_arena(buffers: Sequence, offsets: dict, path: str, *, batch_size: Optional[int] = None,
               title: str = "", lower_bound: Optional[int] = None) -> str:
    """Draw an offset plan: each buffer a rectangle spanning its live interval
    ``[lower, upper)`` across and ``[offset, offset + size)`` up.

    ``offsets`` maps buffer id -> offset in bytes.  The arena's height and,
    when given, ``lower_bound`` (the peak of live bytes) are drawn as lines.
    Returns the path written.
    """
    plt = _pyplot()
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    from .problems import size_at

    sizes = [size_at(buf.size, batch_size) for buf in buffers]
    height = max((offsets[buf.id] + s for buf, s in zip(buffers, sizes)), default=0)
    unit, scale = _unit(max(height, lower_bound or 0))
    horizon = max((buf.upper for buf in buffers), default=1)
    fig, ax = plt.subplots(figsize=(11, 5.5))
    cmap = plt.get_cmap("tab20")
    patches, colors = [], []
    for k, (buf, s) in enumerate(zip(buffers, sizes)):
        patches.append(Rectangle((buf.lower, offsets[buf.id] / scale), buf.upper - buf.lower,
                                 s / scale))
        colors.append(cmap(k % 20))
    coll = PatchCollection(patches, facecolor=colors, edgecolor="black",
                           linewidth=0.3 if len(buffers) < 400 else 0.0, alpha=0.85)
    ax.add_collection(coll)
    if len(buffers) <= 40:  # few buffers: name them
        for buf, s in zip(buffers, sizes):
            ax.text(buf.lower + (buf.upper - buf.lower) / 2,
                    (offsets[buf.id] + s / 2) / scale, str(buf.id),
                    ha="center", va="center", fontsize=8)
    ax.axhline(height / scale, color="#d62728", linestyle="--", linewidth=1.2,
               label=f"arena height {_fmt(height, unit, scale)}")
    if lower_bound is not None:
        ax.axhline(lower_bound / scale, color="#2ca02c", linestyle=":", linewidth=1.4,
                   label=f"peak live bytes (lower bound) {_fmt(lower_bound, unit, scale)}")
    ax.set_xlim(0, horizon)
    ax.set_ylim(0, max(height, lower_bound or 0) / scale * 1.12 or 1)
    ax.set_xlabel("time (op position)")
    ax.set_ylabel(f"offset ({unit})")
    ax.set_title(title or f"arena plan: {len(buffers)} buffers", fontsize=11)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=9,
              frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(n: float, unit: str, scale: float) -> str:
    return f"{int(n)} B" if unit == "B" else f"{n / scale:.2f} {unit}"
