"""TFP's ``auto_batching.liveness``: :func:`liveness_analysis` of one
control-flow graph in TFP's IR, as :class:`LivenessInfo` per block.

The analysis is the project's one liveness core, :mod:`memopt.liveness`,
over one node per instruction and one per terminator; this module only
builds that graph and reads the answer back in TFP's shape.  Unlike TFP's
(loop-free graphs only), it solves loops too (a backward jump is fine).
As in TFP: a write (``PrimOp``, ``FunctionCallOp``) kills its variables, a
``PopOp`` makes its variables live (their values are read back from the
stack), and a graph with ``PushGotoOp`` or ``IndirectGotoOp`` (lowered
calls) is refused.
"""
from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Sequence

from memopt.liveness import FlowNode, analyze

from autobatch.ir import (
    BranchOp, ControlFlowGraph, GotoOp, IndirectGotoOp, PopOp, PushGotoOp, ReturnOp,
    pattern_leaves, as_pattern,
)

__all__ = ["LivenessInfo", "liveness_analysis"]


class LivenessInfo(NamedTuple):
    """Liveness around one block: the variables live into it
    (``frozenset``), after each of its instructions (a list parallel to
    ``block.instructions``), and out of it (into its successors; the
    terminator's own reads excluded)."""

    live_into_block: frozenset
    live_out_instructions: List[frozenset]
    live_out_of_block: frozenset


def _targets(block: Any) -> List[Any]:
    """Jump targets of ``block``'s terminator (None: leaves the graph)."""
    term = block.terminator
    if isinstance(term, (PushGotoOp, IndirectGotoOp)):
        raise ValueError(f"Liveness analysis didn't expect {type(term).__name__} (block "
                         f"{block.label_str}): analyze graphs before lowering their calls")
    if isinstance(term, BranchOp):
        return [term.true_target, term.false_target]
    if isinstance(term, GotoOp):
        return [term.target]
    if isinstance(term, ReturnOp):
        return [None]
    raise ValueError(f"Invalid terminator instruction {term!r} in block {block.label_str}")


def liveness_analysis(graph: Any, live_out: Sequence[str]) -> Dict[Any, LivenessInfo]:
    """TFP's ``liveness_analysis(graph, live_out)``.

    Parameters
    ----------
    graph : a :class:`~autobatch.ir.ControlFlowGraph` (or list of Blocks),
        entry first; jump targets Blocks, block names, or None (the exit).
    live_out : the variables live when the graph exits.

    Returns
    -------
    ``{block: LivenessInfo}`` for every block, plus ``None`` (the exit):
    ``LivenessInfo(frozenset(live_out), [], frozenset(live_out))``.

    Raises
    ------
    ValueError : a lowered jump (push-goto, indirect goto), an unknown
        terminator, or a jump to a block not in ``graph``.
    """
    blocks = list(graph.blocks if isinstance(graph, ControlFlowGraph) else graph)
    start: Dict[int, int] = {}
    position = 0
    for block in blocks:
        start[id(block)] = position
        position += len(block.instructions) + 1
    by_name = {block.name: block for block in blocks if block.name is not None}

    def node_of(target: Any) -> Any:
        if target is None:
            return None
        block = by_name.get(target) if isinstance(target, str) else target
        if block is None or id(block) not in start:
            raise ValueError(f"a jump targets block {getattr(target, 'name', target)!r}, "
                             f"which is not in the graph")
        return start[id(block)]

    nodes: List[FlowNode] = []
    successors: List[List[Any]] = []
    for block in blocks:
        for k, op in enumerate(block.instructions):
            if isinstance(op, PopOp):
                reads, writes = tuple(op.vars), ()
            else:
                reads = tuple(pattern_leaves(as_pattern(tuple(op.reads))))
                writes = tuple(op.writes)
            nodes.append(FlowNode(reads, writes, (start[id(block)] + k + 1,)))
        succ = [node_of(t) for t in _targets(block)]
        successors.append(succ)
        nodes.append(FlowNode(tuple(block.terminator.reads), (),
                              tuple(dict.fromkeys(s for s in succ if s is not None))))
    live = analyze(nodes, live_at_exit=tuple(live_out), entry=0)
    exit_set = frozenset(live_out)
    answer: Dict[Any, LivenessInfo] = {None: LivenessInfo(exit_set, [], exit_set)}
    for block, succ in zip(blocks, successors):
        first = start[id(block)]
        after = [frozenset(live.live_out(first + k)) for k in range(len(block.instructions))]
        out = frozenset().union(*(exit_set if s is None else frozenset(live.live_in(s))
                                  for s in succ))
        answer[block] = LivenessInfo(frozenset(live.live_in(first)), after, out)
    return answer
