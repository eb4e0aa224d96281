"""Legacy ``depend`` ops as memopt reads them: through a translatable copy.

A legacy ``depend`` op whose ``Out`` is its ``X`` (``X`` passed through once
``Dep`` exists: what :mod:`memopt.paddle.legacy_recompute` inserts, and what
fleet puts after communication) runs on Paddle 3.3.1's legacy executor, but
its translator to PIR refuses it ("Op depend should have corresponding
OpInfo pd_op.depend_"), and memopt reads legacy programs through that
translation (:func:`memopt.paddle.pir.convert_legacy`).
:func:`translatable_desc` gives a copy of the program's desc in which each
such op writes a fresh variable ``X@DEPEND<k>`` that the later ops of its
block read instead (translated: ``pd_op.depend``); :func:`mark_pass_through`
then states, on the graph read from it, that the op's result is its input's
buffer (as it is when the program runs).  The program itself is not changed.
"""
from __future__ import annotations

from typing import Dict, Optional

__all__ = ["DEPEND_OP", "translatable_desc", "mark_pass_through"]

DEPEND_OP = "depend"
_SUFFIX = "@DEPEND"


def _in_place_depends(desc) -> bool:
    for b in range(desc.num_blocks()):
        block = desc.block(b)
        for i in range(block.op_size()):
            op = block.op(i)
            if op.type() == DEPEND_OP and op.input("X") == op.output("Out"):
                return True
    return False


def translatable_desc(program) -> Optional[object]:
    """A copy of ``program.desc`` with every ``depend`` op whose ``Out`` is
    its ``X`` writing a fresh ``X@DEPEND<k>`` (declared like ``X``) that
    the block's later ops read instead; None when the program has none."""
    from paddle.base import core

    if not _in_place_depends(program.desc):
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


def mark_pass_through(graph) -> None:
    """On a graph read from a :func:`translatable_desc` copy: each
    ``pd_op.depend`` writing an ``X@DEPEND<k>`` is stated to write it over
    ``X`` (one buffer, as the legacy op passes ``X`` through)."""
    for _, op in graph.walk_ops():
        if op.type == "pd_op.depend" and op.writes and op.reads \
                and _SUFFIX in op.writes[0] and not op.facts.overwrites:
            op.facts.overwrites = ((op.reads[0], op.writes[0]),)
