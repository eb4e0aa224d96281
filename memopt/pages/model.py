"""The memory page's data: analyses turned into plain, JSON-ready dicts.

:func:`lane` takes one or more :class:`~memopt.analysis.Analysis` of one
program (the first the reference, e.g. before ``memory_optimize``; the
others after rewrites of it) and returns what the page draws for them on
one x axis, the reference's run positions (:mod:`memopt.alignment`):

- ``ops``: per x, the reference's op ``[type, place, source line]``;
- ``series``: per analysis, the live bytes at each x stacked by kind
  (:data:`KINDS`; parameters and optimizer state are persistable, constant
  over the step), the peak (bytes, x), the holders of the buffers
  (:data:`HOLDER_FIELDS`), the largest holders at each x and at the peak,
  and what memopt added (recomputed ops, release and bookkeeping ops) at
  the x they are drawn at.

A page is ``{"title", "subtitle", "batch_size", "notes", "lanes": [lane,
...]}`` (one lane per program; ``estimate`` gives one per rank).  Sizes are
bytes (ints) at the page's batch size.  Nothing here imports Paddle, nor the
analysis module: it reads the attributes an Analysis has.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..alignment import Aligned, align, match, op_kind, run_ops

__all__ = ["HOLDER_FIELDS", "KINDS", "lane", "page"]

#: The kinds live bytes are stacked by, bottom up.
KINDS = ("parameters", "optimizer state", "inputs", "activations", "gradients",
         "optimizer update", "workspaces")

#: Analysis holder categories -> kinds (parameters and optimizer state are the
#: persistable bytes, split by :func:`_persistable_split`).
_KIND_OF = {"input": "inputs", "activation": "activations", "gradient": "gradients",
            "optimizer": "optimizer update", "workspace": "workspaces",
            "parameter": "parameters"}

#: The fields of a holder row, in order.
HOLDER_FIELDS = ("name", "bytes", "kind", "producer", "last_reader", "from_x", "to_x",
                 "shares")

#: Holders listed at each x (hover) and in the table at the peak.
TOP_AT_X, TOP_AT_PEAK = 6, 50


def _source(op) -> str:
    return op.attrs.get("source", "") if op.attrs else ""


def _op_text(analysis, ops: list, j: int) -> str:
    """``pd_op.matmul at op 233`` (the place a report names) for run position j."""
    return f"{ops[j].type} at {analysis.place(j)}"


class _OpNames:
    """How the page names the op at a run position of ``other``: as the
    reference program names the same op (its place there), so before and
    after name one op alike; an op the reference lacks by its own place,
    marked ``[added by memopt]``."""

    def __init__(self, reference, ref_ops: list, other, ops: list, matched: list) -> None:
        self.reference, self.ref_ops = reference, ref_ops
        self.other, self.ops, self.matched = other, ops, matched

    def __call__(self, j: int) -> str:
        i = self.matched[j]
        if i is not None:
            return _op_text(self.reference, self.ref_ops, i)
        return f"{_op_text(self.other, self.ops, j)} [added by memopt]"


def _persistable_split(analysis, b: int) -> tuple:
    """``(parameters, optimizer state)`` bytes: persistable dense variables a
    forward op reads are parameters, the rest optimizer state (its moments,
    learning rate, step counters); the two sum to the analysis's
    persistable bytes."""
    total = analysis.persistable_bytes(b)
    read_forward = set()
    for _, op in analysis.graph.walk_ops():
        if op.role == "forward":
            read_forward.update(op.reads)
    params = 0
    seen = set()
    for _, var in analysis.graph.all_vars():
        if var.persistable and var.is_dense and var.name in read_forward \
                and var.name not in seen:
            seen.add(var.name)
            params += var.size.at(b)
    params = min(params, total)
    return params, total - params


def _kind_lines(analysis, b: int, n: int) -> dict:
    """``{kind: np.ndarray}`` of live bytes of each kind at each run position."""
    diffs = {k: np.zeros(n + 1, dtype=np.int64) for k in KINDS}
    for h in analysis.holders:
        d = diffs[_KIND_OF.get(h.category, "activations")]
        d[h.start] += h.bytes(b)
        d[h.end + 1] -= h.bytes(b)
    return {k: np.cumsum(d)[:n] for k, d in diffs.items()}


def _top_at(holders: list, b: int, n: int, k: int) -> list:
    """For each run position, the indexes (into ``holders``) of the ``k``
    largest holders live there, largest first (ties: earlier start, name)."""
    ranked = sorted(range(len(holders)), key=lambda i: (-holders[i].bytes(b), holders[i].start,
                                                       holders[i].name))
    out: list[list] = [[] for _ in range(n)]
    counts = np.zeros(n, dtype=np.int64)
    full = 0
    for i in ranked:
        h = holders[i]
        lo, hi = max(h.start, 0), min(h.end, n - 1)
        if hi < lo:
            continue
        seg = counts[lo:hi + 1]
        free = np.nonzero(seg < k)[0]
        for p in free:
            out[lo + int(p)].append(i)
        seg[free] += 1
        full += int(np.count_nonzero(seg[free] == k))
        if full >= n:
            break
    return out


def _last_reads(ops: list) -> dict:
    """name -> the last run position whose op reads it."""
    last: dict = {}
    for j, op in enumerate(ops):
        for name in op.reads:
            last[name] = j
    return last


class _Names:
    """How a holder of ``other`` is named on the page: as the reference
    names the same value (the output in the same slot of the matched op;
    the reference's holder labels, e.g. a dygraph Layer path, first), so
    before and after name one value alike and memopt's own names
    (``memopt@buf_3``, renumbered ``%N``) never show; a value an op memopt
    added makes is marked (``[recomputed] ...``)."""

    def __init__(self, reference, ref_ops: list, other, ops: list, matched: list,
                 role) -> None:
        ref_names: dict = {}
        for _, var in reference.graph.all_vars():
            ref_names.setdefault(var.name, var.display)
        for h in reference.holders:  # an adapter's label for the buffer wins
            if h.names:
                ref_names[h.name] = h.label
        self.labels: dict = {}  # name in ``other`` -> its name on the page
        if other is reference:
            self.labels = ref_names
            return
        for _, var in other.graph.all_vars():
            self.labels.setdefault(var.name, var.display)
        for h in other.holders:
            if h.names:
                self.labels[h.name] = h.label
        for j, op in enumerate(ops):
            i = matched[j]
            if i is None:
                for name in op.writes:
                    self.labels[name] = f"[{role(op)}] {self.labels.get(name, name)}"
                continue
            ref_writes = ref_ops[i].writes
            for w, name in enumerate(op.writes):
                if w < len(ref_writes) and ref_writes[w] in ref_names:
                    self.labels[name] = ref_names[ref_writes[w]]

    def __call__(self, holder) -> str:
        if not holder.names:  # a kernel's workspace, fetch copies: described already
            return holder.label
        return self.labels.get(holder.name, holder.label)


def _series(reference, analysis, b: int, label: str, ref_ops: list) -> dict:
    """One analysis drawn on the reference's x axis (see the module docstring)."""
    n_ref = max(len(reference.op_types), 1)  # a program without ops: one position
    ops = run_ops(analysis)
    n = len(analysis.op_types)
    line = analysis.timeline(b)
    if analysis is reference:
        matched: list = list(range(n))
        aligned = Aligned(xs=list(range(n)), added=[False] * n, shown=list(range(n)))
    else:
        matched = match(reference, analysis)
        aligned = align(reference, analysis, b)
    forward = {op_kind(op.type) for _, op in reference.graph.walk_ops() if op.role == "forward"}

    def role(op) -> str:
        """What an op the reference lacks is: a forward op run again in the
        backward part (recomputed), or an op of memopt's (release, record)."""
        return ("recomputed" if op.role != "forward" and op_kind(op.type) in forward
                else "added by memopt")

    names = _Names(reference, ref_ops, analysis, ops, matched, role)
    op_name = _OpNames(reference, ref_ops, analysis, ops, matched)
    holders = list(analysis.holders)
    top = _top_at(holders, b, max(n, 1), TOP_AT_X)
    last_read = _last_reads(ops)
    kinds = _kind_lines(analysis, b, max(n, 1))
    params, state = _persistable_split(analysis, b)
    shown = aligned.shown[:n_ref] if n else [0] * n_ref
    stack = []
    for kind in KINDS:
        if kind == "parameters":
            stack.append([params] * n_ref)
        elif kind == "optimizer state":
            stack.append([state] * n_ref)
        else:
            values = kinds[kind]
            stack.append([int(values[j]) for j in shown])
    # the holders the page names: those of any hover list and the peak's table
    peak_j = int(np.argmax(np.array(line, dtype=float))) if line else 0
    at_peak = sorted((i for i, h in enumerate(holders) if h.start <= peak_j <= h.end),
                     key=lambda i: (-holders[i].bytes(b), holders[i].start, holders[i].name))
    at_peak = at_peak[:TOP_AT_PEAK]
    used = sorted({i for j in shown for i in top[j]} | set(at_peak))
    index = {i: k for k, i in enumerate(used)}
    rows = []
    for i in used:
        h = holders[i]
        ends = [last_read[nm] for nm in (h.names or (h.name,)) if nm in last_read]
        reader = op_name(max(ends)) if ends else "-"
        producer = op_name(h.position) if 0 <= h.position < n else h.op
        if 0 <= h.position < n and _source(ops[h.position]):
            producer += f" ({_source(ops[h.position])})"
        shares = [names.labels.get(nm, nm) for nm in h.names[1:]]
        rows.append([names(h), h.bytes(b), _KIND_OF.get(h.category, h.category), producer,
                     reader, aligned.xs[h.start] if 0 <= h.start < n else 0,
                     aligned.xs[h.end] if 0 <= h.end < n else n_ref - 1, shares])
    # what memopt added, at the x it is drawn at
    added: dict = {}
    for j, is_added in enumerate(aligned.added):
        if is_added:
            op = ops[j]
            added.setdefault(aligned.xs[j], []).append(
                f"{role(op)}: {_op_text(analysis, ops, j)}"
                + (f" ({_source(op)})" if _source(op) else ""))
    peak_x = aligned.xs[peak_j] if n else 0
    return {
        "label": label,
        "gc": bool(analysis.runtime.gc),
        "peak": int(line[peak_j]) if line else 0,
        "peak_x": peak_x,
        "peak_op": op_name(peak_j) if n else "-",
        "peak_run_position": peak_j,
        "persistable": params + state,
        "stack": stack,
        "top": [[index[i] for i in top[j]] for j in shown],
        "at_peak": [index[i] for i in at_peak],
        "holders": rows,
        "ops_here": {str(x): op_name(j) for x, j in enumerate(shown)
                     if n and matched[j] != x},
        "added": {str(x): texts for x, texts in sorted(added.items())},
        "reused": sum(1 for h in holders if len(h.names) > 1),
    }


def lane(analyses: Sequence, labels: Sequence[str] = (), batch_size: int | None = None,
         title: str = "") -> dict:
    """One program's chart: ``analyses[0]`` is the reference whose run
    positions are the x axis; the others (rewrites of it) are drawn on it.
    ``labels`` names each (default ``program 1``, ``program 2``...)."""
    if not analyses:
        raise ValueError("a memory page needs at least one analysis")
    reference = analyses[0]
    b = reference.batch_for(batch_size)
    ref_ops = run_ops(reference)
    ops = [[op.type, reference.place(j), _source(op)] for j, op in enumerate(ref_ops)]
    if not ops:  # the step only holds what is fed
        ops = [["(no op)", "the step holding its feeds", ""]]
    series = [_series(reference, a, b, labels[k] if k < len(labels) else f"program {k + 1}",
                      ref_ops)
              for k, a in enumerate(analyses)]
    return {"title": title, "ops": ops, "first": reference.setup_ops(), "series": series}


def page(lanes: Sequence[dict], *, title: str, subtitle: str = "", batch_size: int = 1,
         notes: Sequence[str] = ()) -> dict:
    """The page: its lanes (:func:`lane`) and what the header says."""
    return {"title": title, "subtitle": subtitle, "batch_size": int(batch_size),
            "kinds": list(KINDS), "holder_fields": list(HOLDER_FIELDS),
            "notes": list(notes), "lanes": list(lanes)}
