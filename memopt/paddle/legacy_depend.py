"""``depend`` ops that make Paddle's legacy executor keep an op order.

Paddle's ProgramInterpreter runs every op whose inputs are ready, several at
once, whatever their places in the program (measured, see
:func:`memopt.paddle.legacy_schedule.order_edges`).  ``depend(X=[x],
Dep=[z], Out=[x])`` makes every later reader of ``x`` wait until ``z`` is
written, and does nothing else: its kernel checks that ``X`` and ``Out``
are one variable and leaves it as it is (Paddle 3.3.1 refuses ``X != Out``).

:func:`insert_depends` puts such ops in block 0 (all or nothing).
:func:`translatable_desc` is what memopt reads such a program through:
Paddle's translation to PIR refuses a ``depend`` whose ``X`` is its ``Out``
(it looks for an in-place ``pd_op.depend_``), so a copy of the desc gets,
for each one, a fresh ``Out`` (``<x>@memopt_dep<k>``, declared like ``x``)
that the next op reading ``x`` reads instead -- the same dependencies, and
``pd_op.depend``'s result is a view of ``x`` (:mod:`memopt.paddle.pir`
counts it as ``x``'s buffer).
"""
from __future__ import annotations

from typing import List

__all__ = ["DEPEND_OP", "insert_depends", "in_place_depends", "translatable_desc"]

DEPEND_OP = "depend"
#: Marks the fresh ``Out`` name of a depend in a translation copy.
COPY_MARK = "@memopt_dep"


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
            inserted.append(block._insert_op(b, type=DEPEND_OP, inputs={"X": [x], "Dep": [z]},
                                             outputs={"Out": [x]}, attrs={"op_role": role}))
    except BaseException:
        for op in reversed(inserted):
            block._remove_op(next(k for k, o in enumerate(block.ops) if o is op))
        raise
    return inserted


def in_place_depends(desc) -> List[int]:
    """Indices of block 0's ``depend`` ops of program desc ``desc`` whose
    ``X`` is their ``Out`` (one name)."""
    block = desc.block(0)
    out = []
    for k in range(block.op_size()):
        op = block.op(k)
        if op.type() == DEPEND_OP and op.input("X") == op.output("Out"):
            out.append(k)
    return out


def translatable_desc(program):
    """``program.desc``, or where block 0 has in-place ``depend`` ops a copy
    Paddle's translation to PIR takes (see the module docstring)."""
    from paddle.base import core

    found = in_place_depends(program.desc)
    if not found:
        return program.desc
    desc = core.ProgramDesc(program.desc)
    block = desc.block(0)
    for count, k in enumerate(found):
        op = block.op(k)
        x = op.input("X")[0]
        fresh = f"{x}{COPY_MARK}{count}"
        source = _find_var(desc, x)
        new = block.var(fresh.encode())
        if source is not None:
            new.set_type(source.type())
            new.set_shape(source.shape())
            new.set_dtype(source.dtype())
        op.set_output("Out", [fresh])
        for j in range(k + 1, block.op_size()):
            reader = block.op(j)
            if x in reader.input_arg_names():
                for slot in reader.input_names():
                    names = reader.input(slot)
                    if x in names:
                        reader.set_input(slot, [fresh if n == x else n for n in names])
                break
            if x in reader.output_arg_names():
                break
    return desc


def _find_var(desc, name: str):
    for i in range(desc.num_blocks()):
        block = desc.block(i)
        if block.has_var(name.encode()):
            return block.find_var(name.encode())
    return None
