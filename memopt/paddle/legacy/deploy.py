"""What a legacy inference model rewritten across shapes tells
``paddle.inference``'s predictor.

Measured on Paddle 3.3.1 (CPU): a legacy inference model rewritten at
level 1 or 2 -- ``memopt optimize --level 1`` of ``paddle.jit.save``
models (ResNet-18, fixed and ``[None, ...]`` input; MobileNetV3-small; a
two-conv CNN), or ``load_inference_model`` + ``memory_optimize(level=1)`` +
``save_inference_model`` -- runs bit-identically under
``load_inference_model`` + Executor, but the predictor with its IR
optimization on (its CPU default: oneDNN passes) fails in ``run()``:
``could not create a primitive descriptor for a reorder primitive``.  The
cause found: the ``flatten_contiguous_range`` before the classifier written
in place over its 4-D input's buffer (a merge across shapes); with that
one op given its own output again, ResNet-18 and the CNN run and equal the
unchanged model, but MobileNetV3-small then differs in the last bits
(1.7e-13: the predictor fuses the rewritten ops differently).  Level 0
(same shapes only) is bit-identical under the predictor's defaults on
these models; so is ``Config.switch_ir_optim(False)`` /
``Config.disable_mkldnn()`` at level 1.

So a rewritten program whose buffers hold variables of different shapes
(:func:`memopt.paddle.legacy.merge_record.mixed_shape_buffers`, recorded in the
program itself) gets a warning where it is saved for deployment: by the
CLI's ``optimize`` and by ``paddle.static.save_inference_model``
(:func:`warn_on_save`, a hook of memopt's save guard).
"""
from __future__ import annotations

import warnings

from . import merge_record

__all__ = ["predictor_note", "warn_on_save"]


def predictor_note(program):
    """A warning for a legacy ``program`` whose buffers hold variables of
    different shapes (as level 1 and 2 merge them), or None."""
    buffers = merge_record.mixed_shape_buffers(program)
    if not buffers:
        return None
    shown = ", ".join(buffers[:3]) + (", ..." if len(buffers) > 3 else "")
    return (f"{len(buffers)} memory buffer(s) of this rewritten program hold variables of "
            f"different shapes ({shown}): paddle.static.load_inference_model + Executor run "
            "it bit-identically, but paddle.inference's predictor with IR optimization on "
            "(its CPU default, oneDNN) may fail in run() ('could not create a primitive "
            "descriptor for a reorder primitive', measured on ResNet-18 and a two-conv CNN) "
            "or differ in the last bits (MobileNetV3). For the predictor use level 0 (same "
            "shapes only), Config.switch_ir_optim(False) or disable_mkldnn(), or deploy the "
            "unchanged model (the predictor plans its own memory)")


def warn_on_save(program) -> None:
    """Warn (``UserWarning``) when ``save_inference_model`` writes a legacy
    ``program`` whose buffers hold variables of different shapes."""
    note = predictor_note(program)
    if note:
        warnings.warn(f"memopt: {note}", UserWarning, stacklevel=4)
