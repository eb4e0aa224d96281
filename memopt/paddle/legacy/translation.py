"""Will a legacy program memopt rewrote still translate to PIR?

With ``FLAGS_enable_pir_in_executor=1`` (what a legacy program's collectives
need on a CPU: :mod:`memopt.testing.fleet_models`) Paddle runs a legacy program
translated to PIR, and the translation types each value from its variable's
*declared* shape.  Level 1 shares one buffer across shapes: every member is
renamed to ``memopt@buf_<k>``, declared with its first member's shape, so a
member of another shape is declared with the wrong one.  Most ops do not care
(kernels resize their outputs), but some translations insert a ``reshape``
checked against it at translation time: ``mul`` / ``mul_grad`` /
``elementwise_*_grad`` outputs (measured on Paddle 3.3.1: ``ValueError:
(InvalidArgument) The 'shape' in ReshapeOp is invalid ... X's shape =
[128, 128] ... 'shape' is [64, 128]`` for ``fc_0.w_0@GRAD`` sharing
``fc_1.w_0@GRAD``'s buffer, a two-layer MLP with Momentum, GC off).  Rather
than a list of such translations, :func:`translation_error` asks Paddle's own
translator about a copy of the rewritten program.
"""
from __future__ import annotations

from typing import Mapping, Optional


def translation_error(program, groups, homes: Mapping[str, int], order=None,
                      substitutions=()) -> Optional[str]:
    """Paddle's error translating ``program`` to PIR once ``groups`` (a
    plan's groups, :func:`memopt.paddle.legacy.merge_record.apply_merges`' input)
    are applied to a copy of it, or None when the copy translates -- or
    when ``program`` as given does not translate either (then the plan is
    not what fails).  ``program`` itself is not touched."""
    from paddle.base.libpaddle.pir import translate_to_pir

    from . import program as legacy, merge_record

    if not _crosses_shapes(program, groups, homes):
        return None  # every renamed variable keeps its declared shape
    trial = program.clone()
    merge_record.apply_merges(trial, groups, homes, legacy.rewrite, order, substitutions)
    error = _error_of(translate_to_pir, trial)
    if error and _error_of(translate_to_pir, program):
        return None  # the program as given does not translate either: not the plan's doing
    return error


def _crosses_shapes(program, groups, homes: Mapping[str, int]) -> bool:
    """Whether some group shares one buffer between declared shapes."""
    for group in groups:
        if len(group) < 2:
            continue
        block = program.block(homes[group[0]])
        shapes = {tuple(block.var(m).shape) for m in group if block.has_var(m)}
        if len(shapes) > 1:
            return True
    return False


def _error_of(translate, program) -> Optional[str]:
    try:
        translate(program.desc)
    except Exception as exc:  # Paddle's translator: ValueError, RuntimeError...
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]
    return None
