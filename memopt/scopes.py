"""Scopes of sub-blocks, and the outputs of control-flow ops.

Control flow is analysed per scope (:func:`split_shadowed`): a sub-block's
local that shadows a name of an enclosing block is its own variable (Paddle
creates it in the sub-block's scope), so the outer one gets its own
liveness.  An output a control op always writes whole without reading it
(``conditional_block_grad``'s parent-side gradients, the adapter's
``full_writes``) is live from that op on and takes part in its block like
any other variable; the body's values the op reads back after the body ran
(``sub_outputs``: local gradients) are never merged; a value read in the
next loop iteration is live across the whole loop.

:func:`scoped_liveness` is what every candidate rule reads.  Imports no Paddle.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Tuple

from .graph import Block, Graph
from .liveness import Interval, program_liveness

__all__ = ["SCOPE_MARK", "split_shadowed", "scoped_liveness"]


#: Separates a name from the block of its local instance in analysis keys
#: (``name@@block3``); Paddle names never contain it.
SCOPE_MARK = "@@block"


def split_shadowed(graph: Graph) -> Tuple[Graph, set]:
    """The graph with every shadowing local renamed apart, for the analysis.

    A sub-block that declares a (non-persistable) name an enclosing block
    also declares has its own variable: Paddle's executor creates a
    sub-block's declared variables in the sub-block's scope (as the inside
    gradients of a ``conditional_block_grad`` body, copied out to the
    parent's variable after the body runs).  The two are different memory,
    so the local one (and every use that resolves to it) becomes the key
    ``name@@block<k>`` (see :data:`SCOPE_MARK`), and the enclosing block's
    variable gets a liveness of its own.  Returns the graph (``graph``
    itself when nothing shadows) and the set of split keys; ops, blocks and
    variables are shared where unchanged.
    """
    if len(graph.blocks) == 1:
        return graph, set()
    seen: Dict[str, int] = {}
    twice: set = set()
    for block_idx, var in graph.all_vars():
        if seen.setdefault(var.name, block_idx) != block_idx:
            twice.add(var.name)
    if not twice:
        return graph, set()
    def key(name: str, block_idx: int) -> str:
        if name not in twice:
            return name
        home = graph.home_of(name, block_idx)
        if home <= 0 or graph.blocks[home].vars[name].persistable:
            return name
        outer = graph.home_of(name, graph.blocks[home].parent)
        if outer < 0 or graph.blocks[outer].vars[name].persistable:
            return name
        return f"{name}{SCOPE_MARK}{home}"

    split: set = set()
    blocks = []
    for block in graph.blocks:
        variables = block.vars
        local = {n: key(n, block.idx) for n in twice.intersection(block.vars)}
        local = {n: k for n, k in local.items() if k != n}
        if local:
            variables = {local.get(n, n): (replace(v, name=local[n]) if n in local else v)
                         for n, v in block.vars.items()}
            split.update(local.values())
        ops = block.ops
        if any(n in twice for op in ops for n in (*op.reads, *op.writes)):
            ops = []
            for op in block.ops:
                reads = tuple(key(n, block.idx) for n in op.reads)
                writes = tuple(key(n, block.idx) for n in op.writes)
                ops.append(op if (reads, writes) == (op.reads, op.writes)
                           else replace(op, reads=reads, writes=writes))
        blocks.append(Block(block.idx, block.parent, ops, variables))
    if not split:
        return graph, set()
    return Graph(blocks=blocks, fetch_names=graph.fetch_names), split


def scoped_liveness(graph: Graph) -> Tuple[Any, ...]:
    """``(split graph, liveness, intervals, free outputs, excluded names)``:
    :func:`split_shadowed`, then the liveness of the split graph and
    :func:`_with_control_outputs` on it -- what every candidate rule reads."""
    split = split_shadowed(graph)[0]
    live = program_liveness(split)
    return (split, live, *_with_control_outputs(split, live))


def _with_control_outputs(graph: Graph, live: Any) -> Tuple[Dict[str, Any], frozenset, set]:
    """``(intervals, free outputs, excluded names)`` of a split graph: the
    liveness's intervals with those of :func:`_control_outputs` put in;
    excluded: the split locals and the values control ops read back."""
    intervals = live.intervals()
    free, sub_outputs = _control_outputs(graph, live, intervals)
    if free:
        intervals = dict(intervals)
        intervals.update(free)
    split = {n for n in intervals if SCOPE_MARK in n}
    return intervals, frozenset(free), sub_outputs | split


def _control_outputs(graph: Graph, live: Any, intervals: Dict[str, Any]) -> Tuple[Dict[str, "Interval"], set]:
    """Outputs of control ops that may share memory in the op's block.

    A control op's ``facts.full_writes`` (from the adapter) are outputs
    it always writes whole, after its sub-blocks ran, without reading them
    (``conditional_block_grad``'s parent-side gradients: copied from the
    body's local gradients, or zeros when the branch did not run).  The
    liveness counts a control op's outputs as read at its head (a loop or a
    branch may not write them); for such an output ``x`` that is used in
    one block only, written there by this op alone, read only by later
    plain ops and by no control op, the true interval starts at the op:
    returned as ``{x: Interval(position of the op, end)}``.  Also returns
    the names never to merge: ``facts.sub_outputs`` of every control op
    (locals of its sub-blocks the op reads back after they ran: inside
    gradients) and ``facts.aliases`` of any op (variables whose buffer a
    kernel may hand to another: a unary einsum's output, an einsum operand
    its cache may point at).
    """
    sub_outputs: set = set()
    wanted: Dict[str, int] = {}
    for pos, (_, _, op) in enumerate(live.positions):
        # outputs whose kernel may hand back an input's own buffer
        sub_outputs.update(op.facts.aliases)
        if op.sub_blocks:
            for name in op.facts.sub_outputs:
                # the body's own variable: its split key where it shadows one
                # of the op's block (that one is not read back)
                local = [f"{name}{SCOPE_MARK}{s}" for s in op.sub_blocks]
                local = [k for k, s in zip(local, op.sub_blocks) if k in graph.blocks[s].vars]
                sub_outputs.update(local or (name,))
            for name in op.facts.full_writes:
                if name not in op.reads:
                    wanted[name] = -1 if name in wanted else pos
    wanted = {n: p for n, p in wanted.items() if p >= 0 and n in intervals}
    if not wanted:
        return {}, sub_outputs
    bad: set = set()
    block_of: Dict[str, int] = {}
    for pos, (block_idx, _, op) in enumerate(live.positions):
        for name in (*op.reads, *op.writes):
            if name not in wanted:
                continue
            mine = wanted[name]
            if block_of.setdefault(name, live.positions[mine][0]) != block_idx:
                bad.add(name)  # used in another block
            elif pos == mine:
                continue
            elif op.sub_blocks or name in op.writes or pos < mine:
                bad.add(name)  # another control op, another writer, an earlier read
    return {n: Interval(p, max(p, intervals[n].end)) for n, p in wanted.items()
            if n not in bad}, sub_outputs
