"""memory_optimize and release_memory on a PIR program: read it
(:func:`memopt.paddle.pir.program.convert`), state its ops' in-place variants
(:func:`memopt.paddle.pir.rewrite.state_inplace_facts`), let the core choose
(:func:`memopt.candidates.variant_inplace`), apply
(:func:`memopt.paddle.pir.rewrite.apply_inplace`) and report; level 2's
slices and order, and the recomputation for a budget."""
from __future__ import annotations

import logging
import time
from typing import List, Optional

from ..analysis import Analysis, RuntimeModel, from_graph
from ..any_order import single_reader_rule
from ..candidates import variant_inplace
from ..paddle import flags, guards
from ..paddle import runtime as paddle_runtime
from ..paddle.pir import inplace as pir_inplace
from ..paddle.pir import program as pir
from ..paddle.pir import rewrite as pir_rewrite
from ..plan import Options
from ..report import REFERENCE_BATCH, Report, Reuse
from ..refusals import Refusal
from ..reporting import pir_release_report, pir_report
from .arguments import argument_names
from .common import without_cycle_collection

log = logging.getLogger(__name__)


def optimize(program, options: Options, batch_size: Optional[int] = None,
                  any_order: bool = False, variants: bool = True) -> Report:
    """Plan (the adapter states its ops' in-place variants,
    :func:`memopt.paddle.pir.rewrite.state_inplace_facts`; the core decides,
    :func:`memopt.candidates.variant_inplace`), apply
    (:func:`memopt.paddle.pir.rewrite.apply_inplace`) and report.

    The Report's peaks (persistable bytes included) are :mod:`memopt.analysis`
    estimates at ``batch_size`` (default :data:`memopt.report.REFERENCE_BATCH`)
    under the runtime's current flags, i.e. counting what the executor does
    anyway; its notes say how many ops the executor's own pass runs in place.
    ``any_order`` (level 2): only the in-place variants whose input no other
    op reads (:func:`memopt.any_order.single_reader_rule`), which no order
    the executor takes can make hold more.  ``variants=False``: none (each
    counted under :data:`Refusal.NO_GAIN`).
    """
    start = time.perf_counter()
    batch = batch_size or REFERENCE_BATCH
    runtime = flags.read_flags()
    model = RuntimeModel(gc=runtime.gc, inplace=runtime.inplace)
    pg = pir.convert(program, sorted(options.fetch_list))
    pir_rewrite.check_user_names(pg, options)
    before = analysed(pg, batch, model)
    pir_rewrite.state_inplace_facts(pg)
    rewrites, reasons = variant_inplace(
        pg.graph, options, single_reader_rule(pg.graph) if any_order else None)
    if not variants and rewrites:
        reasons[Refusal.NO_GAIN] = reasons.get(Refusal.NO_GAIN, 0) + len(rewrites)
        rewrites = []
    reuses = []
    for rw in rewrites:
        for nin, nout in rw.pairs:
            var = pg.graph.find_var(nout, rw.block)
            reuses.append(Reuse(var=nout, takes=nin, renamed_to=nin, shape=tuple(var.shape),
                                dtype=var.dtype, size=var.size, block=rw.block,
                                how="in-place", op=f"{rw.op_name} -> {rw.op_name}_"))
    replaced = pir_rewrite.apply_inplace(pg, rewrites) if rewrites else {}
    if rewrites:
        pir_rewrite.record_rewrite(program, replaced)
        guards.install_pir()  # a fetch of a Value written over raises
        # (an in-place variant takes its op's place: the values keep their names)
        after = analysed(pir.convert(program, sorted(options.fetch_list)), batch, model)
    else:
        after = before
    report = pir_report(pg.graph, before, after, reuses, reasons, len(rewrites), options,
                        runtime.gc, runtime.pir_text, batch, time.perf_counter() - start)
    report.analyses = [before, after]
    log.debug("PIR memory_optimize: %d ops in place in %.3f s", len(rewrites), report.seconds)
    return report


def variants_pay(program, options: Options, batch: int, model: RuntimeModel) -> bool:
    """Whether level 1's in-place variants (those level 2 may apply), tried
    on a clone of ``program``, lower its predicted peak under the runtime's
    own executor mode and raise it under none of
    :func:`memopt.paddle.pir.schedule.executor_modes`."""
    from ..paddle.pir.schedule import executor_modes, mode_peaks

    clone = program.clone()
    optimize(clone, options, batch, any_order=True)
    modes = executor_modes(model)
    fetch = sorted(options.fetch_list)
    before, after = (mode_peaks(program, batch, modes, fetch=fetch),
                     mode_peaks(clone, batch, modes, fetch=fetch))
    return after["own"] < before["own"] and all(after[m] <= before[m] for m in before)


def analysed(pg, batch: int, model: RuntimeModel) -> Analysis:
    """The memory analysis of a read PIR program under ``model``."""
    read = paddle_runtime.executed(pg, model)
    return from_graph(read.graph, batch, model, read.inplace)


def release(program, options: Options) -> Report:
    """release_memory for a PIR program: nothing to insert (Paddle's garbage
    collector frees each value after its last use); the Report says how
    memory is released and what the analysis estimates.  The program is not
    changed."""
    start = time.perf_counter()
    runtime = flags.read_flags()
    model = RuntimeModel(gc=runtime.gc, inplace=runtime.inplace)
    pg = pir.convert(program, sorted(options.fetch_list))
    pir_rewrite.check_user_names(pg, options)
    an = analysed(pg, REFERENCE_BATCH, model)
    kept = sorted(set(options.skip_opt_set) & set(pg.values))
    report = pir_release_report(pg.graph, an, kept, runtime.gc, runtime.pir_text,
                                time.perf_counter() - start)
    report.analyses = [an, an]  # the program is not changed
    return report


def slices_and_order(program, batch: int, model, fetch_names, fetched, slices: bool) -> list:
    """Level 2's zero-FLOP steps after the in-place rewrite: the concat
    slices (``slices``: not after a recomputation) and the memory-aware
    order; returns the report's notes.  Both only lower a predicted peak, so
    if either fails the program goes back to what the in-place rewrite left
    (its slices undone, the ops in their order) and a note says what was
    left out and why: the call never returns a half-applied step."""
    from ..paddle.pir import concat_slices as pir_concat_slices
    from ..paddle.pir import recompute as pir_recompute
    from ..paddle.pir import schedule as pir_schedule
    from ..report import format_bytes

    notes: List[str] = []
    applied_slices, original_ops = None, list(program.global_block().ops)
    try:
        if slices:
            _, note, applied_slices = pir_concat_slices.slice_if_lower(
                program, batch, model, fetch_names, fetched)
            notes += [note] if note else []
        choice = pir_schedule.plan_order(program, batch, model, fetched)
        if choice.order is not None:
            pir_schedule.apply_order(program, choice.order)
            notes.append(f"level 2: ops reordered ({choice.name} order): predicted peak "
                         f"{format_bytes(choice.peaks['program'])} -> "
                         f"{format_bytes(choice.peaks[choice.name])}")
        else:
            tried = ", ".join(f"{k} {format_bytes(v)}" for k, v in choice.peaks.items())
            notes.append(choice.note or ("level 2: the program's own order kept: no other "
                                         f"order lowers the predicted peak ({tried})"))
    except Exception as exc:  # noqa: BLE001 - reported in the notes, program restored
        if applied_slices is not None:
            applied_slices.undo()  # its ops removed, the others in their order again
        else:
            pir_recompute.restore_order(program.global_block(), original_ops)
        logging.getLogger("memopt").warning("level 2's slices / order left out: %r", exc)
        return [f"level 2: the concat slices and the memory-aware order left out: "
                f"{type(exc).__name__}: {exc} (the program keeps level 1's rewrite)"]
    return notes


def renamed(program, options: Options, named: dict) -> Options:
    """``options`` with each ``fetch_list`` / ``skip_opt_set`` name of
    ``named`` (name -> the PIR Value it named) renamed to what ``program``
    calls that Value now: ops added before it (a budget's clones) move the
    ``%N`` names on, and the old name then names another value or none
    (a fetched gradient edited after the backward: "fetch_list has a name
    that the program does not have: '%43'")."""
    from dataclasses import replace

    now = pir.value_names(program)

    def rename(names):
        return frozenset(now.get(named[n].id, n) if n in named else n for n in names)
    return replace(options, fetch_list=rename(options.fetch_list),
                   skip_opt_set=rename(options.skip_opt_set))


def fetched_values(program, names) -> list:
    """The PIR Values of ``program`` that ``names`` (fetch_list names) name
    now: analyses after ops are added or moved take these, as a fetched
    value stays alive to the end of the step."""
    values = pir.convert(program, sorted(names)).values
    return [values[name] for name in sorted(names) if name in values]


def recompute_within(program, pg, options: Options, batch: int, limit: int, model):
    """Apply the best recomputation plan for ``limit`` whose rewritten
    program, read back and analysed by the same model, still fits
    (:func:`memopt.paddle.pir.budget.choose_plan`).  Returns ``(choice,
    AppliedRecompute or None)``; BudgetError when none fits (the program
    unchanged)."""
    from ..paddle.pir import budget as pir_budget

    return pir_budget.choose_plan(pg, sorted(options.fetch_list), batch, limit, model)


def batch_planner(program, fetch_list: list, runtime: RuntimeModel):
    """``planner(budget, start_batch, limit) -> int`` for
    :meth:`Analysis.max_batch_size` (``recompute=True``): the largest batch
    found at which ``memory_optimize(program, budget=budget, batch_size=n)``
    returns a plan under ``runtime``
    (:func:`memopt.paddle.pir.budget.largest_planned_batch`, planning the
    program as it is when called, searched from the estimate of the grid
    at ``start_batch``); the program is left as it was."""
    def planner(budget: int, start_batch: int, limit: int) -> int:
        from ..paddle.pir import budget as pir_budget, loops as pir_loops

        fetch_names = sorted(argument_names(fetch_list, "fetch_list"))  # as memory_optimize reads them
        with pir_inplace.static_mode(), without_cycle_collection():
            pg = pir.convert(program, fetch_names)
            model = pir_loops.runtime_for(program, runtime, budget=True)  # as budget= does
            _, choices = pir_budget.plan_recompute(pg, start_batch, budget, model)
            return pir_budget.largest_planned_batch(
                pg, fetch_names, budget, model, limit=limit, order=choices,
                start=pir_budget.estimated_batch(choices, budget, limit))

    return planner
