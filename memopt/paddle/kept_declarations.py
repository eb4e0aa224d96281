"""User names a legacy rewrite made before the backward part keeps declared.

memory_optimize / release_memory on a legacy program that can still be
differentiated (trainable parameters, no backward op yet:
:mod:`memopt.paddle.pending_backward`) renames variables to
``memopt@buf_<k>`` and removes the user names from block 0
(:mod:`memopt.paddle.merge_record`).  Paddle code that looks a variable up
by name before it builds the backward then failed with Paddle's own error,
not memopt's: fleet's ``RecomputeOptimizer`` (``recompute_configs=
{"checkpoints": [name]}``) raised ``ValueError: var fc_0.tmp_2 not in this
block`` inside ``minimize`` (Paddle 3.3.1, the MLP of
tests/memopt/paddle/test_training_setups.py).

So such a rewrite declares every name it removed from block 0 again, as it
was declared (shape, dtype, type, LoD level, stop_gradient; not
persistable), and no op reads or writes it: a variable of its own, no
memory shared with any other.  ``minimize`` builds its backward; then
``Executor.run`` refuses the program naming the fix
(:func:`memopt.paddle.legacy.check_backward_order`).  The names are listed
in the record of :data:`memopt.paddle.merge_record.BEFORE_BACKWARD_VAR`, so
a fetch of one is refused as for any renamed name
(:func:`memopt.paddle.merge_record.check_fetch`); without memopt imported
Paddle refuses it (the variable is never written).

Paddle is imported lazily.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from . import merge_record

__all__ = ["snapshot", "declare_again"]

#: (shape, dtype, type, lod_level, stop_gradient) of a declaration.
Declaration = Tuple[list, object, object, int, bool]


def snapshot(program) -> Dict[str, Declaration]:
    """The declarations of block 0's non-persistable variables, taken before
    a rewrite of a legacy ``program`` that can still be differentiated;
    empty for any other program (nothing will be declared again)."""
    from .pending_backward import can_still_be_differentiated

    if not can_still_be_differentiated(program):
        return {}
    out: Dict[str, Declaration] = {}
    for name, var in program.global_block().vars.items():
        desc = var.desc
        if desc.persistable():
            continue
        try:
            out[name] = (list(desc.shape()), desc.dtype(), desc.type(), desc.lod_level(),
                         bool(desc.stop_gradient()))
        except Exception:  # a type without a tensor shape (a reader): not renamed
            continue
    return out


def declare_again(program, declarations: Dict[str, Declaration]) -> List[str]:
    """Declare again in block 0 every name of ``declarations`` the rewrite
    renamed away (merged or released), recording them; returns the names."""
    block = program.global_block()
    names = sorted(n for n in merge_record.record_of(program)
                   if n in declarations and not block.has_var(n))
    for name in names:
        shape, dtype, vtype, lod_level, stop_gradient = declarations[name]
        block.create_var(name=name, shape=shape, dtype=dtype, type=vtype, lod_level=lod_level,
                         persistable=False, stop_gradient=stop_gradient)
    merge_record.record_kept(program, names)
    return names
