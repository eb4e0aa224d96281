"""Paddle's lookup by name of a variable a rewrite before the backward renamed.

memory_optimize / release_memory on a legacy program that can still be
differentiated (trainable parameters, no backward op yet:
:mod:`memopt.paddle.pending_backward`) renames variables to
``memopt@buf_<k>`` and removes the user names from block 0
(:mod:`memopt.paddle.legacy.merge_record`: so nothing can fetch them).  Paddle code
that looks a variable up by name before it builds the backward then failed
with Paddle's own error: fleet's ``RecomputeOptimizer`` with a checkpoint by
name (``recompute_configs={"checkpoints": [name]}``) raised ``ValueError: var
fc_0.tmp_2 not in this block`` inside ``minimize`` (Paddle 3.3.1, the MLP of
tests/memopt/paddle/test_training_setups.py).

Declaring the names again was tried and left: ``list_vars()`` then shows
names no op writes, which Paddle fetches as ``None`` where memopt's guard is
not in (a new process).  Instead :func:`install` wraps ``Block.var`` -- its
failure path only: a lookup that finds its variable is Paddle's own -- so
that a failed lookup of a name memopt renamed in such a program raises
:class:`RenamedLookupError` (an ``UnsupportedProgramError`` and, for Paddle
code that catches a failed lookup, a ``ValueError``) saying what happened
and the fix.  Installed with the fetch guard
(:func:`memopt.paddle.guards.install_legacy`).
"""
from __future__ import annotations

import functools

from ...errors import UnsupportedProgramError
from ..legacy import merge_record

__all__ = ["RenamedLookupError", "install"]


class RenamedLookupError(UnsupportedProgramError, ValueError):
    """A by-name lookup of a variable memopt renamed away before the
    program's backward part was appended."""


def install() -> None:
    """Wrap ``paddle.base.framework.Block.var`` once per process."""
    from paddle.base.framework import Block

    original = Block.var
    if getattr(original, "__memopt_hooks__", False):
        return

    @functools.wraps(original)
    def var(self, name):
        try:
            return original(self, name)
        except ValueError:
            check_lookup(self, name)
            raise

    var.__memopt_hooks__ = True
    var.__memopt_original__ = original
    Block.var = var


def check_lookup(block, name) -> None:
    """Raise :class:`RenamedLookupError` if ``name``, not found in ``block``,
    is a variable a rewrite of its program before the backward renamed."""
    if not isinstance(name, str):
        return
    program = block.program
    if merge_record.BEFORE_BACKWARD_VAR not in program.global_block().vars:
        return
    entry = merge_record.record_of(program).get(name)
    if entry is None:
        return
    raise RenamedLookupError(
        f"variable {name!r} is not in the program: memory_optimize / release_memory renamed "
        f"it (now {entry[0]!r}) when it rewrote the program before its backward part was "
        "appended; a backward built now (optimizer.minimize, RecomputeOptimizer's "
        "checkpoints, append_backward, gradients) would read variables whose memory went "
        "to others. Build the program again and call memory_optimize after "
        "optimizer.minimize(loss)")
