"""memory_optimize level 2 on PIR: the top-level block's ops in a memory-aware order.

:func:`order_problem` describes a PIR program's top-level block as a
:class:`memopt.schedule.OrderProblem` (dependencies from PIR's use-def
chains, plus: an op that overwrites a value -- ``relu_``, ``sgd_``,
``batch_norm_``'s running statistics -- keeps its place relative to every
other reader of that value and of the views of it; ops without results keep
their relative order, and so do ops that draw random numbers, each of which
takes the generator's next numbers, and communication ops, which every rank
must run in one order -- a pipeline stage's ``p_recv`` moved before its
``p_send`` would wait for a peer that waits for it); :func:`plan_order`
makes the candidate orders of :mod:`memopt.schedule`, applies each to a
clone of the program and keeps the one :mod:`memopt.analysis` predicts the lowest peak for under the
runtime's flags (the executor's in-place pass recomputed on each order);
:func:`apply_order` moves the real program's ops (``Operation.move_before``)
all at once, and checks the result op by op.

A region op (``pd_op.if`` / ``pd_op.while``, any op with regions) moves
as one op with its regions (:mod:`memopt.paddle.pir.regions`): it follows
the makers of every top-level value it reads, in its regions too; it keeps
its side of every other reader of a value it writes over (as an in-place
op does); and region ops keep their order relative to each other, to the
ops without results and to the random ops.  Nothing is computed twice and
no op changes: the results are bit-identical.
"""
from __future__ import annotations

import logging
from typing import List, Optional, Tuple

from ...errors import PlanError
from ...schedule import OrderOp, OrderProblem, candidate_orders, check_topological
from ..distributed import is_communication
from .program import (DATA_OPS, FETCH_OPS, PARAMETER_OP, SIDE_EFFECT_OPS, PirGraph, convert,
                  draws_random)
from .regions import VIEW_OPS, graph_ops_of, regions_of

log = logging.getLogger(__name__)

__all__ = ["order_problem", "plan_order", "apply_order", "OrderChoice", "choose_order",
           "executor_modes", "mode_peaks", "peaks_by_mode", "any_order_bound"]

#: Ops whose result may share the operand's buffer (a view).
_VIEW_OPS = VIEW_OPS


def order_problem(pg: PirGraph, batch: int) -> OrderProblem:
    """The :class:`OrderProblem` of a program's top-level block, one op per
    PIR op (a region op with its regions and synthetic ops); see the module
    docstring.  Sizes at ``batch``."""
    grouped = graph_ops_of(pg)
    ops = [op for op, _ in grouped]
    block0 = pg.graph.blocks[0].ops
    regions = regions_of(pg)  # graph position of a region op -> (reads, writes)
    position = {op.id(): i for i, op in enumerate(ops)}
    after: List[set] = [set() for _ in ops]
    readers: dict = {}   # value id -> reading op positions
    alias_of: dict = {}  # value id -> the value id whose buffer it may share
    region_at: dict = {}  # op position -> (values read, values written) of a region op
    for i, (op, where) in enumerate(grouped):
        for k in where:
            if k in regions:
                reads, writes = regions[k]
                region_at[i] = ([pg.values[n] for n in sorted(reads) if n in pg.values],
                                [pg.values[n] for n in sorted(writes) if n in pg.values])
    for i, op in enumerate(ops):
        operands = list(op.operands_source()) + list(region_at.get(i, ([], []))[0])
        for v in operands:
            if not v.initialized():
                continue
            d = v.get_defining_op()
            if d is not None and d.id() in position:
                after[i].add(position[d.id()])
            readers.setdefault(v.id, set()).add(i)
        if op.name() in _VIEW_OPS:
            srcs = [v for v in op.operands_source() if v.initialized()]
            for r in op.results():
                if srcs and r.initialized():
                    alias_of[r.id] = alias_of.get(srcs[0].id, srcs[0].id)
    # views' readers count as readers of the viewed buffer
    for vid, root in alias_of.items():
        readers.setdefault(root, set()).update(readers.get(vid, ()))
    from paddle.base import core

    last_sink = last_random = last_comm = None
    for i, op in enumerate(ops):
        written = []  # the values op writes over
        if op.name().endswith("_") and not op.name().startswith("builtin."):
            try:
                pairs = core.pir.get_op_inplace_info(op)
            except Exception:
                pairs = {}
            written = [op.operand_source(in_slot) for in_slot in pairs.values()]
        if i in region_at:
            written += region_at[i][1]
        for v in written:
            if not v.initialized():
                continue
            root = alias_of.get(v.id, v.id)
            # readers before it stay before it, readers after it (of the
            # same data, as a same-dims reshape_ leaves it) stay after
            for r in readers.get(root, set()) | readers.get(v.id, set()):
                if r < i:
                    after[i].add(r)
                elif r > i:
                    after[r].add(i)
        if op.num_results() == 0 or op.name() in FETCH_OPS or op.name() in SIDE_EFFECT_OPS \
                or i in region_at:
            if last_sink is not None:
                after[i].add(last_sink)
            last_sink = i
        if draws_random(op) or i in region_at:
            if last_random is not None:
                after[i].add(last_random)
            last_random = i
        if is_communication(op.name()) or i in region_at:  # (a region may hold some)
            if last_comm is not None:
                after[i].add(last_comm)
            last_comm = i
    var_of = {var.name: var for _, var in pg.graph.all_vars()}
    keep = frozenset(name for name, var in var_of.items()
                     if var.persistable or var.is_feed or var.is_data or var.is_fetch
                     or name in pg.graph.fetch_names)
    out = []
    for i, (op, where) in enumerate(grouped):
        gops = [block0[k] for k in where]
        makes, reads = {}, []
        for gop in gops:
            shape_only = set(gop.facts.no_need_buffer)
            reads += [n for n in gop.reads if n not in shape_only]
            for name in gop.writes:
                var = var_of.get(name)
                if var is not None and var.is_dense and not var.persistable:
                    makes[name] = var.size.at(batch)
        for k in where:
            if k in regions:
                reads += sorted(regions[k][0])
        for j in list(after[i]):
            if j == i:
                after[i].discard(j)
        out.append(OrderOp(after=tuple(sorted(after[i])), makes=makes,
                           reads=tuple(dict.fromkeys(reads)),
                           pinned=op.name() in (PARAMETER_OP, *DATA_OPS),
                           optimize=any(g.role == "optimize" for g in gops)))
    return OrderProblem(out, keep)


def apply_order(program, order: List[int]) -> None:
    """Put the top-level ops of ``program`` in ``order`` (indices into the
    current order) with ``Operation.move_before``, then check that the block
    holds exactly that order; otherwise put the ops back in their first order
    and raise PlanError."""
    block = program.global_block()
    ops = list(block.ops)
    if sorted(order) != list(range(len(ops))):
        raise PlanError("apply_order: not a permutation of the block's ops")
    if order == list(range(len(ops))):
        return
    _move_into(ops, order)
    got = [op.id() for op in block.ops]
    want = [ops[i].id() for i in order]
    if got != want:
        _move_into(ops, list(range(len(ops))))
        raise PlanError("apply_order: the block's ops are not in the planned order after "
                        "the moves (the program's own order is restored)")


def _move_into(ops: list, order: List[int]) -> None:
    """Move ``ops`` (a block's ops as read) into ``order``: the last one of
    ``order`` stays, every other moves right before it, in turn."""
    anchor = ops[order[-1]]
    for i in order[:-1]:
        ops[i].move_before(anchor)


class OrderChoice:
    """What :func:`plan_order` chose: ``name`` of the order, ``order`` (None:
    keep the program's), ``peaks`` ``{order name: predicted total peak}``
    and ``schedule_peaks`` the same under the sequential (program-order)
    executor model."""

    def __init__(self, name: str, order: Optional[List[int]], peaks: dict,
                 note: str = "") -> None:
        self.name, self.order, self.peaks, self.note = name, order, peaks, note


def choose_order(table: dict, orders: dict, min_gain: float) -> OrderChoice:
    """Level 2's rule, both IRs: ``table`` ``{order name: {mode: predicted
    peak}}`` (``"program"``: the program as it is; ``"own"``: the
    executor's own mode), ``orders`` ``{order name: order}``.  The order
    predicted lowest under the executor's own mode wins if it is at least
    ``min_gain`` lower than the program's and higher under no mode;
    otherwise the next lowest is tried, and if none passes the program's
    own order stays (the note names the modes that would have risen)."""
    peaks = {name: row["own"] for name, row in table.items()}
    base = table["program"]
    refused = []
    for name in sorted(orders, key=lambda n: (peaks[n], list(orders).index(n))):
        if name == "program" or peaks[name] > base["own"] * (1 - min_gain):
            break
        risen = [m for m, v in table[name].items() if v > base[m]]
        if risen:
            refused.append(f"{name} (higher under {', '.join(risen)})")
            continue
        return OrderChoice(name, orders[name], peaks)
    note = ""
    if refused:
        note = ("level 2: the program's own order kept: orders predicted lower under the "
                "executor's own mode would raise the peak under another: " + "; ".join(refused))
    return OrderChoice("program", None, peaks, note)


def executor_modes(runtime) -> List[Tuple[str, object]]:
    """``[(label, RuntimeModel)]``: the executor modes a new order is checked
    under -- the runtime's own first, then the program-order schedule
    (``FLAGS_new_executor_sequential_run=1``) and the dataflow schedule with
    4 workers and each of :data:`memopt.paddle.pir.budget.WORKERS_CHECKED`
    (a loaded machine runs fewer threads at once).  With the GC off nothing
    is freed during a step and the order changes nothing: the own mode only."""
    from dataclasses import replace

    from .budget import WORKERS_CHECKED

    modes = [("own", runtime)]
    if not runtime.gc:
        return modes
    others = [("program", replace(runtime, schedule="program"))]
    others += [(f"dataflow/{w}", replace(runtime, schedule="dataflow", workers=w))
               for w in sorted({4, *WORKERS_CHECKED}, reverse=True)]
    modes += [(label, m) for label, m in others if m != runtime]
    return modes


def mode_peaks(program, batch: int, modes, order: Optional[List[int]] = None,
               fetch=()) -> dict:
    """``{mode label: predicted total peak}`` and ``{mode label + "+lag":
    the same with frees GC_LAG_OPS ops late}`` of ``program`` (with its
    top-level ops in ``order``, if given: applied to a clone), analysed as
    :func:`memopt.analyze` does under each of ``modes``
    (:func:`executor_modes`).  ``fetch``: the Values of ``program`` the
    user fetches, alive to the end of the step (the executor's fetch ops
    read them last), as in the peak memory_optimize reports."""
    from .inplace import executor_inplace

    clone = program
    fetch = list(fetch)
    if order is not None:
        import paddle

        mapping = paddle.pir.IrMapping()
        clone = program.clone(mapping)
        fetch = [mapping.look_up(v) for v in fetch]
        apply_order(clone, order)
    pg = convert(clone, fetch, labels=order is None)  # a throwaway clone: peaks only
    own = modes[0][1]
    pairs = executor_inplace(pg, (), own.device) if own.inplace else []
    return peaks_by_mode(pg.graph, batch, modes, pairs)


def peaks_by_mode(graph, batch: int, modes, inplace=(), same_variable=()) -> dict:
    """``{mode label: predicted total peak}`` of ``graph`` under each of
    ``modes``, and for a mode with the GC on ``{label + "+lag": the same
    with frees GC_LAG_OPS ops late}`` (both IRs' :func:`mode_peaks`)."""
    from ... import analysis
    from .budget import GC_LAG_OPS

    out = {}
    analyses = analysis.from_graph_modes(graph, batch, [mode for _, mode in modes], inplace,
                                         same_variable)
    for (label, mode), an in zip(modes, analyses):
        out[label] = an.total_peak(batch)
        if mode.gc:
            out[label + "+lag"] = an.total_peak_pending(GC_LAG_OPS, batch)
    return out


#: The least share of the predicted peak a new order must save to be
#: applied.  The executor model is exact for a program's own order; a new
#: order also changes which ready op the multi-thread executor picks first,
#: which the model follows less closely (measured: a DenseNet order
#: predicted 0.007% lower measured 12-16% higher in two fresh processes).
MIN_GAIN = 0.01


def plan_order(program, batch: int, runtime=None, fetch=()) -> OrderChoice:
    """Choose the top-level order of ``program`` with the lowest predicted
    peak at ``batch`` (see the module docstring); the program is not
    changed.

    A new order is kept only if it is safe by construction as far as the
    model sees: it lowers the runtime's own predicted peak by at least
    :data:`MIN_GAIN` and raises the predicted peak under none of the
    executor modes of :func:`executor_modes`, with frees on time or up to
    :data:`memopt.paddle.pir.budget.GC_LAG_OPS` ops late.  Otherwise the
    program's own order stays (``OrderChoice.note`` names the mode that
    would have risen).  ``fetch``: the Values of ``program`` the user
    fetches (alive to the end of the step, see :func:`mode_peaks`)."""
    from ..flags import runtime_model

    runtime = runtime or runtime_model("pir")
    fetch = list(fetch)
    pg = convert(program, fetch)
    problem = order_problem(pg, batch)
    modes = executor_modes(runtime)
    table = {}
    orders = {}
    for name, order in candidate_orders(problem):
        check_topological(problem, order)
        table[name] = mode_peaks(program, batch, modes, order, fetch)
        orders[name] = order
    return choose_order(table, orders, MIN_GAIN)


def any_order_bound(program, batch: int, runtime=None, fetch=()) -> Tuple[int, int]:
    """``(bytes, op position)``: a lower bound on the predicted total peak
    of every order of ``program``'s top-level ops that keeps the
    dependencies of :func:`order_problem`, and the op where it is reached.

    At op ``o`` a buffer (an in-place chain counted once, as
    :mod:`memopt.analysis` counts it for the program's own order) is alive
    in every such order if ``o`` or an op ``o`` depends on makes it and
    ``o`` or an op depending on ``o`` reads its data (or it is kept to the
    end: fetched, fed); the bound is the largest sum over the ops, plus the
    persistable bytes.  A region op counts as one op reading what its
    regions read; the values made inside regions are left out (still a
    lower bound, a looser one: 0.62-0.87 of the program order's predicted
    peak on memopt.testing.models' region programs).  An op's kernel workspace
    (the im2col buffer of a convolution's backward op) counts at that op
    where the top-level ops are all the ops."""
    from ..flags import runtime_model
    from .inplace import executor_inplace
    from ... import analysis

    runtime = runtime or runtime_model("pir")
    pg = convert(program, list(fetch))
    problem = order_problem(pg, batch)
    pairs = executor_inplace(pg, (), runtime.device) if runtime.inplace else []
    an = analysis.from_graph(pg.graph, batch, runtime, pairs)
    n = len(problem.ops)
    anc = [0] * n  # bitsets of the ops each op depends on, transitively
    for i, op in enumerate(problem.ops):
        for j in op.after:
            anc[i] |= anc[j] | (1 << j)
    succ: List[List[int]] = [[] for _ in range(n)]
    for i, op in enumerate(problem.ops):
        for j in op.after:
            succ[j].append(i)
    desc = [0] * n  # ... and the ops depending on each op
    for j in reversed(range(n)):
        for i in succ[j]:
            desc[j] |= desc[i] | (1 << i)
    maker: dict = {}
    readers: dict = {}
    for i, op in enumerate(problem.ops):
        for name in op.makes:
            maker.setdefault(name, i)
        for name in op.reads:
            readers[name] = readers.get(name, 0) | (1 << i)
    buffers = []
    for h in an.holders:
        made = read = 0
        for name in h.names:
            if name in maker:
                made |= 1 << maker[name]
            read |= readers.get(name, 0)
        if made:
            kept = any(name in problem.keep for name in h.names)
            buffers.append((h.bytes(batch), made, read, kept))
    work = [0] * n  # each top-level op's workspace (where flat = top level)
    if len(an.order) == n:
        for h in an.holders:
            if h.category == "workspace" and not h.names and h.op != "fetch":
                work[an.order[h.position]] += h.bytes(batch)
    best, where = 0, 0
    for o in range(n):
        before, after = anc[o] | (1 << o), desc[o] | (1 << o)
        live = work[o] + sum(size for size, made, read, kept in buffers
                             if made & before and (kept or read & after or (made >> o) & 1))
        if live > best:
            best, where = live, o
    return an.persistable_bytes(batch) + best, where
