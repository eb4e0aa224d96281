"""Helpers the pipelines, the policy and the API share: the pause of Python's
cycle collector while planning, the batch-size check, the default program,
and the report's note for a recomputation plan."""
from __future__ import annotations

import contextlib
import gc as python_gc
from typing import Optional

import numpy as np


def default_program(program):
    if program is not None:
        return program
    import paddle

    return paddle.static.default_main_program()


@contextlib.contextmanager
def without_cycle_collection():
    """Pause Python's cyclic garbage collector for the duration.

    Planning allocates many small objects while Paddle programs (large
    object graphs) are alive, so the collector's full passes would land
    inside memory_optimize and cost it time that grows with everything the
    process holds (``benchmarks/bench_scale.py`` shows it on a 100,000-op
    program).  Nothing planned here needs a cycle collected mid-way.
    """
    was_enabled = python_gc.isenabled()
    python_gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            python_gc.enable()


def bad_batch(batch_size) -> bool:
    """Whether ``batch_size`` is not a positive integer (a bool is not one)."""
    return isinstance(batch_size, bool) or not isinstance(
        batch_size, (int, np.integer)) or batch_size < 1


def recompute_note(chosen, limit: int, lag: Optional[int] = None) -> tuple:
    """``(recomputed names, added compute %, the report's note)`` for the
    recomputation plan ``chosen`` (a :class:`memopt.recompute.Choice`) made
    for the budget ``limit``, checked with frees ``lag`` ops late (default
    :data:`memopt.paddle.pir.budget.GC_LAG_OPS`)."""
    from ..paddle.pir.budget import GC_LAG_OPS
    from ..report import format_bytes

    lag = GC_LAG_OPS if lag is None else lag
    if not chosen.k:
        return [], 0.0, (f"recompute: none needed: the predicted peak "
                         f"{format_bytes(chosen.peak)} fits the budget {format_bytes(limit)}")
    recomputed, added = list(chosen.plan.dropped), chosen.plan.added_percent
    shown = ", ".join(recomputed[:8]) + (", ..." if len(recomputed) > 8 else "")
    return recomputed, added, (
        f"recompute ({chosen.label}): {len(recomputed)} saved values dropped and "
        f"made again in the backward part by {len(chosen.plan.clones)} cloned "
        f"forward ops ({shown}); added compute {added:.1f}% of the step (FLOPs "
        f"estimate); predicted peak {format_bytes(chosen.peak)} for the budget "
        f"{format_bytes(limit)} (frees taken up to {lag} ops late: Paddle's CPU "
        "collector frees on its own thread)")
