"""Where the ops of a rewritten program were in the original one.

memory_optimize, level 2, ``budget=`` and release_memory add ops (two
bookkeeping ops that record the rewrite, release ops, recomputed ops),
replace some (an in-place variant ``relu_`` takes ``relu``'s place) and
reorder others, so the n-th op of the rewritten program's run is not the
n-th op of the original's.  Pictures that draw before and after on one x
axis use the original program's run positions (those of its
:class:`~memopt.analysis.Analysis`) for both.

Which op is which:

1. by identity: ``op.attrs["origin"]`` where the adapter sets it (a legacy
   program: the legacy op a translated op comes from), else
   ``op.attrs["pir_id"]`` (a PIR op: Paddle keeps an op's id while memopt
   edits the program around it); the k-th graph op of one origin (in
   program order) is the k-th of the other;
2. the ops left over on both sides (in-place variants, ops without an
   identity, a bare :class:`~memopt.graph.Graph`) are paired by the longest
   common sequence of their types in run order (``relu_`` counts as
   ``relu``);
3. what is left of the rewritten program was added: it is drawn at the x of
   the op that ran just before it (the first ops: at the next op's x).  Of
   the ops drawn at one x, the one holding the most memory stands for it,
   so the rewritten program's peak is kept.

An x whose op the rewritten program dropped shows the op drawn at the x
before it.  Everything here works on run positions (the positions of
:meth:`Analysis.timeline`); it needs the analyses' ``graph`` and ``order``
only.
"""
from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher

from .graph import Op

__all__ = ["Aligned", "align", "match", "op_kind", "run_ops"]


def _run_positions(analysis) -> list:
    """For each run position of ``analysis`` (each of its ``op_types``), the
    flat position of its op in ``analysis.graph``, or None for a position
    the analysis adds beyond the graph's ops (a dygraph step's eager
    ``opt.step()``)."""
    n_flat = sum(1 for _ in analysis.graph.walk_ops())
    order = analysis.order or list(range(n_flat))
    return [order[j] if j < len(order) and 0 <= order[j] < n_flat else None
            for j in range(len(analysis.op_types))]


def run_ops(analysis) -> list:
    """The :class:`~memopt.graph.Op` at every run position of ``analysis``
    (an op of that type reading and writing nothing where the analysis has
    a position of its own, beyond the graph's ops)."""
    flat = [op for _, op in analysis.graph.walk_ops()]
    return [flat[i] if i is not None else Op(analysis.op_types[j])
            for j, i in enumerate(_run_positions(analysis))]


def _keys(analysis) -> list:
    """The identity of the op at each run position (None: it has none)."""
    seen: dict = {}
    keys = []
    for _, op in analysis.graph.walk_ops():
        origin = op.attrs.get("origin", op.attrs.get("pir_id")) if op.attrs else None
        if origin is None:
            keys.append(None)
            continue
        k = seen.get(origin, 0)
        seen[origin] = k + 1
        keys.append((origin, k))
    return [keys[i] if i is not None else None for i in _run_positions(analysis)]


def op_kind(op_type: str) -> str:
    """An op type with an in-place variant's trailing ``_`` dropped."""
    return op_type.removesuffix("_")


def match(reference, other) -> list[int | None]:
    """For each run position of ``other``, the run position of the same op
    in ``reference`` (see the module docstring), or None for an op
    ``reference`` does not have.  Each reference position is matched at
    most once."""
    ref_keys, keys = _keys(reference), _keys(other)
    at = {k: i for i, k in enumerate(ref_keys) if k is not None}
    out: list[int | None] = [None] * len(keys)
    used = set()
    for j, k in enumerate(keys):
        i = at.get(k) if k is not None else None
        if i is not None and i not in used:
            out[j] = i
            used.add(i)
    left_ref = [i for i in range(len(ref_keys)) if i not in used]
    left = [j for j in range(len(keys)) if out[j] is None]
    if left_ref and left:
        ref_types = [op_kind(reference.op_types[i]) for i in left_ref]
        types = [op_kind(other.op_types[j]) for j in left]
        matcher = SequenceMatcher(None, ref_types, types, autojunk=False)
        for block in matcher.get_matching_blocks():
            for d in range(block.size):
                out[left[block.b + d]] = left_ref[block.a + d]
    return out


@dataclass
class Aligned:
    """``other`` drawn on ``reference``'s x axis.

    Attributes
    ----------
    xs : for each run position of ``other``, its x (a run position of
        ``reference``).
    added : for each run position of ``other``, whether its op is one the
        reference does not have (drawn at the x of the op before it).
    shown : for each x, the run position of ``other`` whose live bytes stand
        for it: of the ops drawn there the one holding the most (the first
        on ties), else (no op there) the one shown at the x before.
    """

    xs: list[int]
    added: list[bool]
    shown: list[int]

    def at(self, x: int) -> list[int]:
        """Run positions of ``other`` drawn at ``x``, in run order."""
        return [j for j, v in enumerate(self.xs) if v == x]


def align(reference, other, batch_size: int | None = None) -> Aligned:
    """Draw ``other`` (an :class:`~memopt.analysis.Analysis` of the program
    after a rewrite) on the x axis of ``reference`` (before it), its live
    bytes taken at ``batch_size`` (default: ``other``'s own)."""
    n = len(reference.op_types)
    matched = match(reference, other)
    xs: list[int] = []
    last: int | None = None
    pending = 0  # added ops before the first matched one
    for i in matched:
        if i is None:
            if last is None:
                pending += 1
                xs.append(-1)
            else:
                xs.append(last)
        else:
            last = i
            xs.append(i)
    if pending:
        first = next((i for i in matched if i is not None), 0)
        xs = [first if x == -1 else x for x in xs]
    line = other.timeline(batch_size)
    best: list[int | None] = [None] * max(n, 1)
    for j, x in enumerate(xs):
        if 0 <= x < len(best) and (best[x] is None or line[j] > line[best[x]]):
            best[x] = j
    shown: list[int] = []
    previous = 0
    for x in range(len(best)):
        j = best[x]
        if j is None:
            j = previous
        shown.append(j)
        previous = j
    return Aligned(xs=xs, added=[i is None for i in matched], shown=shown)
