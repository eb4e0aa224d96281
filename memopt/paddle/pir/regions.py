"""What the region ops of a PIR program's top-level block touch.

A region op (``pd_op.if``, ``pd_op.while``, any op with regions) runs
blocks of its own, and PIR lets an inner block use any value of the blocks
around it.  Recomputation (:mod:`memopt.paddle.pir.recompute`) and level 2's
order (:mod:`memopt.paddle.pir.schedule`) treat such an op as opaque: it is
never cloned or split, and

- every value of the top-level block it reads -- its operands and the
  values its regions read at any depth -- is *read by the region*: never
  dropped (a clone is never read inside a region) and, for the order, a
  data dependency of the op;
- every value of the top-level block an op inside it writes over
  (``assign_out_``, ``array_write_``, any in-place op on an outer value; a
  ``while``'s carried values, written by its body; the stack a
  ``cf.tuple_push`` / ``cf.tuple_pop`` inside changes, as its stack, inlet
  and outlet values) is *written by the region*, with every view of it
  (:data:`VIEW_OPS`): a clone never reads
  it or makes it again (its data depends on whether the region ran yet),
  and the order keeps the region on the same side of every other reader.

:func:`top_level_ops` lines up the ops of the graph's block 0 (as
:func:`memopt.paddle.pir.program.convert` reads it: synthetic ``if/out``,
``while/in``, ``while/out`` ops included) with the PIR ops of the program's
top-level block.  For a program without regions every set here is empty and
every list is ``pg.ops``.
"""
from __future__ import annotations

import re
from typing import Dict, List, Tuple

from .program import COMBINE_OP, POP_OP, PUSH_OP, PirGraph

__all__ = ["VIEW_OPS", "top_level_ops", "region_reads", "region_writes", "regions_of",
           "graph_ops_of"]

#: Ops whose result may share the operand's buffer (a view).
VIEW_OPS = frozenset({
    "pd_op.reshape", "pd_op.reshape_", "pd_op.squeeze", "pd_op.squeeze_",
    "pd_op.unsqueeze", "pd_op.unsqueeze_", "pd_op.flatten", "pd_op.flatten_",
    "pd_op.view_dtype", "pd_op.view_shape", "pd_op.as_strided", "pd_op.share_data_",
    "pd_op.slice", "pd_op.split", "pd_op.split_with_num", "pd_op.transpose",
    "pd_op.strided_slice", "pd_op.unbind", "pd_op.diagonal", "pd_op.depend",
    "builtin.combine", "builtin.split", "builtin.slice"})


def top_level_ops(pg: PirGraph) -> list:
    """The PIR op of each op of ``pg.graph.blocks[0]``, None for a
    synthetic op (``if/out``, ``while/in``, ...: no PIR op of its own);
    ``pg.ops`` itself for a program without regions."""
    cached = pg.__dict__.get("_top_level_ops")
    if cached is not None:
        return cached
    by_id = {op.id(): op for op in pg.program.global_block().ops} if pg.program is not None \
        else {op.id(): op for op in pg.ops if op is not None}
    out = [by_id.get((op.attrs or {}).get("pir_id")) for op in pg.graph.blocks[0].ops]
    pg.__dict__["_top_level_ops"] = out
    return out


def graph_ops_of(pg: PirGraph) -> List[Tuple[object, List[int]]]:
    """``[(PIR op, [positions in graph block 0])]`` per op of the
    program's top-level block, in order: its own graph op with the
    synthetic ops that belong to it (a ``while/in`` right before it, an
    ``if/out`` / ``while/out`` / ``cf.tuple_push/stack`` right after)."""
    out: List[Tuple[object, List[int]]] = []
    pending: List[int] = []
    for k, (gop, pop) in enumerate(zip(pg.graph.blocks[0].ops, top_level_ops(pg))):
        if pop is None:
            if gop.facts.synthetic == "before" or not out:
                pending.append(k)
            else:
                out[-1][1].append(k)
            continue
        out.append((pop, pending + [k]))
        pending = []
    if pending and out:
        out[-1][1].extend(pending)
    return out


def _inner_ops(graph, block_idx: int):
    """Every op of block ``block_idx`` and of the blocks its ops run, at
    any depth."""
    for op in graph.blocks[block_idx].ops:
        yield op
        for sub in op.sub_blocks:
            yield from _inner_ops(graph, sub)


def regions_of(pg: PirGraph) -> Dict[int, Tuple[frozenset, frozenset]]:
    """``{position in graph block 0: (reads, writes)}`` for each region op
    of the top-level block: the names of the top-level values it reads and
    writes over (see the module docstring; views not added yet, see
    :func:`region_writes`).  Its synthetic ops count as part of it."""
    cached = pg.__dict__.get("_regions")
    if cached is not None:
        return cached
    graph = pg.graph
    outer = graph.blocks[0].vars
    top = top_level_ops(pg)
    out: Dict[int, Tuple[frozenset, frozenset]] = {}
    for pop, positions in graph_ops_of(pg):
        gops = [graph.blocks[0].ops[k] for k in positions]
        if not any(g.sub_blocks for g in gops) and not pop.num_regions():
            continue
        reads, writes = set(), set()
        for g in gops:
            reads.update(g.reads)
            if g.sub_blocks and g.loop:
                writes.update(g.writes)  # a while's carried values
            if g.facts.synthetic == "before":
                writes.update(g.writes)
            for sub in g.sub_blocks:
                for inner in _inner_ops(graph, sub):
                    reads.update(n for n in inner.reads if n in outer)
                    written = [src for src, _ in inner.facts.overwrites]
                    if inner.type.endswith("_") and not inner.type.startswith("builtin.") \
                            and not inner.facts.overwrites:
                        written = list(inner.reads)  # in place, slots unknown: all of them
                    written += list(inner.writes)
                    if inner.type in (PUSH_OP, POP_OP) and inner.reads:
                        written += _stack_names(inner.reads[0])
                    writes.update(n for n in written if n in outer)
        reads.update(_external_names(pg, pop))
        if not any(g.sub_blocks for g in gops):
            writes.update(reads)  # regions the graph does not walk: any of it may be written
        head = next(k for k in positions if top[k] is not None)
        out[head] = (frozenset(reads), frozenset(writes))
    pg.__dict__["_regions"] = out
    return out


_STACK_VALUE = re.compile(r"^%(stack|inlet|outlet)_(\d+)$")


def _stack_names(name: str) -> List[str]:
    """All three values of the ``cf.stack_create`` that made ``name`` (a
    stack, its inlet or its outlet): a push or a pop changes the stack each
    names, as ``cf.has_elements`` (a while_grad's condition) reads it."""
    m = _STACK_VALUE.match(name)
    if m is None:
        return []
    return [f"%{kind}_{m.group(2)}" for kind in ("stack", "inlet", "outlet")]


def _external_names(pg: PirGraph, pir_op) -> List[str]:
    """Names of the values defined outside ``pir_op`` that its regions use
    (Paddle's own ``get_used_external_value``), and of the elements of
    those that are vectors."""
    from paddle.base import core

    names = []
    try:
        values = list(core.pir.get_used_external_value(pir_op))
    except Exception:  # pragma: no cover - ops Paddle cannot answer for
        values = []
    for v in values:
        d = v.get_defining_op() if v.initialized() else None
        if d is not None and d.name() == COMBINE_OP:
            names += [pg.name_of[e.id] for e in d.operands_source()
                      if e.initialized() and e.id in pg.name_of]
        if v.initialized() and v.id in pg.name_of:
            names.append(pg.name_of[v.id])
    return names


def region_reads(pg: PirGraph) -> frozenset:
    """The names of the top-level values some region op reads."""
    return frozenset(n for reads, _ in regions_of(pg).values() for n in reads)


def region_writes(pg: PirGraph) -> frozenset:
    """The names of the top-level values some region op writes over, with
    every top-level view of them and every value they are views of
    (:data:`VIEW_OPS`), to a fixed point."""
    written = {n for _, writes in regions_of(pg).values() for n in writes}
    if not written:
        return frozenset()
    views = [(op.reads, op.writes) for op in pg.graph.blocks[0].ops if op.type in VIEW_OPS]
    grew = True
    while grew:
        grew = False
        for reads, writes in views:
            linked = set(reads[:1]) | set(writes)
            if linked & written and not linked <= written:
                written |= linked
                grew = True
    return frozenset(written)
