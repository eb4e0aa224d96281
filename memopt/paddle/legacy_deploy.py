"""What a legacy inference model rewritten at level 1 or 2 tells
``paddle.inference``'s predictor.

Measured on Paddle 3.3.1 (CPU): ``memopt optimize --level 1`` of
``paddle.jit.save`` models in the legacy IR (ResNet-18, fixed and
``[None, ...]`` input; MobileNetV3-small; a two-conv CNN) writes a model
that ``load_inference_model`` + Executor run bit-identically, but the
predictor with its IR optimization on (its CPU default: oneDNN passes)
fails in ``run()``: ``could not create a primitive descriptor for a reorder
primitive`` (in a PIR-default process too) -- presumably its passes read the
shape of a ``memopt@buf_<k>`` variable, which level 1 shares between
tensors of different shapes (not traced further).  With
``Config.switch_ir_optim(False)`` or ``Config.disable_mkldnn()`` it runs and
its outputs equal the unchanged model's under the same configuration;
level 0 (same shapes only) runs under the default configuration too.
"""
from __future__ import annotations

__all__ = ["predictor_note"]


def predictor_note(program, level: int, merged: int):
    """A warning for a legacy inference model (it has ``fetch`` ops) that
    level ``level`` >= 1 rewrote (``merged`` variables share memory), or
    None."""
    if level < 1 or not merged:
        return None
    if not any(op.type == "fetch" for op in program.global_block().ops):
        return None
    return (f"this inference model now shares memory across shapes (level {level}): "
            "paddle.static.load_inference_model + Executor run it bit-identically, but "
            "paddle.inference's predictor with IR optimization on (its CPU default, oneDNN) "
            "may fail in run() ('could not create a primitive descriptor for a reorder "
            "primitive', measured on ResNet-18 and a two-conv CNN). For the predictor, use "
            "--level 0, Config.switch_ir_optim(False) or disable_mkldnn(), or deploy the "
            "unchanged model (the predictor plans its own memory)")
