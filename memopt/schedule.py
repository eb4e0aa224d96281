"""Op orders: optimizer ops moved up, and memory-aware orders of a block.

A training program runs every optimizer op at its end, so every parameter
gradient lives until then.  :func:`schedule_optimizer_ops` moves each
optimizer op up to right after the last op it depends on, as Paddle's PIR
executor does, so each gradient dies as soon as it is applied;
:func:`reorder` is the graph in a given order (the one reorderer of block
0's ops).  :func:`memopt.verify.verify_order` checks an order independently.
Imports no Paddle.

Memory-aware orders (``memory_optimize(level=2)``)
--------------------------------------------------
The order ops run in decides how many values are alive at once: a value
made early and read late, or branches whose temporaries pile up, raise the
peak, and another valid order of the same ops can lower it at no compute
cost (PyTorch Inductor's ``reorder_for_peak_memory``, Serenity, MLSys'20).

This module is pure data (no Paddle).  An adapter describes one block as an
:class:`OrderProblem` -- for every op the ops it must follow and the bytes
of the values it makes and reads -- and :func:`candidate_orders` returns a
few topological orders of it; the adapter keeps the one whose peak, under
its runtime's memory model (:mod:`memopt.analysis`), is lowest, and only if
it is lower than the program's own.

The orders:

- ``"program"``: the ops as written (the baseline, always first);
- ``"optimizer"``: the program's order with optimizer ops moved up to
  right after their gradients (:func:`optimizer_up_order`);
- ``"greedy"``: list scheduling that runs, among the ready ops, the one that
  adds the fewest live bytes (bytes it makes minus bytes of values it reads
  for the last time); ties go to the earliest op of the program;
- ``"depth"``: depth first from the end: every op is placed right after the
  last of its inputs is ready, visiting inputs largest-first, so a branch is
  finished before the next starts (the order that lowers the peak of
  branchy, concat-heavy nets such as U-Nets and DenseNets).

Units: bytes at one concrete batch size (the adapter evaluates the symbolic
sizes); positions are indices into :attr:`OrderProblem.ops`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .errors import PlanError
from .graph import Block, Graph

__all__ = ["schedule_optimizer_ops", "reorder", "OrderOp", "OrderProblem", "candidate_orders",
           "greedy_order", "depth_first_order", "optimizer_up_order", "check_topological", "simulated_peak",
           "best_order"]


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


@dataclass
class OrderOp:
    """One op of an :class:`OrderProblem`.

    ``after`` are the indices of the ops it must follow (data dependencies
    and any ordering the adapter adds: an op that overwrites a value runs
    after every other reader of it); ``makes`` the values it writes with
    their bytes; ``reads`` the values whose memory it needs (shape-only
    reads left out).  ``pinned`` ops (declarations: parameters, feeds) keep
    their place at the front.
    """

    after: Tuple[int, ...] = ()
    makes: Dict[str, int] = field(default_factory=dict)
    reads: Tuple[str, ...] = ()
    pinned: bool = False
    #: an optimizer op: the ``"optimizer"`` order runs it as soon as it may
    optimize: bool = False


@dataclass
class OrderProblem:
    """One block's ops in program order; ``keep`` are values live to the end
    (fetched, fed, persistable): never freed."""

    ops: List[OrderOp]
    keep: frozenset = frozenset()


def check_topological(problem: OrderProblem, order: Sequence[int]) -> None:
    """Raise :class:`PlanError` unless ``order`` is a permutation of the ops
    in which every op comes after all ops in its ``after``."""
    n = len(problem.ops)
    if sorted(order) != list(range(n)):
        raise PlanError("the new op order is not a permutation of the block's ops")
    pos = [0] * n
    for k, i in enumerate(order):
        pos[i] = k
    for i, op in enumerate(problem.ops):
        for j in op.after:
            if pos[j] > pos[i]:
                raise PlanError(f"op {i} would run before op {j}, which it depends on")


def _readers(problem: OrderProblem) -> Dict[str, int]:
    count: Dict[str, int] = {}
    for op in problem.ops:
        for name in set(op.reads):
            count[name] = count.get(name, 0) + 1
    return count


def simulated_peak(problem: OrderProblem, order: Sequence[int]) -> int:
    """Peak live bytes of ``order`` when each value is freed after its last
    reader (a value nobody reads is freed right after it is made; ``keep``
    values never): the garbage-collected model, without in-place reuse."""
    left = _readers(problem)
    size: Dict[str, int] = {}
    live = peak = 0
    for i in order:
        op = problem.ops[i]
        for name, nbytes in op.makes.items():
            size[name] = nbytes
            live += nbytes
        peak = max(peak, live)
        for name in set(op.reads):
            left[name] -= 1
            if left[name] == 0 and name in size and name not in problem.keep:
                live -= size.pop(name)
        for name in op.makes:
            if left.get(name, 0) == 0 and name in size and name not in problem.keep:
                live -= size.pop(name)
    return peak


def greedy_order(problem: OrderProblem) -> List[int]:
    """Run, among the ready ops, the one adding the fewest live bytes (see
    the module docstring); pinned ops first, in their order."""
    ops = problem.ops
    n = len(ops)
    succ: List[List[int]] = [[] for _ in range(n)]
    deps = [0] * n
    for i, op in enumerate(ops):
        for j in set(op.after):
            succ[j].append(i)
            deps[i] += 1
    left = _readers(problem)
    size = {name: b for op in ops for name, b in op.makes.items()}
    order = [i for i in range(n) if ops[i].pinned]
    done = set(order)
    for i in order:
        for k in succ[i]:
            deps[k] -= 1
        for name in set(ops[i].reads):
            left[name] -= 1

    def delta(i: int) -> int:
        op = ops[i]
        freed = sum(size.get(nm, 0) for nm in set(op.reads)
                    if left.get(nm) == 1 and nm not in problem.keep)
        return sum(op.makes.values()) - freed

    readers_of: Dict[str, List[int]] = {}
    for i, op in enumerate(ops):
        for name in set(op.reads):
            readers_of.setdefault(name, []).append(i)
    ready = [(delta(i), i) for i in range(n) if i not in done and deps[i] == 0]
    heapq.heapify(ready)
    while ready:
        d, i = heapq.heappop(ready)
        if i in done:
            continue  # a duplicate entry
        now = delta(i)
        if now != d:  # stale key: a reader ran since it was pushed
            heapq.heappush(ready, (now, i))
            continue
        order.append(i)
        done.add(i)
        for name in set(ops[i].reads):
            left[name] -= 1
            if left[name] == 1:
                # the last reader now frees it: its key got smaller
                for k in readers_of[name]:
                    if k not in done and deps[k] == 0:
                        heapq.heappush(ready, (delta(k), k))
        for k in succ[i]:
            deps[k] -= 1
            if deps[k] == 0 and k not in done:
                heapq.heappush(ready, (delta(k), k))
    if len(order) != n:
        raise PlanError("the ops' dependencies form a cycle")
    return order


def depth_first_order(problem: OrderProblem) -> List[int]:
    """Each op as late as its consumers allow, walking back from the last
    ops: an op's dependencies are placed right before it, the one making the
    most bytes first, so one branch finishes before the next starts."""
    ops = problem.ops
    n = len(ops)
    placed = [False] * n
    order = [i for i in range(n) if ops[i].pinned]
    for i in order:
        placed[i] = True
    weight = [sum(op.makes.values()) for op in ops]
    for root in range(n):
        if placed[root]:
            continue
        stack: List[Tuple[int, int]] = [(root, 0)]
        while stack:
            i, k = stack[-1]
            deps = sorted((j for j in set(ops[i].after) if not placed[j]),
                          key=lambda j: (-weight[j], j))
            if deps:
                stack.append((deps[0], 0))
                continue
            stack.pop()
            if not placed[i]:
                placed[i] = True
                order.append(i)
    return order


def optimizer_up_order(problem: OrderProblem) -> List[int]:
    """The program's order with every optimizer op (``OrderOp.optimize``)
    moved up to right after the last op it must follow, so each parameter
    gradient dies as soon as it is applied instead of at the end of the
    step (what Paddle's multi-thread executor does by itself; its
    sequential mode, ``FLAGS_new_executor_sequential_run``, runs the
    program's order).  Dependent optimizer ops keep their order."""
    ops = problem.ops
    done = [False] * len(ops)
    order: List[int] = []
    waiting = [i for i, op in enumerate(ops) if op.optimize]
    for i, op in enumerate(ops):
        if op.optimize:
            continue
        order.append(i)
        done[i] = True
        still = []
        for j in waiting:
            if all(done[k] for k in ops[j].after):
                order.append(j)
                done[j] = True
            else:
                still.append(j)
        waiting = still
    order.extend(waiting)
    return order


def candidate_orders(problem: OrderProblem) -> List[Tuple[str, List[int]]]:
    """``[(name, order)]``: the program's own order first, then the greedy
    and the depth-first orders (each checked to keep every dependency)."""
    out = [("program", list(range(len(problem.ops))))]
    for name, make in (("optimizer", optimizer_up_order), ("greedy", greedy_order),
                       ("depth", depth_first_order)):
        order = make(problem)
        check_topological(problem, order)
        if all(order != o for _, o in out):
            out.append((name, order))
    return out


def best_order(problem: OrderProblem, peak_of: Callable[[str, List[int]], int]) -> Tuple[str, List[int], Dict[str, int]]:
    """The candidate order with the lowest ``peak_of(name, order)`` (the
    program's own order on ties); returns ``(name, order, {name: peak})``."""
    peaks: Dict[str, int] = {}
    best: Optional[Tuple[int, int, str, List[int]]] = None
    for rank, (name, order) in enumerate(candidate_orders(problem)):
        peak = peak_of(name, order)
        peaks[name] = peak
        if best is None or (peak, rank) < best[:2]:
            best = (peak, rank, name, order)
    assert best is not None
    return best[2], best[3], peaks
