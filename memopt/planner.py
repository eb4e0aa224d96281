"""plan_memory: the whole-program memory plan on a :class:`memopt.graph.Graph`.

The work flows one way::

    Graph -> dims-only substitutions -> optimizer schedule -> scoped liveness
          -> candidates and in-place pairs -> grouping -> Plan (pure data)

*Candidates*, *in place* and *dims-only reads*: :mod:`memopt.candidates`;
scopes and control-flow outputs: :mod:`memopt.scopes`; the optimizer
schedule: :mod:`memopt.schedule`.

*Rename*: with the garbage collector off, candidates (after in-place chains
are joined) are grouped so that the members of a group never live at the
same time -- by :func:`memopt.reuse.group_buffers` (the best of
:func:`memopt.reuse.assign_groups`'s orders for up to
:data:`memopt.reuse.SMALL_PROBLEM` buffers, the ``O(n log n)`` sweeps of
:func:`memopt.reuse.best_fit_groups` above that); level 0 groups only
the same shape and dtype, level 1 the same dtype across shapes, provided
every member provably fits (for every batch size) in the memory the group's
earliest member allocates (never across dtypes: Paddle's executor reads each
variable's declared dtype, so a name may not change it).

Runtime awareness: with Paddle's eager-deletion GC on (the default) a
variable's memory is freed after its last use, and renaming would only
stretch lifetimes (a group holds its memory from its first member's birth to
its last member's death) -- so with GC on only in-place reuse, dims-only
reads and the schedule are planned, and a plan whose estimated peak would
rise is dropped.  With GC off nothing is freed during a run, and renaming is
the main win.

The plan is checked (:func:`memopt.verify.check_plan`) before an adapter
applies it.  Imports no Paddle.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

from .any_order import single_reader_rule
from .candidates import (classify, dims_only_substitutions, inplace_pairs, persistable_sizes,
                         reason_counts, substitute, temporaries)
from .graph import Graph, as_size
from .plan import Options, Plan
from .problems import Buffer
from .report import Reuse
from .reporting import estimate
from .reuse import group_buffers
from .schedule import reorder, schedule_optimizer_ops
from .scopes import scoped_liveness
from .verify import check_grouping

__all__ = ["plan_memory"]

log = logging.getLogger(__name__)


def plan_memory(graph: Graph, options: Options, gc: bool, substitutions: bool = True) -> Plan:
    """Plan memory sharing for ``graph`` (see the module docstring).

    Parameters
    ----------
    graph : the program model (from an adapter).
    options : resolved options (level, skip_opt_set, skip_grads).
    gc : plan for Paddle's garbage collector on (dims-only substitutions
        and in-place reuse over an input the op alone reads, nothing else:
        memopt.any_order) or off (also any in-place reuse, the optimizer
        schedule and whole-buffer renaming).
    substitutions : make dims-only substitutions (False: none; the plan for
        a legacy program Paddle will run translated to PIR with its GC on,
        whose collector frees a variable that one op reads both for its
        dims and for its data before that op runs: "Tensor holds no
        memory", measured on Paddle 3.3.1).

    Returns
    -------
    Plan
        Not yet checked: see :func:`check_plan`.
    """

    # dims-only reads: with GC off they let a variable's memory be taken
    # over after its last real use; with GC on (Paddle frees such a variable
    # early itself) they let an op run in place on it (a conv's bias add)
    subs = dims_only_substitutions(graph) if substitutions else []
    substituted = substitute(graph, subs) if subs else graph
    # with GC on Paddle frees a variable read for its dims only after its
    # last real use: the reference the estimates compare with
    reference = substituted if gc else graph
    original, live, intervals, free, excluded = scoped_liveness(reference)
    before = temporaries(original, intervals)
    plan = Plan(gc=gc, level=options.level, before=before, substitutions=subs)
    graph = substituted
    # with GC on, only what holds in every order the multi-thread executor
    # may pick (memopt.any_order): no moved ops, in place only over an input
    # the op alone reads
    order = None if gc else schedule_optimizer_ops(graph)
    if order is not None:
        plan.order = order
        plan.moved = sum(1 for k, i in enumerate(order) if i != k and
                         graph.blocks[0].ops[i].role == "optimize" and i > k)
        graph = reorder(graph, order)
    plan.scheduled = graph
    changed = graph is not reference
    if changed:
        graph, live, intervals, free, excluded = scoped_liveness(graph)
    else:
        graph = original
    candidates, reason_of, home = classify(graph, options, intervals, free, excluded)
    plan.reasons = reason_counts(reason_of)

    var_of = {name: graph.blocks[home[name]].vars[name] for name in home}
    plan.persistable = persistable_sizes(graph, home)
    plan.buffers = temporaries(graph, intervals) if changed else before

    # in-place chains: union of (input, output) pairs, head = the first input
    pairs = inplace_pairs(graph, live, candidates, intervals, options.level,
                          single_reader_rule(graph) if gc else None)
    plan.inplace = pairs
    head: Dict[str, str] = {}
    for src, dst, _ in pairs:
        head[dst] = head.get(src, src)
    chains: Dict[str, List[str]] = {}
    for name in sorted(candidates, key=lambda n: (intervals[n].start, n)):
        chains.setdefault(head.get(name, name), []).append(name)
    chain_buffers = []
    for first, members in chains.items():
        lower = min(plan.buffers[m].lower for m in members)
        upper = max(plan.buffers[m].upper for m in members)
        chain_buffers.append(Buffer(first, lower, upper, plan.buffers[first].size))

    if gc:
        grouped = [[b] for b in chain_buffers]
    else:
        compatible, fits = _predicates(var_of, home, options.level)
        grouped = group_buffers(chain_buffers, _klass(var_of, home, options.level), fits)
        check_grouping(chain_buffers, grouped, compatible, fits)

    inplace_at = {(src, dst): pos for src, dst, pos in pairs}
    op_at = {pos: live.positions[pos][2].type for _, _, pos in pairs}
    for group in grouped:
        members = [m for buf in sorted(group, key=lambda b: (b.lower, str(b.id)))
                   for m in chains[buf.id]]
        if len(members) < 2:
            continue
        owner = members[0]
        plan.groups.append(members)
        block_renames = plan.renames.setdefault(home[owner], {})
        for prev, cur in zip(members, members[1:]):
            block_renames[cur] = owner
            var = var_of[cur]
            pos = inplace_at.get((prev, cur))
            plan.reuses.append(Reuse(
                var=cur, takes=prev, renamed_to=owner, shape=tuple(var.shape),
                dtype=var.dtype, size=var.size, block=home[cur],
                how="in-place" if pos is not None else "rename",
                op=op_at[pos] if pos is not None else ""))
    plan.estimates = estimate(plan, gc)
    if gc and plan.estimates[1] > plan.estimates[0]:
        # never raise the peak the garbage collector reaches on its own
        plan.notes.append("no change: the plan would have raised the estimated peak")
        plan.order, plan.moved, plan.renames, plan.groups = None, 0, {}, []
        plan.substitutions = []
        plan.reuses, plan.inplace, plan.buffers = [], [], plan.before
        plan.estimates = estimate(plan, gc)
    log.debug("plan (gc=%s, level %d): %d candidates, %d in place, %d groups, %d ops moved",
              gc, options.level, len(candidates), len(pairs), len(plan.groups), plan.moved)
    return plan


def _klass(var_of: Dict[str, Any], home: Dict[str, int], level: int
           ) -> Callable[[Buffer], Hashable]:
    """Compatibility class of a buffer: its block and dtype (level 1), plus
    its shape (level 0).  Buffers of different classes never share."""
    def klass(buf: Buffer) -> Hashable:
        var = var_of[buf.id]
        if level == 0:
            return home[buf.id], tuple(var.shape), var.dtype
        return home[buf.id], var.dtype

    return klass


def _predicates(var_of: Dict[str, Any], home: Dict[str, int], level: int
                ) -> Tuple[Callable[[Buffer, Buffer], bool],
                           Optional[Callable[[Buffer, Buffer], bool]]]:
    def compatible(a: Buffer, b: Buffer) -> bool:
        if home[a.id] != home[b.id]:
            return False
        va, vb = var_of[a.id], var_of[b.id]
        if va.dtype != vb.dtype:
            # Paddle's executor reads declared dtypes (type promotion, kernel
            # choice): a name may not change dtype, at any level
            return False
        return level == 1 or tuple(va.shape) == tuple(vb.shape)

    def fits(member: Buffer, first: Buffer) -> bool:
        return as_size(member.size).provably_le(as_size(first.size))

    return compatible, (fits if level == 1 else None)
