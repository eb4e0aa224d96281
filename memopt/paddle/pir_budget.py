"""``memory_optimize(budget=...)`` on PIR programs: the recomputation plan for a budget.

:func:`plan_recompute` reads the program's grid of recomputation plans
(:func:`memopt.recompute.evaluate_grid`, each predicted by
:mod:`memopt.analysis` under the current flags: GC, the executor's in-place
pass, its dataflow schedule), keeps those the model vouches for under
those flags (:func:`vouched`: no per-reader clone plans on the
multi-thread executor) and returns the one with the least added
compute whose predicted peak, with Paddle's garbage collector up to
:data:`GC_LAG_OPS` ops behind, fits ``budget``, or raises
:class:`memopt.errors.BudgetError` saying the smallest budget that fits at
that batch and the largest batch that fits the budget.  The program is
not touched here (:func:`memopt.paddle.pir_recompute.apply_plan` applies
the plan; :mod:`memopt.api` wires the steps).
"""
from __future__ import annotations

from ..errors import BudgetError, UnsupportedProgramError

__all__ = ["GC_LAG_OPS", "WORKERS_CHECKED", "guarded_peak", "budget_error",
           "recompute_choices", "vouched", "largest_batch", "plan_recompute", "require_flat"]

#: How many ops late a free may be taken to happen when a plan is checked
#: against a budget (:meth:`memopt.analysis.Analysis.total_peak_pending`).
#: Paddle 3.3.1's CPU garbage collector queues every free on its own thread,
#: so a buffer stays allocated until that thread gets a core.  Measured here
#: (2 shared cores, load 4-5, recompute plans whose steady peak the model
#: predicts to the byte): over 8 steps x 3-9 fresh processes the allocator's
#: step peak exceeded the steady one in 15-50% of steps, by up to 1.21x on
#: U-Net (covered by a 4-op lag: 1.25x), 1.07x on DenseNet (2 ops) and
#: 1.38x on BERT (4 ops: 1.28x; 12 ops: 1.45x), with rare outliers beyond any
#: lag (BERT, sequential executor: 2.8x once in 56 steps); right after a
#: step, the allocator's count still fell by 0.2-2.0 MiB within 50 ms with
#: nothing running (frees still queued).  No rewrite of the program changes
#: that thread; 4 ops covers the CNNs' observed lag.
GC_LAG_OPS = 4


#: Worker counts the multi-thread schedule is also modelled with when a
#: plan is checked.  Paddle's executor runs 4 threads, but on a machine
#: whose cores are busy fewer of them run at once, and its interleaving
#: then lies between one thread's and four's (measured: a BERT plan modelled
#: at 7.8 MB with 4 workers ran at 8.5-10.7 MB in 3 processes on 2 loaded
#: cores; with 1 and 2 workers the model gives 8.1 and 7.8 MB, and with
#: frees 4 ops late 11.8 and 10.9 MB).
WORKERS_CHECKED = (1, 2)

_ALTERNATES: dict = {}


def guarded_peak(prediction, batch: int, window: int = GC_LAG_OPS) -> int:
    """The total peak a budget is checked against: ``prediction``'s (an
    :class:`memopt.analysis.Analysis`) with frees up to ``window`` ops late,
    the largest over the executor's schedule with its own worker count and
    with each of :data:`WORKERS_CHECKED` (dataflow schedule only)."""
    peak = prediction.total_peak_pending(window, batch)
    runtime = prediction.runtime
    if runtime.schedule != "dataflow":
        return peak
    key = id(prediction)
    alternates = _ALTERNATES.get(key)
    if alternates is None or alternates[0] is not prediction:
        from dataclasses import replace

        from ..analysis import from_graph

        alternates = (prediction, [
            from_graph(prediction.graph, prediction.batch_size, replace(runtime, workers=w),
                       prediction.inplace)
            for w in WORKERS_CHECKED if w != runtime.workers])
        if len(_ALTERNATES) > 256:
            _ALTERNATES.clear()
        _ALTERNATES[key] = alternates
    return max([peak] + [a.total_peak_pending(window, batch) for a in alternates[1]])


def recompute_choices(pg, batch: int, runtime):
    """The grid of recomputation plans of ``pg`` at ``batch`` with their
    predictions: ``(problem, [Choice])``."""
    from .. import recompute
    from . import pir_recompute
    from .pir_inplace import executor_inplace

    problem = pir_recompute.problem_of(pg, batch)
    pairs = executor_inplace(pg, (), runtime.device) if runtime.inplace else []
    choices = recompute.evaluate_grid(problem, pir_recompute.predictor(batch, runtime, pairs))
    for c in choices:
        c.peak = guarded_peak(c.prediction, batch)
    return problem, choices


def vouched(choices, runtime) -> list:
    """The plans of ``choices`` the model can vouch for under ``runtime``.

    Under the multi-thread executor (``runtime.schedule == "dataflow"``,
    Paddle's default) the plans that clone per group of readers
    (``plan.readers``: :data:`memopt.recompute.READER_GAPS`) are left out.
    Such a plan makes every dropped value again once per group, thousands
    of tiny ops (bert-8L at 30%: 2270 ops added to 981), and its measured
    step peaks departed from the model on that executor while the
    one-thread executors held them as modelled.  Measured 2026-11-26,
    bert-8L batch 16, plan "segments 2, clones per reader 8" (model: 7.8 MB
    steady, 11.3 MB with frees 4 ops late, 13.2 MB with 12), budget
    14.1 MB, per-step allocator peaks in fresh processes (load 2-3):
    multi-thread 10.9-15.7 MB and 11.2-53.8 MB (3.8x the budget; the model
    needs frees ~200 ops late to reach that),
    ``FLAGS_new_executor_serial_run`` 9.9-13.8 MB,
    ``FLAGS_new_executor_sequential_run`` 10.6-13.0 MB; the plan with
    shared clones at 40% (1365 ops in all) 11.3-13.6 MB against 14.8 MB
    modelled.  The model already runs ready clones early (the clones wait
    for a backward value through their ordering ops, and its multi-worker
    schedules let them run as soon as that exists), so what departs is not
    captured by it; until it is, those plans are not offered there.  The
    program schedule (``FLAGS_new_executor_sequential_run``) keeps them.
    :func:`plan_recompute` and so :class:`BudgetError`'s smallest budget
    and largest batch use these plans only."""
    if runtime.schedule != "dataflow":
        return list(choices)
    return [c for c in choices if not c.plan.readers]


def largest_batch(choices, budget: int, limit: int = 1 << 20) -> int:
    """The largest batch size some plan of ``choices`` fits ``budget`` at
    (:func:`guarded_peak`, the plan's structure taken as it is at the
    planning batch); 0 if none."""
    best = 0
    for c in choices:
        if guarded_peak(c.prediction, 1) > budget:
            continue
        lo, hi = 1, 2
        while hi <= limit and guarded_peak(c.prediction, hi) <= budget:
            lo, hi = hi, hi * 2
        hi = min(hi, limit + 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if guarded_peak(c.prediction, mid) <= budget else (lo, mid)
        best = max(best, lo)
    return best


def require_flat(pg) -> None:
    """UnsupportedProgramError unless the program's top-level block runs no
    if/while regions (what recomputation handles)."""
    from .pir import flat_program

    if not flat_program(pg):
        raise UnsupportedProgramError(
            "budget=: memopt recomputes in PIR programs whose top-level block runs no "
            "if/while regions; this one does. Drop budget= (memory_optimize still "
            "rewrites it) or build the model without static control flow")


def plan_recompute(pg, batch: int, budget: int, runtime):
    """``(fitting, choices)``: every plan of the grid the model vouches for
    under ``runtime`` (``choices``, :func:`vouched`) and those whose guarded
    peak (:func:`guarded_peak`) fits ``budget`` bytes at
    ``batch``, best first: least added compute, then the lower peak (see
    the module docstring).  The caller applies the first and checks the
    rewritten program with the same model (:func:`memopt.api.memory_optimize`
    does), going on to the next if the check fails, and raises
    :func:`budget_error` when none is left."""
    require_flat(pg)
    _, grid = recompute_choices(pg, batch, runtime)
    choices = vouched(grid, runtime)
    fitting = sorted((c for c in choices if c.peak <= budget),
                     key=lambda c: (c.plan.flops, c.peak))
    return fitting, choices


def budget_error(choices, budget: int, batch: int, smallest: int) -> BudgetError:
    """The :class:`BudgetError` for ``budget`` at ``batch`` given the plans
    ``choices`` and the smallest budget that fits (the leanest plan's
    guarded peak, on the rewritten program)."""
    from ..report import format_bytes

    fits = largest_batch(choices, budget)
    return BudgetError(
        f"no plan fits the budget {format_bytes(budget)} at batch size {batch}: the smallest "
        f"budget memopt can fit at this batch is {format_bytes(smallest)} (the leanest "
        f"recomputation plan's predicted peak with Paddle's garbage collector up to "
        f"{GC_LAG_OPS} ops behind); the largest batch that fits {format_bytes(budget)} is {fits}"
        + (" (none)" if fits == 0 else "") + ". The program is unchanged.",
        budget, batch, smallest, fits)
