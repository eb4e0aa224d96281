"""Measured memory of dygraph training steps: what ``memopt.analyze(step, ...)`` predicts.

:func:`measure` trains a model a few steps and reads Paddle's host allocator
peak (``core.host_memory_stat_peak_value('Allocated', 0)``, bytes) over each
step, from the allocator's level before the model was built (so parameters,
optimizer state, gradients and the inputs count, as in
``StepAnalysis.total_peak``).  A step is::

    loss = step(*inputs); loss.backward(); opt.step(); opt.clear_grad(set_to_zero)

(with a ``GradScaler``: ``scaler.scale(loss).backward(); scaler.step(opt);
scaler.update(); opt.clear_grad(set_to_zero)``; under ``paddle.amp.auto_cast(**amp)``
when ``amp`` is given).  The first ``warmup`` steps (the first makes the
optimizer state) are not steady and are left out of :attr:`EagerRun.peaks`.

Eager execution frees each tensor when its last reference goes, on the
calling thread: eager step peaks repeat to the byte.  A to_static step's
vary (the static executor's collector frees on its own thread): measure
those over many steps in fresh processes (:func:`measure_fresh`).

``build`` is a zero-argument callable returning ``(step, inputs, optimizer)``
(and optionally a ``GradScaler`` as a fourth item); :func:`measure_fresh` takes
it as ``"module:function"`` so a new Python process can import it.
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

__all__ = ["EagerRun", "measure", "measure_fresh", "allocated", "reset_peak", "peak"]


class PeakStats:
    """Median, min and max of ``self.peaks`` (allocator peaks of the steady
    steps of a run, bytes)."""

    @property
    def median(self) -> float:
        return float(statistics.median(self.peaks))

    @property
    def min(self) -> int:
        return min(self.peaks)

    @property
    def max(self) -> int:
        return max(self.peaks)


@dataclass
class EagerRun(PeakStats):
    """What :func:`measure` saw.

    Attributes
    ----------
    peaks : allocator peak of each steady step, bytes above ``baseline``.
    first_peaks : the same for the warm-up steps.
    baseline : bytes allocated before ``build`` ran.
    losses : each step's loss (float, all steps, warm-up included).
    params : ``{parameter name: numpy array}`` after the last step (when
        asked with ``keep_params=True``).
    """

    peaks: List[int]
    first_peaks: List[int]
    baseline: int
    losses: List[float] = field(default_factory=list)
    params: dict = field(default_factory=dict, repr=False)


def allocated() -> int:
    """Bytes the host allocator holds now."""
    from paddle.base import core

    return int(core.host_memory_stat_current_value("Allocated", 0))


def reset_peak() -> None:
    from paddle.base import core

    core.host_memory_stat_reset_peak_value("Allocated", 0)


def peak() -> int:
    """The host allocator's peak since the last :func:`reset_peak`, bytes."""
    from paddle.base import core

    return int(core.host_memory_stat_peak_value("Allocated", 0))


def _loss_value(loss) -> float:
    return float(loss.astype("float32").numpy().reshape(-1)[0])


def measure(build: Callable, *, steps: int = 4, warmup: int = 2, set_to_zero: bool = True,
            amp: Optional[dict] = None, keep_params: bool = False,
            to_static: Optional[str] = None) -> EagerRun:
    """Train ``steps`` steady steps after ``warmup`` ones; the allocator peak of each.

    ``to_static``: None (eager), ``"sot"`` or ``"full_graph"``: the step is
    passed through ``paddle.jit.to_static`` first (a Layer is converted in
    place, as users do).
    """
    import paddle

    if steps < 1 or warmup < 1:
        raise ValueError("steps and warmup must be >= 1 (the first step makes the "
                         "optimizer state: it is never steady)")
    gc.collect()
    baseline = allocated()
    built = build()
    step, inputs, opt = built[:3]
    scaler = built[3] if len(built) > 3 else None
    if to_static is not None:
        step = paddle.jit.to_static(step, full_graph=(to_static == "full_graph"))
    losses: List[float] = []
    seen: List[int] = []
    for _ in range(warmup + steps):
        reset_peak()
        if amp:
            with paddle.amp.auto_cast(**amp):
                loss = step(*inputs)
        else:
            loss = step(*inputs)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.clear_grad(set_to_zero=set_to_zero)
        seen.append(peak() - baseline)
        losses.append(_loss_value(loss))
        del loss
    params = {}
    if keep_params:
        model = step if isinstance(step, paddle.nn.Layer) else None
        source = model.named_parameters() if model is not None else \
            [(p.name, p) for p in opt._parameter_list]
        params = {name: p.numpy().copy() for name, p in source}
    return EagerRun(seen[warmup:], seen[:warmup], baseline, losses, params)


def measure_fresh(build: str, *, build_kwargs: Optional[dict] = None,
                  env: Optional[dict] = None, timeout: float = 600,
                  **options: Any) -> EagerRun:
    """:func:`measure` in a new Python process.

    ``build`` is ``"module:function"`` (importable with this process's
    ``sys.path`` and ``PYTHONPATH``), called with ``build_kwargs`` (JSON-able,
    e.g. ``{"kind": "gpt", "batch": 8}`` for
    ``"memopt.testing.dygraph_models:build"``); ``options`` are
    :func:`measure`'s keywords (JSON-able); ``env`` adds environment
    variables (Paddle flags).
    """
    code = (
        "import functools, json, sys, importlib\n"
        "from memopt.testing.dygraph_runs import measure\n"
        "mod, fn = sys.argv[1].split(':')\n"
        "build = functools.partial(getattr(importlib.import_module(mod), fn), "
        "**json.loads(sys.argv[3]))\n"
        "run = measure(build, **json.loads(sys.argv[2]))\n"
        "print('@@' + json.dumps({'peaks': run.peaks, 'first': run.first_peaks, "
        "'baseline': run.baseline, 'losses': run.losses}))\n")
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] +
                                            [environ.get("PYTHONPATH", "")])
    environ.update(env or {})
    proc = subprocess.run([sys.executable, "-c", code, build, json.dumps(options),
                           json.dumps(build_kwargs or {})],
                          capture_output=True, text=True, env=environ, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"measuring {build} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    data = json.loads(lines[-1][2:])
    return EagerRun(data["peaks"], data["first"], data["baseline"], data["losses"])
