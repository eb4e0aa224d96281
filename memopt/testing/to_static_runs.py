"""Training runs of ``paddle.jit.to_static`` steps with and without ``memory_optimize``.

:func:`train` builds a model of :mod:`memopt.testing.dygraph_models`, passes
its step through ``paddle.jit.to_static`` (``mode`` ``"sot"``, the default of
to_static, or ``"full_graph"``; ``"eager"`` leaves it eager), installs memopt
on it when asked (``memopt={"level": 2, "budget": ..., ...}``: the keywords of
``memory_optimize``, with ``optimizer`` and ``batch_size`` filled in), and
trains::

    loss = step(*inputs); loss.backward(); opt.step(); opt.clear_grad()

reading Paddle's host allocator peak over each step from the allocator's
level before the model was built (:mod:`memopt.testing.dygraph_runs`), as
``budget=`` counts it: parameters, gradients, optimizer state and inputs
included.  The first ``warmup`` steps (the first makes the optimizer state)
are not steady and left out of :attr:`StepRun.peaks`.

For bit-identity checks a run records, per step, the loss and digests
(SHA-256 of the bytes) of every gradient and, after the last step, of every
parameter: two runs are bit-identical when the digests are equal.
:func:`train_fresh` runs :func:`train` in a new Python process (a to_static
step's peak varies between processes: Paddle's CPU collector frees on its
own thread).
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional

from .dygraph_runs import PeakStats

__all__ = ["StepRun", "train", "train_fresh", "MODES"]

#: How a step runs: eagerly, to_static with SOT (Paddle's default), to_static full graph.
MODES = ("eager", "sot", "full_graph")


@dataclass
class StepRun(PeakStats):
    """What :func:`train` saw (bytes, seconds).

    Attributes
    ----------
    peaks : allocator peak of each steady step above ``baseline``.
    first_peaks : the same for the warm-up steps.
    baseline : bytes allocated before the model was built.
    seconds : wall time of each steady step.
    losses : each step's loss as ``float.hex`` (exact), warm-up included.
    grads : per step, the digest of every gradient (parameter order).
    params : digest of every parameter after the last step.
    reports : the text of each program report memopt made (empty without memopt).
    programs : how many training programs memopt rewrote.
    error : the BudgetError memopt raised (no step ran to its end), else "".
    smallest_budget : that error's smallest budget (bytes), else 0.
    """

    peaks: List[int]
    first_peaks: List[int]
    baseline: int
    seconds: List[float] = field(default_factory=list)
    losses: List[str] = field(default_factory=list)
    grads: List[List[str]] = field(default_factory=list)
    params: List[str] = field(default_factory=list)
    reports: List[str] = field(default_factory=list)
    programs: int = 0
    error: str = ""
    smallest_budget: int = 0

    @property
    def step_seconds(self) -> float:
        """Median wall time of a steady step."""
        return float(statistics.median(self.seconds))

    def same_numbers(self, other: "StepRun") -> bool:
        """Whether the losses, every gradient of every step and every
        parameter after the last step are bit-identical to ``other``'s."""
        return (self.losses == other.losses and self.grads == other.grads
                and self.params == other.params and bool(self.params))


def _digest(tensor) -> str:
    import numpy as np

    array = np.ascontiguousarray(tensor.numpy())
    return hashlib.sha256(array.tobytes() + str(array.dtype).encode()).hexdigest()[:16]


def train(kind: str, *, batch: int, mode: str = "sot", steps: int = 3, warmup: int = 2,
          memopt: Optional[dict] = None, recompute: Optional[dict] = None,
          digests: bool = True, seed: int = 0, **size) -> StepRun:
    """Train ``kind`` (:func:`memopt.testing.dygraph_models.build`) at
    ``batch`` for ``warmup + steps`` steps in ``mode`` (:data:`MODES`),
    with ``memory_optimize(step, **memopt)`` installed first when
    ``memopt`` is given, or (eager) the sublayers
    ``memopt.suggest_recompute(step, **recompute)`` names wrapped in
    recompute (its ``apply``) when ``recompute`` is given.  ``digests``:
    record gradient and parameter digests (read between ``backward`` and
    ``opt.step`` into NumPy copies, which the allocator peak does not
    count).  ``size``: the model's size keywords.  A BudgetError of memopt
    ends the run early: :attr:`StepRun.error` says it."""
    import paddle

    import memopt as memopt_lib
    from . import dygraph_models
    from .dygraph_runs import allocated

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    gc.collect()
    baseline = allocated()
    step, inputs, opt = dygraph_models.build(kind, batch=batch, seed=seed, **size)
    params = [p for p in step.parameters() if not p.stop_gradient]
    if recompute is not None:
        options = dict(recompute)
        options.setdefault("batch_size", batch)
        options.setdefault("optimizer", opt)
        options.setdefault("input_spec", dygraph_models.spec(kind, **size))
        memopt_lib.suggest_recompute(step, **options).apply(step)
    if mode != "eager":
        step = paddle.jit.to_static(step, full_graph=(mode == "full_graph"))
    handle = None
    if memopt is not None:
        options = dict(memopt)
        options.setdefault("batch_size", batch)
        options.setdefault("optimizer", opt)
        try:
            handle = memopt_lib.memory_optimize(step, **options)
        except memopt_lib.BudgetError as exc:
            return StepRun([], [], baseline, error=str(exc).splitlines()[-1],
                           smallest_budget=exc.smallest_budget)
    run = StepRun([], [], baseline)
    try:
        _steps(run, step, inputs, opt, params, warmup + steps, warmup, digests)
    except memopt_lib.BudgetError as exc:
        run.error, run.smallest_budget = str(exc).splitlines()[-1], exc.smallest_budget
        if handle is not None:
            handle.remove()
        return run
    if digests:
        run.params = [_digest(p) for p in params]
    if handle is not None:
        run.reports = [str(r) for r in handle.records]
        run.programs = len(handle.records)
        handle.remove()
    return run


def _steps(run: StepRun, step, inputs, opt, params, total: int, warmup: int,
           digests: bool) -> None:
    """Train ``total`` steps, recording into ``run``."""
    from .dygraph_runs import peak, reset_peak

    baseline = run.baseline
    for k in range(total):
        reset_peak()
        start = time.perf_counter()
        loss = step(*inputs)
        loss.backward()
        if digests:
            run.grads.append([_digest(p.grad) if p.grad is not None else "-" for p in params])
        opt.step()
        opt.clear_grad()
        seconds = time.perf_counter() - start
        used = peak() - baseline
        (run.first_peaks if k < warmup else run.peaks).append(used)
        if k >= warmup:
            run.seconds.append(seconds)
        run.losses.append(float(loss.astype("float32").numpy().reshape(-1)[0]).hex())
        del loss


def train_fresh(kind: str, *, env: Optional[dict] = None, timeout: float = 1800,
                **options) -> StepRun:
    """:func:`train` in a new Python process (``options``: its keywords,
    JSON-able; ``env`` adds environment variables, e.g. Paddle flags)."""
    code = ("import json, sys\n"
            "from dataclasses import asdict\n"
            "from memopt.testing.to_static_runs import train\n"
            "run = train(sys.argv[1], **json.loads(sys.argv[2]))\n"
            "print('@@' + json.dumps(asdict(run)))\n")
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] +
                                            [environ.get("PYTHONPATH", "")])
    environ.update(env or {})
    proc = subprocess.run([sys.executable, "-c", code, kind, json.dumps(options)],
                          capture_output=True, text=True, env=environ, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"training {kind} {options} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    return StepRun(**json.loads(lines[-1][2:]))


