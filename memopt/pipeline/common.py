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


def check_batch(batch_size, what: str) -> Optional[int]:
    """``batch_size`` (None stays None) checked by
    :func:`memopt.arguments.as_batch`: ArgumentTypeError for a float such as
    ``64.0`` or a string, ValueError below 1, each saying ``what`` the batch
    is for and that nothing was changed."""
    from ..arguments import as_batch
    from ..errors import ArgumentTypeError

    if batch_size is None:
        return None
    try:
        return as_batch(batch_size)
    except ArgumentTypeError as exc:
        raise ArgumentTypeError(f"{exc}: {what}; nothing was changed") from None
    except ValueError as exc:
        raise ValueError(f"{exc}: {what}; nothing was changed") from None


def recompute_note(chosen, limit: int, runtime) -> tuple:
    """``(recomputed names, added compute %, the report's note)`` for the
    recomputation plan ``chosen`` (a :class:`memopt.recompute.Choice`) made
    for the budget ``limit`` under ``runtime`` (its step peak checked with
    frees as late as it says)."""
    from ..analysis import late_free_text
    from ..report import format_bytes

    if not chosen.k:
        return [], 0.0, (f"recompute: none needed: the step's peak "
                         f"{format_bytes(chosen.peak)} fits the budget {format_bytes(limit)}")
    recomputed, added = list(chosen.plan.dropped), chosen.plan.added_percent
    shown = ", ".join(recomputed[:8]) + (", ..." if len(recomputed) > 8 else "")
    late = late_free_text(runtime)
    return recomputed, added, (
        f"recompute ({chosen.label}): {len(recomputed)} saved values dropped and "
        f"made again in the backward part by {len(chosen.plan.clones)} cloned "
        f"forward ops ({shown}); added compute {added:.1f}% of the step (FLOPs "
        f"estimate); the rewritten step's peak (above) fits the budget "
        f"{format_bytes(limit)}" + (f" with {late} (Paddle's CPU collector frees on its "
                                    "own thread)" if late else ""))
