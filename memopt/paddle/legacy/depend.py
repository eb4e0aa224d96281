"""Legacy ``depend`` ops: how memopt makes Paddle's legacy executor keep an
order, and how it reads a program that has them.

Paddle's ProgramInterpreter runs every op whose inputs are ready, several at
once, whatever their places in the program (measured, see
:func:`memopt.paddle.legacy.schedule.order_edges`).  ``depend(X=[x],
Dep=[z], Out=[x])`` makes every later reader of ``x`` wait until ``z`` is
written, and does nothing else: its kernel checks that ``X`` and ``Out``
are one variable and leaves it as it is (Paddle 3.3.1 refuses ``X != Out``).
:func:`insert_depend` / :func:`insert_depends` put such ops in block 0
(level 2's order, :mod:`memopt.paddle.legacy.schedule`; recomputation's
copies, :mod:`memopt.paddle.legacy.recompute`); fleet puts such ops after
communication too.

Paddle's translator to PIR refuses a ``depend`` whose ``Out`` is its ``X``
("Op depend should have corresponding OpInfo pd_op.depend_"), and memopt
reads legacy programs through that translation
(:func:`memopt.paddle.pir.program.convert_legacy`): :func:`translatable_desc` gives
a copy of the program's desc in which each such op writes a fresh variable
``X@DEPEND<k>`` that the later ops of its block read instead (until ``X``
is written again) -- the same dependencies, translated as ``pd_op.depend``,
whose result :mod:`memopt.paddle.pir.program` counts as its input's buffer (as it is
when the program runs).  The program itself is not changed.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

__all__ = ["DEPEND_OP", "insert_depend", "insert_depends", "in_place_depends",
           "translatable_desc"]

DEPEND_OP = "depend"
_SUFFIX = "@DEPEND"


def insert_depend(block, at: int, x: str, trigger: str, role: int):
    """Insert at ``at`` ``depend(X=x, Dep=trigger) -> Out=x`` with op role
    ``role``: ``x`` as it is, once ``trigger`` exists.  Returns the
    Operator.  Spelled on the desc: building it through
    ``Operator(type=...)`` would run its shape inference, which writes into
    ``x``'s declaration (a LoD level), so a program undone after it would
    not be byte for byte what it was."""
    from paddle.base.framework import Operator

    new = block.desc._insert_op(at)
    new.set_type(DEPEND_OP)
    new.set_input("X", [x])
    new.set_input("Dep", [trigger])
    new.set_output("Out", [x])
    new._set_attr("op_role", role)
    op = Operator(block, new)
    block.ops.insert(at, op)
    return op


def insert_depends(program, edges) -> list:
    """Insert ``depend(X=[x], Dep=[z], Out=[x])`` right before block 0's op
    ``b`` for each ``(a, b, x, z)`` of ``edges`` (indices of the program as
    it is), with ``b``'s ``op_role``.  All or nothing: on an error the ops
    inserted are removed and the error re-raised.  Returns the Operators
    inserted."""
    block = program.global_block()
    block._sync_with_cpp()
    inserted: list = []
    try:
        for _, b, x, z in sorted(edges, key=lambda e: e[1], reverse=True):
            desc = block.ops[b].desc
            role = desc.attr("op_role") if desc.has_attr("op_role") else 0
            inserted.append(insert_depend(block, b, x, z, role))
    except BaseException:
        for op in reversed(inserted):
            block._remove_op(next(k for k, o in enumerate(block.ops) if o is op))
        raise
    return inserted


def in_place_depends(desc) -> List[Tuple[int, int]]:
    """``(block, op index)`` of every ``depend`` op of program desc ``desc``
    whose ``X`` is its ``Out`` (one name)."""
    out = []
    for b in range(desc.num_blocks()):
        block = desc.block(b)
        for i in range(block.op_size()):
            op = block.op(i)
            if op.type() == DEPEND_OP and op.input("X") == op.output("Out"):
                out.append((b, i))
    return out


def translatable_desc(program) -> Optional[object]:
    """A copy of ``program.desc`` with every ``depend`` op whose ``Out`` is
    its ``X`` writing a fresh ``X@DEPEND<k>`` (declared like ``X``) that
    the block's later ops read instead; None when the program has none."""
    from paddle.base import core

    if not in_place_depends(program.desc):
        return None
    desc = core.ProgramDesc(program.desc)
    count = 0
    for b in range(desc.num_blocks()):
        block = desc.block(b)
        current: Dict[str, str] = {}
        for i in range(block.op_size()):
            op = block.op(i)
            for slot in op.input_names():
                names = op.input(slot)
                renamed = [current.get(n, n) for n in names]
                if renamed != names:
                    op.set_input(slot, renamed)
            if op.type() == DEPEND_OP and op.output("Out") == [
                    n for n in op.input("X") if n]:
                outs = []
                for name in op.output("Out"):
                    src = block.find_var_recursive(name.encode())
                    fresh = f"{name}{_SUFFIX}{count}"
                    count += 1
                    var = block.var(fresh.encode())
                    if src is not None:
                        var.set_type(src.type())
                        var.set_dtype(src.dtype())
                        var.set_shape(src.shape())
                        var.set_lod_level(src.lod_level())
                    outs.append(fresh)
                    current[name] = fresh
                op.set_output("Out", outs)
            else:
                for name in op.output_arg_names():
                    current.pop(name, None)  # written again: its own name from here on
    return desc
