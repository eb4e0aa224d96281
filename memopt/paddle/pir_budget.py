"""``memory_optimize(budget=...)`` on PIR programs: the recomputation plan for a budget.

:func:`plan_recompute` reads the program's grid of recomputation plans
(:func:`memopt.recompute.evaluate_grid`, each predicted by
:mod:`memopt.analysis` under the current flags: GC, the executor's in-place
pass, its dataflow schedule) and returns the one with the least added
compute whose predicted peak fits ``budget * (1 - MARGIN)``, or raises
:class:`memopt.errors.BudgetError` saying the smallest budget that fits at
that batch and the largest batch that fits the budget.  The program is
not touched here (:func:`memopt.paddle.pir_recompute.apply_plan` applies
the plan; :mod:`memopt.api` wires the steps).
"""
from __future__ import annotations

from ..errors import BudgetError, UnsupportedProgramError

__all__ = ["MARGIN", "recompute_choices", "largest_batch", "plan_recompute",
           "require_flat"]

#: Share of the budget kept free for what the model does not see: kernels'
#: workspaces and the executor's thread timing.  Measured here (CPU, Paddle
#: 3.3.1): the allocator's peak of a recomputed U-Net step (batch 16) was
#: 9.95 MiB for a predicted 8.98 MiB (11% above); scripts/bench_recompute.py
#: reports measured peak / budget for every model.
MARGIN = 0.12


def recompute_choices(pg, batch: int, runtime):
    """The grid of recomputation plans of ``pg`` at ``batch`` with their
    predictions: ``(problem, [Choice])``."""
    from .. import recompute
    from . import pir_recompute
    from .pir_inplace import executor_inplace

    problem = pir_recompute.problem_of(pg, batch)
    pairs = executor_inplace(pg, (), runtime.device) if runtime.inplace else []
    return problem, recompute.evaluate_grid(
        problem, pir_recompute.predictor(batch, runtime, pairs))


def largest_batch(choices, budget: int, margin: float = MARGIN) -> int:
    """The largest batch size some plan of ``choices`` fits ``budget`` at
    (its predicted peak within ``budget * (1 - margin)``); 0 if none."""
    best = 0
    for c in choices:
        fits = c.prediction.max_batch_size(int(budget * (1 - margin)))
        best = max(best, (1 << 30) if fits is None else fits)
    return best


def require_flat(pg) -> None:
    """UnsupportedProgramError unless the program's top-level block runs no
    if/while regions (what recomputation handles)."""
    from .pir_schedule import flat_program

    if not flat_program(pg):
        raise UnsupportedProgramError(
            "budget=: memopt recomputes in PIR programs whose top-level block runs no "
            "if/while regions; this one does. Drop budget= (memory_optimize still "
            "rewrites it) or build the model without static control flow")


def plan_recompute(pg, batch: int, budget: int, runtime):
    """The chosen :class:`memopt.recompute.Choice` for ``budget`` bytes at
    ``batch`` (see the module docstring).

    Raises
    ------
    BudgetError
        No plan's predicted peak fits ``budget * (1 - MARGIN)``.
    """
    from ..report import format_bytes
    from ..recompute import plan_for_budget

    require_flat(pg)
    _, choices = recompute_choices(pg, batch, runtime)
    chosen = plan_for_budget(choices, int(budget * (1 - MARGIN)))
    if chosen is not None:
        return chosen
    least = min(c.peak for c in choices)
    smallest = int(-(-least // (1 - MARGIN)))
    fits = largest_batch(choices, budget)
    raise BudgetError(
        f"no plan fits the budget {format_bytes(budget)} at batch size {batch}: the smallest "
        f"budget memopt can fit at this batch is {format_bytes(smallest)} (predicted peak "
        f"{format_bytes(least)} with the leanest recomputation plan, plus a {MARGIN:.0%} "
        f"margin); the largest batch that fits {format_bytes(budget)} is {fits}"
        + (" (none)" if fits == 0 else "") + ". The program is unchanged.",
        budget, batch, smallest, fits)
