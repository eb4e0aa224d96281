"""Op orders: optimizer ops moved up to right after their gradients.

A training program runs every optimizer op at its end, so every parameter
gradient lives until then.  :func:`schedule_optimizer_ops` moves each
optimizer op up to right after the last op it depends on, as Paddle's PIR
executor does, so each gradient dies as soon as it is applied;
:func:`reorder` is the graph in a given order (the one reorderer of block
0's ops).  :func:`memopt.verify.verify_order` checks an order independently.
Imports no Paddle.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from .graph import Block, Graph

__all__ = ["schedule_optimizer_ops", "reorder"]


def schedule_optimizer_ops(graph: Graph) -> Optional[List[int]]:
    """Move every optimizer op of block 0 up to right after the last op it
    depends on; None when nothing moves.

    A training program runs all optimizer ops at its end, so every gradient
    of a parameter is held until then.  Run right after its gradient is
    complete, an optimizer op lets that gradient die at once (Paddle's PIR
    executor schedules them so too).  An optimizer op (role ``"optimize"``,
    no sub-blocks) moves up past ops it does not depend on: it stays after
    every op that writes what it reads or reads or writes what it writes,
    and never crosses an op that runs sub-blocks.  Optimizer ops keep their
    relative order where they share a dependency.  The result is the new
    order as indices of the original ops.
    """
    ops = graph.blocks[0].ops
    if not any(op.role == "optimize" for op in ops):
        return None
    last_write: Dict[str, tuple] = {}
    last_access: Dict[str, tuple] = {}
    barrier: tuple = ()
    keys: List[tuple] = []
    for i, op in enumerate(ops):
        if op.role == "optimize" and not op.sub_blocks:
            dep = barrier
            for name in op.reads:
                dep = max(dep, last_write.get(name, ()))
            for name in op.writes:
                dep = max(dep, last_access.get(name, ()))
            key = dep + (0.5, i) if dep else (-1, i)
        else:
            key = (i,)
        if op.sub_blocks:
            barrier = max(barrier, key)
        for name in op.writes:
            last_write[name] = max(last_write.get(name, ()), key)
        for name in (*op.reads, *op.writes):
            last_access[name] = max(last_access.get(name, ()), key)
        keys.append(key)
    order = sorted(range(len(ops)), key=lambda i: keys[i])
    return None if order == list(range(len(ops))) else order


def reorder(graph: Graph, order: List[int]) -> Graph:
    """A graph sharing ``graph``'s blocks and ops, block 0's ops in ``order``."""
    b0 = graph.blocks[0]
    new0 = Block(0, b0.parent, [b0.ops[i] for i in order], b0.vars)
    return Graph(blocks=[new0, *graph.blocks[1:]], fetch_names=graph.fetch_names)
