"""Which pipeline runs, and the level-2 / budget policy.

:func:`dispatch` runs level 0/1 (memory_optimize) or release_memory through
the pipeline of the program's IR (:func:`memopt.paddle.ir.ir_of`).
:func:`level2_or_budget` is the policy over IR x budget x level:

- PIR: recompute for the budget (:mod:`memopt.paddle.pir.budget`), then
  the in-place rewrite at ``min(level, 1)`` (at level 2 only variants that
  pay under every executor mode), then at level 2 the concat slices (not
  after a recomputation) and the memory-aware order; any step that fails
  takes the earlier ones back with it.
- legacy: a budget as :func:`memopt.pipeline.legacy.within_budget` plans
  it; level 2 is level 1 then the memory-aware order
  (:func:`memopt.pipeline.legacy.order`).
"""
from __future__ import annotations

import math
import time
from typing import List, Optional

import numpy as np

from .errors import UnsupportedProgramError
from .paddle import flags
from .paddle.ir import LEGACY, PIR, ir_of
from .paddle.pir import program as pir_program
from .paddle.pir import rewrite as pir_rewrite
from .pipeline import legacy as legacy_pipeline
from .pipeline import pir as pir_pipeline
from .pipeline.common import bad_batch, recompute_note, without_cycle_collection
from .plan import Options
from .refusals import Refusal
from .report import REFERENCE_BATCH, Report

#: The pipeline of each IR (:attr:`memopt.paddle.ir.IR.name`).
PIPELINES = {"legacy": legacy_pipeline, "pir": pir_pipeline}


def dispatch(program, options: Options, release: bool,
              batch_size: Optional[int] = None) -> Report:
    """memory_optimize (``release=False``) or release_memory at level 0/1 on
    either IR; the report's figures at ``batch_size`` (default
    :data:`memopt.report.REFERENCE_BATCH`)."""
    batch = int(batch_size) if batch_size else None
    pipeline = PIPELINES.get(ir_of(program).name)
    if pipeline is not None:
        with without_cycle_collection():
            return pipeline.release(program, options) if release \
                else pipeline.optimize(program, options, batch)
    hint = ""
    if getattr(program, "_program", None) is not None:  # a CompiledProgram wraps one
        hint = (f": pass the Program the {type(program).__name__} was made from, "
                "before compiling it")
    raise UnsupportedProgramError(
        f"memory_optimize takes a Paddle static program (paddle.base.framework.Program "
        f"or paddle.pir.Program), got {type(program).__name__}{hint}")


def parse_budget(budget) -> int:
    """``budget`` (bytes as an int or a float such as ``1.5e9``, whole bytes
    rounded down as for ``"1.5GiB"``; or a string such as ``"6GiB"``) in bytes;
    TypeError / ValueError naming the value otherwise."""
    from .report import parse_bytes

    numeric = (int, float, np.integer, np.floating)
    if isinstance(budget, bool) or not isinstance(budget, numeric + (str,)):
        raise TypeError(f"budget must be bytes (int or float) or a string such as "
                        f"'6GiB', got {budget!r}")
    if isinstance(budget, (float, np.floating)) and not math.isfinite(budget):
        raise ValueError(f"budget must be a finite number of bytes, got {budget!r}")
    value = parse_bytes(budget) if isinstance(budget, str) else int(budget)
    if value <= 0:
        raise ValueError(f"budget must be positive, got {budget!r}")
    return value


def level2_or_budget(program, options: Options, budget, batch_size) -> Report:
    """level=2 / budget= (PIR): recompute for the budget
    (:mod:`memopt.paddle.pir.budget`, :mod:`memopt.paddle.pir.recompute`),
    then the in-place rewrite at ``min(level, 1)``, then at level 2 the
    concat slices (:mod:`memopt.paddle.pir.concat_slices`; not after a
    recomputation, whose clones may read the same values) and the
    memory-aware order (:mod:`memopt.paddle.pir.schedule`).  A legacy
    program gets level 1 and the memory-aware order
    (:mod:`memopt.paddle.legacy.schedule`) at level 2, and a budget as
    :func:`memopt.pipeline.legacy.within_budget` plans it."""
    from dataclasses import replace

    limit = None
    batch_is_bad = batch_size is not None and bad_batch(batch_size)
    if budget is not None:
        if batch_size is None or batch_is_bad:
            raise ValueError(f"budget= needs batch_size=, the positive batch size the budget "
                             f"is for (got batch_size={batch_size!r})")
        limit = parse_budget(budget)
    lower = replace(options, level=min(options.level, 1))
    ir = ir_of(program)
    if ir is not PIR:
        if batch_is_bad:
            raise ValueError(f"batch_size must be a positive integer, the batch level 2 plans "
                             f"the order for (got batch_size={batch_size!r}); nothing was "
                             "changed")
        if limit is not None:
            if ir is LEGACY:
                return legacy_pipeline.within_budget(program, options, limit, int(batch_size))
        if ir is LEGACY:
            with without_cycle_collection():
                report = legacy_pipeline.optimize(
                    program, lower, int(batch_size) if batch_size else None,
                    reorder=lambda: legacy_pipeline.order(program, options, batch_size))
        else:
            report = dispatch(program, lower, release=False)  # names what it takes
        report.level = options.level
        return report
    from .paddle.pir import convert_cache as pir_convert_cache
    from .paddle.pir import loops as pir_loops

    start = time.perf_counter()
    batch = int(batch_size or REFERENCE_BATCH)
    model = flags.runtime_model("pir")
    notes: List[str] = []
    with without_cycle_collection(), pir_convert_cache.shared():  # one read per state
        pg = pir_program.convert(program, sorted(options.fetch_list))
        pir_rewrite.check_user_names(pg, options)
        pg.kept = frozenset(options.skip_opt_set)  # never dropped by a recomputation
        model = pir_loops.runtime_for(program, model, budget=limit is not None)
        before_analysis = pir_pipeline.analysed(pg, batch, model)
        before = before_analysis.total_peak(batch)
        recomputed, added, applied = [], 0.0, None
        if limit is not None:
            named = {n: pg.values[n] for n in options.fetch_list | options.skip_opt_set
                     if n in pg.values}
            chosen, applied = pir_pipeline.recompute_within(program, pg, options, batch, limit, model)
            recomputed, added, note = recompute_note(chosen, limit)
            notes.append(note)
            if applied is not None:  # the clones moved the "%N" names on
                options, lower = (pir_pipeline.renamed(program, o, named) for o in (options, lower))
        try:
            # the in-place rewrite is all or nothing itself; if it fails the
            # recomputation goes too, so the call changes nothing
            level2 = options.level == 2
            variants = not (level2 and applied is None
                            and not pir_pipeline.variants_pay(program, lower, batch, model))
            report = pir_pipeline.optimize(program, lower, batch, any_order=level2, variants=variants)
            if not variants and report.not_merged.get(Refusal.NO_GAIN):
                left = report.not_merged[Refusal.NO_GAIN]
                notes.append(f"level 2: level 1's {left} in-place variants left out: together "
                             "they lower no predicted peak")
        except BaseException:
            if applied is not None:
                applied.undo()
            raise
        # the fetched Values: their "%N" names change when ops are added or moved
        fetched = pir_pipeline.fetched_values(program, options.fetch_list)
        if options.level == 2:
            notes += pir_pipeline.slices_and_order(program, batch, model, options.fetch_list, fetched,
                                       slices=applied is None)
        after_analysis = pir_pipeline.analysed(pir_program.convert(program, fetched), batch, model)
        report.peak_after = after_analysis.total_peak(batch)
        report.analyses = [before_analysis, after_analysis]
    report.peak_before = before
    report.level = options.level
    report.notes = list(report.notes) + notes
    report.recomputed = recomputed
    report.added_compute_percent = added
    report.budget = limit
    report.seconds = time.perf_counter() - start
    return report
