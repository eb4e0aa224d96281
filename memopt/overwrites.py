"""Values whose data an in-place op changes while later ops still read them.

An in-place op (``set_value_with_tensor_`` of ``x[1:3] = y``,
``put_along_axis_``, ``masked_fill_``, ``clip_``, ``relu_``) writes its
result over an operand's buffer (:attr:`memopt.graph.OpFacts.overwrites`).
In PIR the operand keeps its name, so an op after the write that reads the
operand reads the written data: in Paddle 3.3.1 the backward of
``before = silu(h); h[1:3] = y`` reads ``h`` as the setitem left it.  A
recomputation that makes such a value again (or reads it for a clone of an
op that ran before the write) gives the data from before the write, and
the step is no longer the unchanged program's.  In a legacy program an op
writes a variable by its name: ``paddle.assign(new, output=buf)`` after
``h - buf`` leaves a clone of ``h - buf`` reading the new ``buf``.
:func:`read_after_overwrite` names those values;
:func:`memopt.recompute.problem_from_graph` bars them
(:attr:`memopt.recompute.RecomputeProblem.barred`).

A write nobody observes (``add_`` over a matmul result no later op reads,
the executor's own in-place pass) bars nothing.  Imports no Paddle.
"""
from __future__ import annotations

from typing import Dict, Set

from .graph import Graph, unversioned

__all__ = ["read_after_overwrite"]


def read_after_overwrite(graph: Graph) -> frozenset:
    """Names in block 0 whose data changes while an op still needs the old
    or the new data for a clone to match:

    - an op writes over them in place (``facts.overwrites``, PIR) and some
      later block-0 op reads them for their data (not only their shape);
    - (legacy, where an op writes a variable by its name) some op writes
      them again after an earlier op read them, before the optimizer's ops
      (``paddle.assign(new, output=running_buf)``: a clone of ``h - buf``
      run in the backward part would read the new ``buf``).  Every version
      (``name#k``) of such a variable is named.
    """
    ops = graph.blocks[0].ops
    last_read: Dict[str, int] = {}
    first_read: Dict[str, int] = {}
    for i, op in enumerate(ops):
        shape_only = set(op.facts.no_need_buffer)
        for name in op.reads:
            if name not in shape_only:
                last_read[name] = i
                first_read.setdefault(unversioned(name), i)
    out = set()
    rewritten: Set[str] = set()
    for i, op in enumerate(ops):
        for src, _dst in op.facts.overwrites:
            if last_read.get(src, -1) > i:
                out.add(src)
        if op.role != "optimize":
            rewritten.update(unversioned(n) for n in op.writes
                             if first_read.get(unversioned(n), i) < i)
    if rewritten:
        out.update(name for name in graph.blocks[0].vars if unversioned(name) in rewritten)
        out.update(name for op in ops for name in op.reads if unversioned(name) in rewritten)
    return frozenset(out)
