"""Level 2: a saved value that a saved concat already holds, sliced out again in the backward part.

A DenseNet layer reads the concat of every earlier feature map of its
block, and its batch norm's backward op reads that concat again: each
concat ``x_l`` is saved for the backward part, and so is the next one,
``x_{l+1}``, whose first channels are ``x_l`` again -- the same bytes held
twice from the forward part to the backward one.  A U-Net's skip feature
is saved for its own backward ops and held again inside the decoder's
concat.

This rewrite drops such a saved value ``v`` when a *container* ``c`` holds
it: ``c`` is a concat output (or the slice made here of one) whose inputs
along its axis include ``v`` (an input itself, or a concat of a contiguous
run of the inputs on the same axis), ``c`` is saved too and its backward
part starts before ``v``'s does.  Right before the first backward op
reading ``v``'s data it inserts ``v' = slice(c)`` (the bytes of ``v``,
copied: zero FLOPs, bit-identical) and points every backward data read of
``v`` at ``v'``; ``v`` then dies in the forward part.  The slice reads ``c``
through :func:`memopt.paddle.pir.recompute.waiting_for` tied to a value the
backward part makes right before (the reader's latest backward-made
operand), so Paddle's multi-thread executor cannot run it in the forward
part.  Of the containers of ``v`` the smallest is taken, so each value is
sliced from the next larger one (``x_l`` from ``x_{l+1}``'s slice) and no
container lives much longer than it did.

:func:`plan_slices` finds them (pure reading), :func:`apply_slices`
rewrites the program all at once (the returned object's ``undo()`` takes
it back).  :mod:`memopt.api` applies them at level 2 only when the
predicted peak falls under every executor mode checked
(:func:`memopt.paddle.pir.schedule.executor_modes`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ...errors import PlanError
from .inplace import insertion_point_kept
from .program import COMBINE_OP, PirGraph

if TYPE_CHECKING:  # the return annotation of slice_if_lower
    from .recompute import AppliedRecompute

__all__ = ["SliceOut", "plan_slices", "apply_slices"]

CONCAT_OP = "pd_op.concat"


@dataclass(frozen=True)
class SliceOut:
    """``name`` (a saved value) made again in the backward part as
    ``source[start:end]`` along ``axis`` (``source`` a saved concat output,
    or another :class:`SliceOut`'s name), right before op ``before`` (flat
    position of the first backward op reading ``name``'s data), tied to
    ``trigger`` (a value that op reads, made in the backward part; placed
    early, a value the container's last backward reader makes).  ``gated``:
    placed early, so the backward ops reading ``trigger`` read it through a
    view waiting for the slice: the executor cannot run them while the
    container is still held for the slice."""

    name: str
    source: str
    axis: int
    start: int
    end: int
    before: int
    trigger: str
    gated: bool = False


def _concat_parts(pg: PirGraph, op) -> Optional[Tuple[List[str], int, List[int]]]:
    """``(input names, axis, their extents along it)`` of a ``pd_op.concat``
    whose inputs come from one ``builtin.combine`` and whose axis is a
    constant with static extents; None otherwise."""
    vec = op.operand_source(0)
    comb = vec.get_defining_op() if vec.initialized() else None
    if comb is None or comb.name() != COMBINE_OP or op.num_operands() < 2:
        return None
    axis_def = op.operand_source(1).get_defining_op()
    if axis_def is None or axis_def.name() != "pd_op.full":
        return None
    try:
        axis = int(axis_def.attrs()["value"])
        shapes = [list(v.shape) for v in comb.operands_source()]
        names = [pg.name(v) for v in comb.operands_source()]
    except Exception:
        return None
    rank = len(shapes[0]) if shapes else 0
    if axis < 0:
        axis += rank
    if not 0 <= axis < rank or any(len(s) != rank or s[axis] < 0 for s in shapes):
        return None
    return names, axis, [s[axis] for s in shapes]


def plan_slices(pg: PirGraph, batch: int, early: bool = False) -> List[SliceOut]:
    """The saved values of ``pg``'s top-level block that a saved concat
    holds (see the module docstring), in the order to make them; [] when
    there are none.  A value a region op reads or writes is never sliced
    out, nor sliced from when one writes it (:mod:`memopt.paddle.pir.regions`).

    ``early``: make each slice right after the last backward op reading its
    container's data, where that op comes before the first backward reader
    of the value (a U-Net's decoder concat, read by its convolution's
    backward op early in the backward part, holds the skip that the
    encoder's backward ops read only at the end: slicing the skip out at
    once lets the concat die there, not at the end); elsewhere right before
    that first reader, as without ``early``."""
    from ...recompute import saved_values
    from .recompute import problem_of
    from .regions import top_level_ops

    problem = problem_of(pg, batch)
    fixed = problem.pinned | problem.barred
    saved = {name: pos for name, pos in saved_values(problem).items()
             if name not in problem.barred}  # name -> backward reader positions
    ops = problem.ops
    first = {name: min(pos) for name, pos in saved.items()}
    concats: Dict[str, Tuple[List[str], int, List[int]]] = {}
    for i, pir_op in enumerate(top_level_ops(pg)):
        if pir_op is not None and pir_op.name() == CONCAT_OP and ops[i].role == "forward":
            parts = _concat_parts(pg, pir_op)
            if parts is not None and ops[i].writes:
                concats[ops[i].writes[0]] = parts
    # which saved value each saved concat holds, and where
    held: Dict[str, List[Tuple[int, str, int, int, int]]] = {}
    for c, (names, axis, extents) in concats.items():
        if c not in saved:
            continue
        offsets = [sum(extents[:k]) for k in range(len(extents) + 1)]
        size_c = problem.size(c)
        for k, name in enumerate(names):
            if name in saved and name != c:
                held.setdefault(name, []).append((size_c, c, axis, offsets[k], offsets[k + 1]))
        for d, (inner, d_axis, _) in concats.items():
            if d == c or d not in saved or d_axis != axis or len(inner) >= len(names):
                continue
            for k in range(len(names) - len(inner) + 1):
                if names[k:k + len(inner)] == inner:
                    held.setdefault(d, []).append(
                        (size_c, c, axis, offsets[k], offsets[k + len(inner)]))
                    break
    plans: Dict[str, SliceOut] = {}
    for name in sorted(held, key=lambda n: first[n]):
        if name in fixed:
            continue
        options = sorted(o for o in held[name] if first[o[1]] < first[name])
        if not options:
            continue
        _, c, axis, start, end = options[0]
        spot = _after_last_reader(pg, max(saved[c]), first[name]) if early else None
        if spot is not None:
            before, trigger = spot
        else:
            before, trigger = first[name], _trigger(pg, first[name], name)
        if trigger is None:
            continue
        plans[name] = SliceOut(name, c, axis, start, end, before, trigger, spot is not None)
    return _sources_first(sorted(plans.values(), key=lambda s: (s.before, s.name)))


def _sources_first(slices: List[SliceOut]) -> List[SliceOut]:
    """``slices`` (sorted by position) with a slice made before any slice
    cut out of it at the same position (they are inserted in this order)."""
    names = {s.name: s for s in slices}
    out: List[SliceOut] = []
    done: set = set()

    def add(s: SliceOut) -> None:
        if s.name in done:
            return
        source = names.get(s.source)
        if source is not None and source.before == s.before:
            add(source)
        done.add(s.name)
        out.append(s)

    for s in slices:
        add(s)
    return out


def _after_last_reader(pg: PirGraph, last: int, first: int) -> Optional[Tuple[int, str]]:
    """``(position, trigger)`` to make a slice right after op ``last`` (its
    container's last backward reader): before the next op of the top-level
    block, waiting for a value op ``last`` makes; None unless that position
    is at or before ``first`` (the value's first backward reader) and op
    ``last`` makes a dense value to wait for."""
    from .regions import top_level_ops

    if last >= first:
        return None
    top = top_level_ops(pg)
    position = next((p for p in range(last + 1, first + 1) if top[p] is not None), None)
    if position is None:
        return None
    op = pg.graph.blocks[0].ops[last]
    if op.role != "backward" or op.sub_blocks:
        return None
    for name in op.writes:
        if name in pg.values and pg.graph.blocks[0].vars.get(name) is not None:
            return position, name
    return None


def _trigger(pg: PirGraph, position: int, name: str) -> Optional[str]:
    """The operand of op ``position`` made latest by a backward op (not
    ``name``): the slice waits for it."""
    ops = pg.graph.blocks[0].ops
    op = ops[position]
    makers = {n: k for k, o in reversed(list(enumerate(ops[:position]))) for n in o.writes}
    carried = {n for o in ops if o.sub_blocks or o.facts.synthetic == "before" for n in o.writes}
    best = None
    for other in op.reads:
        if other == name or other in carried:
            continue
        maker = makers.get(other)
        if maker is None or ops[maker].role != "backward":
            continue
        if best is None or maker > best[0]:
            best = (maker, other)
    return best[1] if best else None


@insertion_point_kept()
def apply_slices(pg: PirGraph, slices: List[SliceOut]):
    """Insert the slices into ``pg.program`` and point the backward data
    reads of each sliced value at its slice; all or nothing.  Returns a
    :class:`memopt.paddle.pir.recompute.AppliedRecompute` (``undo()``)."""
    import paddle
    from paddle import pir

    from .recompute import (AppliedRecompute, waiting_for, redirect_data_uses,
                                verify_defined_before_use)
    from .regions import top_level_ops

    program = pg.program
    block = program.global_block()
    ops = list(block.ops)
    top = top_level_ops(pg)  # by graph position; None: a synthetic op
    read = [op for op in top if op is not None]
    if len(ops) != len(read) or any(a.id() != b.id() for a, b in zip(ops, read)):
        raise PlanError("apply_slices: the program changed since it was read")
    start = next((i for i, op in enumerate(pg.graph.blocks[0].ops)
                  if op.role in ("backward", "optimize")), len(top))
    backward = {op for op in top[start:] if op is not None}
    made: Dict[str, object] = {}
    redirected: list = []
    try:
        for s in slices:
            if top[s.before] is None:
                raise PlanError(f"apply_slices: op {s.before} is no op of the program")
            pir.set_insertion_point(top[s.before])
            source = made.get(s.source, pg.values[s.source])
            waited = waiting_for(source, pg.values[s.trigger])
            value = paddle._C_ops.slice(waited, [s.axis], [s.start], [s.end], [1], [])
            made[s.name] = value
            if s.gated:  # the trigger's readers wait for the slice
                trigger = pg.values[s.trigger]
                redirected.extend(redirect_data_uses(
                    trigger, waiting_for(trigger, value), backward))
        for s in slices:
            redirected.extend(redirect_data_uses(pg.values[s.name], made[s.name], backward))
        pir.set_insertion_point_to_block_end(block)
        verify_defined_before_use(block)
    except Exception:
        AppliedRecompute(block, ops, redirected, made).undo()
        raise
    return AppliedRecompute(block, ops, redirected, made)


#: The least share of the predicted peak the slices must save to be kept
#: (as for a new order, :data:`memopt.paddle.pir.schedule.MIN_GAIN`).
MIN_GAIN = 0.01


def slice_if_lower(program, batch: int, runtime, fetch_names=(),
                   fetch_values=()) -> Tuple[int, str, Optional[AppliedRecompute]]:
    """Apply :func:`plan_slices`' slices to ``program`` if the predicted peak
    falls by :data:`MIN_GAIN` under the runtime's own executor mode and
    rises under none of :func:`memopt.paddle.pir.schedule.executor_modes`
    (frees on time or late); otherwise leave it unchanged.  Returns ``(how
    many values were sliced out, a note for the report, the applied slices
    (``undo()`` takes them back) or None)``.  ``fetch_values``:
    the Values ``fetch_names`` name (alive to the end of the step in the
    predicted peaks; Values, as the slices added renumber ``%N`` names)."""
    from ...report import format_bytes
    from .program import convert
    from .schedule import executor_modes, mode_peaks

    pg = convert(program, sorted(fetch_names))
    variants = [plan_slices(pg, batch)]
    if not variants[0]:
        return 0, "", None
    early = plan_slices(pg, batch, early=True)
    if early != variants[0]:
        variants.append(early)
    modes = executor_modes(runtime)
    fetch = list(fetch_values)
    before = mode_peaks(program, batch, modes, fetch=fetch)
    best: Optional[Tuple[int, List[SliceOut]]] = None
    why = ""
    for slices in variants:  # each applied, its peaks predicted, taken back
        applied = apply_slices(pg, slices)
        try:
            after = mode_peaks(program, batch, modes, fetch=fetch)
        finally:
            applied.undo()
        risen = [m for m in before if after[m] > before[m]]
        if risen or after["own"] > before["own"] * (1 - MIN_GAIN):
            why = why or (f"higher under {', '.join(risen)}" if risen else "not lower by 1%")
        elif best is None or after["own"] < best[0]:
            best = (after["own"], slices)
    if best is None:
        return 0, (f"level 2: {len(variants[0])} saved values held again inside a saved "
                   f"concat left as they are (slicing them out predicted {why})"), None
    peak, slices = best
    applied = apply_slices(pg, slices)
    placed = (" (right after their concat's last backward reader where that comes first)"
              if slices is not variants[0] else "")
    return len(slices), (
        f"level 2: {len(slices)} saved values held again inside a saved concat are sliced "
        f"out of it in the backward part{placed} instead of being kept (zero FLOPs, a copy "
        f"of their bytes): predicted peak {format_bytes(before['own'])} -> "
        f"{format_bytes(peak)}"), applied
