"""One rank's program under fleet's static sharding, built from the
one-device program (for :func:`memopt.estimate` before launch).

``paddle.distributed.fleet``'s sharding (Paddle 3.3.1,
``meta_optimizers/sharding_optimizer.py``) gives whole parameters to owners
(:func:`memopt.parallel.fleet_sharding_owners`) and rewrites each rank's
program: a parameter the rank owns stays persistable, with its optimizer
update and state; a parameter another rank owns becomes a temporary
(``NAME@BroadCast_0``, ``fill_constant`` then ``broadcast`` from its owner at
the start of every step), its optimizer op and state are removed; gradients
are reduced to their owners.  The memory of that program differs from the
one-device program by more than the optimizer state: the temporaries are
buffers the executor may treat like any temporary (measured on the bench MLP,
Paddle 3.3.1 CPU, GC off: the ``reshape`` that the legacy ``mul`` translates
to copies a persistable weight, 1 MiB for a 512x512 weight, but not such a
temporary).

:func:`rank_view` builds that program's memory-relevant shape from a legacy
one-device program: the non-owned parameters as temporaries written by a
``fill_constant`` at the start, their optimizer ops and state removed, each
such op replaced by an in-place ``reduce`` of its gradient (the gradient
lives as long as before: fleet reduces it to its owner).  The broadcasts
(in place on CPU) are left out: they allocate nothing here.  Paddle is imported inside.
"""
from __future__ import annotations

from typing import Iterable

__all__ = ["rank_view", "state_owner"]

#: Optimizer-state name suffixes fleet's sharding attributes to a parameter
#: (``Shard._var_device_id``), plus other optimizers' accumulators.
_STATE_SUFFIXES = ("_moment1_0", "_moment2_0", "_beta1_pow_acc_0", "_beta2_pow_acc_0",
                   "_velocity_0", "_moment_0", "_mean_square_0", "_mean_grad_0")


def state_owner(name: str, params: Iterable[str]) -> str:
    """The parameter whose optimizer state ``name`` is ('' for none): the
    parameter name followed by one of the suffixes fleet knows, else the
    longest parameter name ``name`` starts with followed by ``_``."""
    params = set(params)
    for suffix in _STATE_SUFFIXES:
        if name.endswith(suffix) and name[:-len(suffix)] in params:
            return name[:-len(suffix)]
    best = ""
    for p in params:
        if name.startswith(p + "_") and len(p) > len(best):
            best = p
    return best


def rank_view(program, owned: Iterable[str], params: Iterable[str]):
    """A clone of the legacy ``program`` as fleet's sharding leaves it for
    the rank owning ``owned`` of the parameters ``params`` (names; a program
    read back from a file lists no Parameter objects, so the caller says
    which variables are parameters; see the module docstring)."""
    owned = set(owned)
    view = program.clone()
    block = view.global_block()
    params = [p for p in params if block.has_var(p)]
    others = [p for p in params if p not in owned]
    state = {v.name for v in block.vars.values()
             if v.persistable and state_owner(v.name, params) in others}
    for index in reversed(range(len(block.ops))):
        op = block.ops[index]
        if "Param" in op.input_names and set(op.input("Param")) & set(others):
            grads = [g for g in op.input("Grad")] if "Grad" in op.input_names else []
            role = op.attr("op_role") if op.has_attr("op_role") else None
            block._remove_op(index)
            # the gradient still goes to its owner: fleet's in-place reduce
            # reads it (keeps it alive as long as the update would have)
            for grad in grads:
                block._insert_op(index, type="reduce", inputs={"x": [grad]},
                                 outputs={"out": [grad]},
                                 attrs={"ring_id": 0, "root_id": 0, "reduce_type": 0,
                                        **({"op_role": role} if role is not None else {})})
    for name in state:
        block._remove_var(name)
    for name in others:
        var = block.var(name)
        var.desc.set_persistable(False)
        block._prepend_op(type="fill_constant", outputs={"Out": [var]},
                          attrs={"shape": list(var.shape), "dtype": var.dtype, "value": 0.0})
    view._sync_with_cpp()
    return view
