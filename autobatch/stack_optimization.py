"""TFP's ``stack_optimization`` module: :func:`fuse_pop_push`.

A ``pop x`` followed in the same block by a ``push x``, with ``x`` not
written between them, leaves the stack frame as it was: the push is
dropped.  :func:`autobatch.lowering.lower` already applies this to every
program it lowers (and the VM skips such a push at run time), so calling
:func:`fuse_pop_push` on a lowered program changes nothing more; it is here
so that a TFP user's pipeline (``lower_function_calls`` then
``fuse_pop_push``) runs unchanged.
"""
from __future__ import annotations

from typing import Any

from autobatch.instructions import drop_repushes

__all__ = ["fuse_pop_push"]


def fuse_pop_push(program: Any) -> Any:
    """Drop, block by block, each pushed variable popped earlier in its block
    and not written since.  ``program`` is a
    :class:`~autobatch.lowering.LoweredProgram` (anything with ``.blocks``);
    its blocks are changed in place, as TFP's pass does, and it is returned.
    An unlowered :class:`~autobatch.instructions.Program` has no pushes and
    is returned as it is."""
    for block in getattr(program, "blocks", ()):
        drop_repushes(block)
    return program
