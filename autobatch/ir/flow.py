"""Flow facts the passes share.

Here, beside the IR, so that every pass (type_inference,
allocation_strategy, lowering) imports only the IR (and
:mod:`memopt.liveness`), never another pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Set, Tuple

from autobatch.errors import ProgramError
from autobatch.ir.ops import PopOp, PushOp
from memopt.liveness import FlowNode, Liveness, analyze

if TYPE_CHECKING:
    from autobatch.ir.graph import Block, Function

@dataclass
class FunctionFlow:
    """One function as a flow graph for :func:`memopt.liveness.analyze`.

    ``positions[i]`` is ``(block name, k)`` for node ``i``: the ``k``-th
    instruction of that block, or its terminator where ``k`` equals the
    number of instructions.  ``block_start[name]`` is the block's first node.
    """

    function: Function
    nodes: List[FlowNode]
    positions: List[Tuple[str, int]]
    block_start: Dict[str, int]
    liveness: Liveness

    def node(self, block: str, k: int) -> int:
        """The node index of the ``k``-th instruction (or terminator) of ``block``."""
        return self.block_start[block] + k


def function_flow(fn: Function) -> FunctionFlow:
    """Build ``fn``'s flow graph and its liveness.

    A call is one node that reads its arguments and writes its results; a
    ``return`` reads what it returns and has no successor.
    """
    block_start: Dict[str, int] = {}
    positions: List[Tuple[str, int]] = []
    for block in fn.blocks:
        block_start[block.name] = len(positions)
        positions.extend((block.name, k) for k in range(len(block.instructions) + 1))
    nodes: List[FlowNode] = []
    for block in fn.blocks:
        for k, op in enumerate(block.instructions):
            nodes.append(FlowNode(op.reads, op.writes, (block_start[block.name] + k + 1,)))
        term = block.terminator
        if term is None:
            raise ProgramError(f"function {fn.name!r}, block {block.name!r} has no terminator")
        succ = tuple(dict.fromkeys(block_start[t] for t in term.targets))
        nodes.append(FlowNode(term.reads, (), succ))
    liveness = analyze(nodes, live_at_exit=(), entry=0)
    return FunctionFlow(fn, nodes, positions, block_start, liveness)


def drop_repushes(block: Block) -> None:
    """Remove from each ``push`` of a lowered ``block`` the variables popped
    earlier in the block and not written since: their frame slot still holds
    the value (TFP's pop+push fusion; see :mod:`autobatch.stack_optimization`)."""
    intact: Set[str] = set()
    kept = []
    for op in block.instructions:
        if isinstance(op, PushOp):
            rest = tuple(v for v in op.vars if v not in intact)
            if rest:
                kept.append(PushOp(rest))
            continue
        if isinstance(op, PopOp):
            intact.update(op.vars)
        else:
            intact.difference_update(op.writes)
        kept.append(op)
    block.instructions = kept


def check_defined(flow: FunctionFlow) -> None:
    """Raise ProgramError for a variable that may be read before it is written.

    Such a variable is live on entry to the function without being a
    parameter.
    """
    fn = flow.function
    if not flow.nodes:
        return
    undefined = sorted(set(flow.liveness.live_in(0)) - set(fn.params))
    if undefined:
        var = undefined[0]
        readers = [f"{b}" for i, (b, k) in enumerate(flow.positions)
                   if var in flow.nodes[i].reads]
        raise ProgramError(
            f"function {fn.name!r}: variable {var!r} may be read before it is "
            f"written (read in block(s) {sorted(set(readers))}); assign it on every "
            f"path first" + (f" (also undefined: {undefined[1:]})" if len(undefined) > 1
                             else ""))
