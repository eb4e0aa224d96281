"""PIR programs rewritten: ops turned into their in-place variants.

On PIR, values are SSA and Paddle's executor already frees each one after
its last use (GC on) and already runs some ops of the top-level block in
place (its in-place pass).  What is left to do soundly is to turn ops into
their in-place variants wherever the input dies at the op
(:func:`plan_inplace`): inside ``if``/``while`` regions (the executor's pass
never touches them), where that pass is off, with GC off, and for shapes
the pass refuses (a ``-1`` past the first dimension).

The plan is pure data and is made in full before the program is touched;
:func:`apply_inplace` then rewrites all or nothing.  A replaced op's result
Values are new objects: the old Python ``Value`` objects are dead (touch
them only to fetch them).  ``Executor.run`` is wrapped so that fetching an
old one fetches its replacement, and fetching a Value an in-place op now
overwrites raises :class:`~memopt.errors.MergedVariableError`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ..candidates import R_GRAD
from ..errors import PlanError
from .distributed import in_flight_names
from .pir import PirGraph, is_pir_program
from .pir_inplace import (CPU_NO_INPLACE, build_inplace,
                          has_inplace_variant, inplace_map, inplace_maps, is_inplace_op)

log = logging.getLogger(__name__)

__all__ = [
    "InplaceRewrite",
    "plan_inplace",
    "apply_inplace",
    "resolve_fetch_list",
    "install_fetch_guard",
    "record_rewrite",
]

#: Ops whose result may be a view of an operand: never overwrite such a result
#: in place (the viewed tensor may still be live).
_VIEW_OPS = frozenset({
    "pd_op.split", "pd_op.split_with_num", "pd_op.slice", "pd_op.strided_slice",
    "pd_op.transpose", "pd_op.reshape", "pd_op.squeeze", "pd_op.unsqueeze",
    "pd_op.flatten", "pd_op.view_dtype", "pd_op.view_shape", "pd_op.as_strided",
    "pd_op.unbind", "pd_op.diagonal", "pd_op.expand", "pd_op.share_data",
    "pd_op.assign", "builtin.split", "builtin.slice", "pd_op.while", "pd_op.if"})

#: memory_optimize's reasons for leaving an op as it is (Report.not_merged):
#: the core's where they mean the same (:mod:`memopt.candidates`), these
#: where they are about PIR's in-place variants.
R_PROTECTED = "input or output protected (persistable, fed, fetched, skip_opt_set)"
R_ALIVE = "input still used later"
R_SHAPE = "input and output differ in shape or dtype"
R_OUTSIDE = "input from outside the op's block, carried by a loop, or a view"
R_KERNEL = "CPU kernel cannot run in place"

#: The program attribute recording a rewrite: {"replaced": {old value id: new
#: Value}, "overwritten": {value id: name}} (read by the fetch guard).
RECORD_ATTR = "_memopt_pir_rewrites"


@dataclass
class InplaceRewrite:
    """One op to turn into its in-place variant (pure data, before the rewrite).

    ``position`` is the op's flat position in the :class:`PirGraph`; ``pairs``
    the ``(input name, output name)`` the variant writes over.
    """

    position: int
    op_name: str
    pairs: tuple
    block: int = 0


def plan_inplace(pg: PirGraph, options, device: str = "cpu") -> tuple:
    """Which ops of ``pg`` may soundly run in place (pure data; nothing changes).

    An op qualifies when Paddle registers its in-place variant and, for each
    (input, output) pair of that variant: the input dies at the op (no later
    read anywhere, loops included), is defined in the op's own block by an op
    that cannot return a view, and is not persistable, fed, fetched, in
    ``skip_opt_set`` or a loop-carried value; the output is not fetched or in
    ``skip_opt_set``; the input is read by no other operand of the op; both
    have the same dtype and, at level 0, the same shape (level 1: the same
    size in bytes for every batch size).  With ``skip_grads``, backward and
    optimizer ops are left alone.

    Returns ``(rewrites, reasons)``: the :class:`InplaceRewrite` list in
    program order and ``{reason: ops left alone for it}``.
    """
    from ..liveness import analyze_graph

    graph = pg.graph
    positions = list(graph.walk_ops())
    live = analyze_graph(graph)
    skip = set(options.skip_opt_set) | in_flight_names(graph)
    var_block: dict = {}
    for block_idx, var in graph.all_vars():
        var_block.setdefault(var.name, block_idx)
    owners = {sub: pos for pos, (_, op) in enumerate(positions) for sub in op.sub_blocks}
    overwritten_persistable = set()
    for _, op in positions:
        for src, dst in op.facts.overwrites:
            overwritten_persistable.add(dst)
    inplace_maps(pg.program, [op for op in pg.ops if op is not None])
    rewrites, reasons = [], {}

    def refuse(reason: str) -> None:
        reasons[reason] = reasons.get(reason, 0) + 1

    for pos, (block_idx, op) in enumerate(positions):
        pir_op = pg.ops[pos]
        if pir_op is None or not has_inplace_variant(op.type) or is_inplace_op(pir_op):
            continue
        if device == "cpu" and op.type in CPU_NO_INPLACE:
            refuse(R_KERNEL)
            continue
        if options.skip_grads and op.role in ("backward", "optimize"):
            refuse(R_GRAD)
            continue
        pairs_slots = inplace_map(pir_op, pg.program).items()
        if not pairs_slots:
            continue
        operands = list(pir_op.operands_source())
        results = list(pir_op.results())
        pairs, reason = [], None
        for out_slot, in_slot in sorted(pairs_slots):
            vin, vout = operands[in_slot], results[out_slot]
            if not (vin.initialized() and vout.initialized()) \
                    or vin.id not in pg.name_of or vout.id not in pg.name_of:
                reason = R_SHAPE
                break
            nin, nout = pg.name_of[vin.id], pg.name_of[vout.id]
            var_in, var_out = graph.find_var(nin, block_idx), graph.find_var(nout, block_idx)
            if var_in is None or var_out is None or not var_in.is_dense or not var_out.is_dense:
                reason = R_SHAPE
                break
            if (var_in.persistable or var_in.is_data or var_in.is_feed or var_in.is_fetch
                    or var_out.persistable or var_out.is_fetch or nin in skip or nout in skip
                    or nin in overwritten_persistable or nin in graph.fetch_names
                    or nout in graph.fetch_names):
                reason = R_PROTECTED
                break
            maker = pg.defining_op.get(nin)
            maker_op = positions[maker][1] if maker is not None else None
            if (var_block.get(nin) != block_idx or maker is None or maker_op.type in _VIEW_OPS
                    or maker_op.facts.synthetic or nin.startswith("%arg_")):
                reason = R_OUTSIDE
                break
            if sum(1 for v in operands if v.initialized() and v.id == vin.id) != 1:
                reason = R_ALIVE
                break
            if live.liveness.is_live_out(pos, nin) or _read_later_in_loop(
                    graph, positions, owners, block_idx, pos, nin):
                reason = R_ALIVE
                break
            if var_in.dtype != var_out.dtype or (
                    tuple(var_in.shape) != tuple(var_out.shape) if options.level == 0
                    else var_in.size != var_out.size):
                reason = R_SHAPE
                break
            pairs.append((nin, nout))
        if reason:
            refuse(reason)
            continue
        rewrites.append(InplaceRewrite(pos, op.type, tuple(pairs), block_idx))
    return rewrites, reasons


def _read_later_in_loop(graph, positions, owners, block_idx, pos, name) -> bool:
    """Whether ``name`` is read again by a later iteration of a loop around
    op ``pos`` (liveness already says so for values defined outside the
    loop; this guards values defined inside that a loop-carried read may
    reach through the back edge)."""
    b = block_idx
    while b in owners:
        owner = positions[owners[b]][1]
        if owner.loop:
            head = owners[b]
            return name in owner.reads or name in owner.writes or any(
                name in op.reads for i, (_, op) in enumerate(positions)
                if head <= i < pos and _inside(positions, owners, i, b))
        b = positions[owners[b]][0]
    return False


def _inside(positions, owners, position: int, block: int) -> bool:
    b = positions[position][0]
    while True:
        if b == block:
            return True
        if b not in owners:
            return False
        b = positions[owners[b]][0]


def apply_inplace(pg: PirGraph, rewrites) -> dict:
    """Turn each planned op into its in-place variant, all or nothing.

    Every new op is built first, right before its original (which keeps its
    uses); if any build fails, the new ops are erased and the program is as
    it was.  Then each original's uses move to the new op and it is erased.
    Returns ``{old result Value id: new result Value}``.
    """
    built = []
    try:
        for rw in rewrites:
            old = pg.ops[rw.position]
            new = build_inplace(old)
            if new.name() != old.name() + "_" or new.num_results() != old.num_results() \
                    or [str(r.type()) for r in new.results()] != \
                    [str(r.type()) for r in old.results()]:
                new.erase()
                raise PlanError(f"the in-place variant of {old.name()} does not "
                                "match the op it replaces")
            built.append((old, new))
    except Exception:
        for _, new in built:
            new.erase()
        raise
    replaced = {}
    for old, new in built:
        for a, b in zip(old.results(), new.results()):
            if a.initialized():
                replaced[a.id] = b
        old.replace_all_uses_with(new.results())
        old.erase()
    return replaced


def record_rewrite(program, replaced: dict, overwritten: dict) -> None:
    """Remember what the rewrite replaced so fetches stay right (the guard)."""
    entry = getattr(program, RECORD_ATTR, None) or {"replaced": {}, "overwritten": {}}
    entry["replaced"].update(replaced)
    entry["overwritten"].update(overwritten)
    setattr(program, RECORD_ATTR, entry)
    install_fetch_guard()


def resolve_fetch_list(program, fetch_list):
    """``fetch_list`` with Values replaced by memory_optimize swapped for their
    replacements; raises :class:`MergedVariableError` for a Value an in-place
    op now overwrites (fetching it would return another value's data)."""
    entry = getattr(program, RECORD_ATTR, None)
    if not entry or fetch_list is None:
        return fetch_list
    single = not isinstance(fetch_list, (list, tuple))
    items = [fetch_list] if single else list(fetch_list)
    out = []
    for item in items:
        vid = getattr(item, "id", None) if not isinstance(item, str) else None
        if isinstance(vid, str) and vid in entry["overwritten"]:
            from ..errors import MergedVariableError

            name = entry["overwritten"][vid]
            raise MergedVariableError(
                f"cannot fetch {name}: memopt.memory_optimize made an op write over it "
                "in place, so after the run it holds another value. Rebuild the program "
                f"and pass the Value (or {name!r}) in skip_opt_set to keep it")
        out.append(entry["replaced"].get(vid, item) if isinstance(vid, str) else item)
    return out[0] if single else type(fetch_list)(out)


def _fetch_hook(program, fetch_list):
    """The fetch guard's hook (:mod:`memopt.paddle.fetch_guard`)."""
    if is_pir_program(program) and getattr(program, RECORD_ATTR, None):
        return resolve_fetch_list(program, fetch_list)
    return fetch_list


def install_fetch_guard() -> None:
    """Route fetches of rewritten PIR programs through
    :func:`resolve_fetch_list` (one ``Executor.run`` wrapper, shared with the
    legacy adapter)."""
    from .fetch_guard import add_hook

    add_hook(_fetch_hook)
