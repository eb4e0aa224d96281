"""Paddle's fusion passes refused on a legacy program memopt rewrote.

``paddle.static.CompiledProgram(program, build_strategy)`` runs Paddle's
graph passes on the program.  Two of them fuse an op with the activation
after it -- ``fuse_elewise_add_act_ops`` (``elementwise_add`` + ReLU/...
into ``fused_elemwise_add_activation``) and ``fuse_bn_act_ops``
(``batch_norm`` + activation into ``fused_batch_norm_act``) -- and both
computed other values on programs whose fused op writes a merged buffer
``memopt@buf_<k>`` (the op and the activation after it then share one
variable, ``X`` and ``Out`` alike).  Measured on Paddle 3.3.1 (CPU), a
conv-BN-ReLU-linear classifier rewritten at level 1: the softmax was off
by up to 0.52 with ``fuse_elewise_add_act_ops=True``, and
``fuse_bn_act_ops=True`` changed the batch norm's outputs; the same
strategy on the unchanged program, and every other flag tried
(``enable_inplace``, ``memory_optimize``, ``fuse_bn_add_act_ops``,
``fuse_broadcast_ops``), gave the unchanged bytes.

:func:`check_compiled` (a :mod:`memopt.paddle.guards.fetch` compiled hook)
refuses such a run before Paddle compiles it, naming the flag and the fix.
"""
from __future__ import annotations

from ...errors import UnsupportedProgramError

__all__ = ["FUSING_FLAGS", "check_compiled"]

#: BuildStrategy flag -> the op types whose output the fusion takes over.
FUSING_FLAGS = {"fuse_elewise_add_act_ops": ("elementwise_add",),
                "fuse_bn_act_ops": ("batch_norm",)}


def _fused_into_buffer(program, op_types) -> str:
    """The first op of ``op_types`` in ``program`` writing a merged buffer
    (``"elementwise_add -> memopt@buf_3"``), or ''."""
    from ..legacy.merge_record import BUFFER_PREFIX

    for block in program.blocks:
        for op in block.ops:
            if op.type in op_types:
                for name in op.output_arg_names:
                    if name.startswith(BUFFER_PREFIX):
                        return f"{op.type} -> {name}"
    return ""


def check_compiled(compiled, program) -> None:
    """UnsupportedProgramError for a ``CompiledProgram`` whose build strategy
    turns on a fusion that miscomputes on ``program`` as memopt rewrote it."""
    from paddle.base.framework import Program  # the legacy Program class

    strategy = getattr(compiled, "_build_strategy", None)
    if strategy is None or not isinstance(program, Program):
        return
    for flag, op_types in FUSING_FLAGS.items():
        if not getattr(strategy, flag, False):
            continue
        found = _fused_into_buffer(program, op_types)
        if found:
            raise UnsupportedProgramError(
                f"BuildStrategy.{flag}=True computes other values on this program: "
                f"memopt.memory_optimize made {found} (a buffer several variables share), "
                f"and Paddle's fusion of that op with the activation after it miscomputes "
                f"on such a buffer. "
                f"Set build_strategy.{flag} = False (its other flags, enable_inplace and "
                f"memory_optimize included, are fine), or compile the program as built, "
                f"without memory_optimize")
