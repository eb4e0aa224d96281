"""Programs memopt rewrites before their backward part is appended.

A user who calls ``memory_optimize`` on a training program *before*
``optimizer.minimize(loss)`` (or ``paddle.static.append_backward`` /
``gradients``) gets a backward part built from the rewritten forward ops.
Measured on Paddle 3.3.1 (the MLP of ``tests/memopt/paddle/
test_pending_backward.py``, 3 Adam steps, levels 0-2, GC on and off):
before this module both IRs trained to other losses from the second step
on (PIR 8.47 -> 10.77, legacy 3.99 -> 4.08), and legacy level 1 with the
collector off failed at run time:

- PIR: an op made in place overwrites its operand; the backward reads that
  operand later (``relu_grad`` reads relu's output, which a ``scale_``
  after it had overwritten).
- legacy: a merged variable's memory is another's; worse, the backward
  names each gradient after its variable, so two variables renamed to one
  ``memopt@buf_k`` get one ``memopt@buf_k@GRAD`` and Paddle sums their
  gradients.

A program that can still be differentiated -- it has trainable parameters
and no backward op yet -- is handled per IR:

- PIR: no op is made in place over a value such a backward would read for
  its data (:func:`pending_backward_values`, memopt's
  ``Options.read_later``); the rest is optimized as usual (an ``add``'s
  output turned in place by the ``relu`` after it: ``add_grad`` reads its
  operands' shapes only, ``relu_grad`` the output).  What the backward reads
  is read from Paddle itself: the backward of every sink is built on a
  clone (``paddle.autograd.ir_backward.grad``, what ``minimize`` calls).
  If Paddle cannot build it, or the program has an ``if``/``while`` op (the
  backward of a loop built on a dropped clone crashed a later step of the
  user's program in 3-5 of 30 runs), every value of an op a gradient passes
  through is kept, and every value inside a region (the backward inserts
  pushes into the forward loop body).  This
  costs little: on PIR, Paddle's own in-place pass does most of that work
  at run time (MobileNetV2 inference built in-process: the same predicted
  peak, GC on and off).
- legacy: keeping them would keep nearly everything -- every variable a
  gradient passes through must keep its own name, or two would share one
  gradient name -- and lose what a forward program run for inference gains
  (MobileNetV2 x0.25 at batch 32, GC off: 18.8 -> 5.2 MiB predicted).  So
  the rewrite is made as for inference and the program records it
  (:data:`memopt.paddle.legacy.merge_record.BEFORE_BACKWARD_VAR`, declared in its
  desc); a backward part appended afterwards makes ``Executor.run`` (where
  memopt is imported) and memopt's own calls refuse the program, naming the
  fix, instead of training wrongly (:func:`memopt.paddle.legacy.program.check_backward_order`).

A program with a backward part, or without trainable parameters (a legacy
inference model read by ``load_inference_model``), is optimized as before;
so is a PIR program with ``pd_op.fetch`` ops in it: ``save_inference_model``
writes them into the model it saves (the executor adds its own to a clone
of the program it runs, never to the user's), so such a program is a model
saved for inference and read back -- its parameters still say trainable,
but nothing differentiates it (MobileNetV2 at batch 32 read back by
``load_inference_model``: 566 values kept for a backward, 1 op made in
place, before this rule).  Should a backward part be appended to one
anyway, an op of it that reads what an in-place op wrote over makes
``Executor.run`` raise :class:`memopt.MergedVariableError`
(:mod:`memopt.paddle.pir.later_ops`).
"""
from __future__ import annotations

import logging
from typing import FrozenSet

from .pir.program import PARAMETER_OP, _is_grad_op, all_ops, is_pir_program, value_names
from .pir.inplace import reads_shape_only

log = logging.getLogger(__name__)

__all__ = ["can_still_be_differentiated", "pending_backward_values", "legacy_has_backward",
           "note", "LEGACY_NOTE"]

#: The op save_inference_model writes for each of a saved model's outputs.
FETCH_OP = "pd_op.fetch"

#: op_role's backward bit (paddle.base.core.op_proto_and_checker_maker.OpRole).
_ROLE_BACKWARD = 0x0001


def can_still_be_differentiated(program) -> bool:
    """Whether ``program`` has a trainable parameter and no backward op."""
    if is_pir_program(program):
        return (_pir_trainable(program) and not _pir_has_backward(program)
                and not _pir_saved_for_inference(program))
    return _legacy_trainable(program) and not legacy_has_backward(program)


def pending_backward_values(program) -> FrozenSet[str]:
    """The names (as ``skip_opt_set`` takes them) of the values of a PIR
    ``program`` whose data a backward part appended later would read; empty if
    the program cannot still be differentiated (or is a legacy one: see the
    module docstring)."""
    if not is_pir_program(program) or not can_still_be_differentiated(program):
        return frozenset()
    return _pir_pending(program)


def note(count: int) -> str:
    """The report's line for ``count`` values of a PIR program that no op is
    made in place over, for a later backward."""
    return (f"{count} value(s) a backward part not yet appended would read are never "
            "written over in place: the program has trainable parameters and no backward "
            "op, and optimizer.minimize / append_backward read them.  Call "
            "memory_optimize after minimize to reuse their memory too")


#: The report's line for a legacy program rewritten before its backward part.
LEGACY_NOTE = ("the program has trainable parameters and no backward op: it was rewritten "
               "for running as it is (inference); a backward part appended now "
               "(optimizer.minimize / append_backward) would be wrong, so Executor.run "
               "refuses the program then.  For training, call memory_optimize after minimize")


# -- PIR ----------------------------------------------------------------------------

def _pir_trainable(program) -> bool:
    return any(op.name() == PARAMETER_OP and not op.result(0).stop_gradient
               for op in program.global_block().ops)


def _pir_saved_for_inference(program) -> bool:
    """Whether ``program`` has fetch ops of its own: a model written by
    ``save_inference_model`` and read back (see the module docstring)."""
    return any(op.name() == FETCH_OP for op in program.global_block().ops)


def _pir_has_backward(program) -> bool:
    return any(_is_grad_op(op.name()) for op in all_ops(program.global_block()))


def _float(value) -> bool:
    import paddle

    return value.dtype in (paddle.float16, paddle.bfloat16, paddle.float32, paddle.float64)


def _pir_pending(program) -> FrozenSet[str]:
    names = value_names(program)
    ops = list(program.global_block().ops)
    kept = set()
    for op in ops:  # everything inside a region op
        for sub in op.blocks():
            for inner in all_ops(sub):
                kept.update(names[v.id] for v in inner.results() if v.id in names)
            for arg in sub.args():
                if arg.id in names:
                    kept.add(names[arg.id])
    # Paddle's backward of a loop, built on a clone that is then dropped,
    # crashed a later step of the user's program now and then (SIGSEGV in 5
    # of 30 runs of sweep_user_programs' tensor_array_while, 0 of 30 without
    # it): with a region op, keep every value a gradient passes through
    has_regions = any(op.num_regions() for op in ops)
    read = None if has_regions else _pir_backward_reads(program, ops)
    if read is None:  # Paddle could not build it: every op a gradient passes through
        for op in ops:
            if any(r.initialized() and not r.stop_gradient for r in op.results()):
                values = list(op.results()) + list(op.operands_source())
                kept.update(names[v.id] for v in values if v.initialized() and v.id in names)
    else:
        for i, k in read:
            name = names.get(ops[i].result(k).id)
            if name is not None:
                kept.add(name)
    return frozenset(kept)


def _pir_backward_reads(program, ops):
    """(op index, result index) of the top-level values read by the backward
    of every floating sink (a result no op reads) w.r.t. every trainable
    parameter, built on a clone; None if Paddle cannot build it."""
    import paddle

    clone = program.clone()
    cloned = list(clone.global_block().ops)
    if [op.name() for op in cloned] != [op.name() for op in ops]:
        return None
    params = [op.result(0) for op in cloned
              if op.name() == PARAMETER_OP and not op.result(0).stop_gradient]
    sinks = [r for op in cloned for r in op.results()
             if r.initialized() and r.use_empty() and not r.stop_gradient and _float(r)]
    if not params or not sinks:
        return None
    try:
        with paddle.static.program_guard(clone):
            paddle.autograd.ir_backward.grad(sinks, params, allow_unused=True)
    except Exception as exc:  # an op without a gradient rule, say
        log.debug("backward of a clone not built (%s): keeping every value", exc)
        return None
    position = {r.id: (i, k) for i, op in enumerate(cloned) for k, r in enumerate(op.results())}
    after = list(clone.global_block().ops)[len(cloned):]
    read = set()
    for op in after:
        for inner in [op, *(x for sub in op.blocks() for x in all_ops(sub))]:
            read.update(position[v.id] for v in inner.operands_source()
                        if v.initialized() and v.id in position
                        and not reads_shape_only(inner, v))
    return read


# -- legacy -------------------------------------------------------------------------

def _legacy_trainable(program) -> bool:
    return any(getattr(p, "trainable", True) for p in program.global_block().all_parameters())


def legacy_has_backward(program) -> bool:
    """Whether any op of a legacy ``program`` has the backward role or is a grad op."""
    for block in program.blocks:
        for op in block.ops:
            desc = op.desc
            if desc.has_attr("op_role") and int(desc.attr("op_role")) & _ROLE_BACKWARD:
                return True
            if op.type.endswith("_grad"):
                return True
    return False
