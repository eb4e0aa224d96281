"""nn.Layer models: capture a dygraph training step, predict its memory, advise recompute.

Paddle is imported inside the functions.  Public functions:

- :func:`analyze_step` (what ``memopt.analyze(step, input_spec=..., optimizer=...)``
  runs): the memory of one training step, eager or to_static, before training;
- :func:`capture`: the step's whole training program, traced without running;
- :func:`suggest_recompute` (``memopt.suggest_recompute``): the sublayers to wrap in
  ``paddle.distributed.fleet.utils.recompute`` so an eager step fits a budget;
- :func:`optimize_step` (what ``memopt.memory_optimize(static_step, ...)`` runs,
  :mod:`memopt.paddle.dygraph.to_static`): every training program a
  ``paddle.jit.to_static`` step builds rewritten before its first run, through
  the hook of :mod:`memopt.paddle.dygraph.hook`.
"""
from importlib import import_module

_EXPORTS = {
    "analyze_step": "memopt.paddle.dygraph.eager",
    "StepAnalysis": "memopt.paddle.dygraph.eager",
    "capture": "memopt.paddle.dygraph.capture",
    "CapturedStep": "memopt.paddle.dygraph.capture",
    "suggest_recompute": "memopt.paddle.dygraph.recompute_advice",
    "RecomputeAdvice": "memopt.paddle.dygraph.recompute_advice",
    "is_step": "memopt.paddle.dygraph.capture",
    "optimize_step": "memopt.paddle.dygraph.to_static",
    "StepOptimization": "memopt.paddle.dygraph.to_static",
    "is_static_step": "memopt.paddle.dygraph.to_static",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'memopt.paddle.dygraph' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
