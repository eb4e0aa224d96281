"""TFP's ``stack_optimization`` module: :func:`fuse_pop_push`.

A ``pop x`` followed in the same block by a ``push x``, with ``x`` not
written between them, leaves the stack frame as it was: the push is
dropped.  :func:`autobatch.lowering.lower` already applies this to every
program it lowers (and the VM skips such a push at run time), so calling
:func:`fuse_pop_push` on a lowered program changes nothing more; it is here
so that a TFP user's pipeline (``lower_function_calls`` then
``fuse_pop_push``) runs unchanged.

On a program lowered by hand in TFP's IR (``program.lowered_by_hand``,
per-variable stacks: see :mod:`autobatch.hand_lowered`) it does what TFP's
pass does there: a ``pop x`` followed in its block by a ``PrimOp`` writing
``x`` (``x`` not read between them) becomes an in-place write (``x`` joins
the op's ``skip_push_mask``: the top value is replaced, nothing is popped or
pushed); the other pops move down to just before the first read of their
variable, or to the block's end.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List

from autobatch.errors import ProgramError
from autobatch.ir import PopOp, PrimOp, drop_repushes, pattern_leaves

__all__ = ["fuse_pop_push"]


def fuse_pop_push(program: Any) -> Any:
    """Drop, block by block, each pushed variable popped earlier in its block
    and not written since.  ``program`` is a
    :class:`~autobatch.lowering.LoweredProgram` (anything with ``.blocks``);
    its blocks are changed in place, as TFP's pass does, and it is returned.
    An unlowered :class:`~autobatch.instructions.Program` has no pushes and
    is returned as it is."""
    by_hand = getattr(program, "lowered_by_hand", None)
    if by_hand is not None:
        for block in by_hand.blocks:
            block.instructions = _fused_block(block)
        return program
    for block in getattr(program, "blocks", ()):
        drop_repushes(block)
    return program


def _fused_block(block: Any) -> List[Any]:
    """A hand-lowered block's instructions with pop+write pairs fused (see
    the module doc)."""
    out: List[Any] = []
    pending: Dict[str, None] = {}   # popped, pop not emitted yet (in order)
    for op in block.instructions:
        if isinstance(op, PopOp):
            for var in op.vars:
                if var in pending:          # popped twice: the first pop happens
                    out.append(PopOp((var,)))
                pending[var] = None
        elif isinstance(op, PrimOp):
            for var in pattern_leaves(tuple(op.vars_in)):
                if var in pending:
                    out.append(PopOp((var,)))
                    del pending[var]
            fused = {v for v in pattern_leaves(op.vars_out) if v in pending}
            for var in fused:
                del pending[var]
            out.append(replace(op, skip_push_mask=op.skip_push_mask | fused) if fused else op)
        else:
            raise ProgramError(f"block {block.name!r}: {type(op).__name__} in a program "
                               f"lowered by hand; pop+push fusion takes PrimOp and PopOp")
    if pending:
        out.append(PopOp(tuple(pending)))
    return out
