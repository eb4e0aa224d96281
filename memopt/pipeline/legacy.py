"""memory_optimize and release_memory on a legacy program: read it into a
Graph (:class:`memopt.paddle.ir.LegacyIR`), plan (:mod:`memopt.planner`,
:mod:`memopt.release`), check (:mod:`memopt.verify`), apply all at once
(:mod:`memopt.paddle.legacy.merge_record`, :mod:`memopt.paddle.legacy.program`)
and report; level 2's order and ``budget=`` on legacy programs."""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import List, Optional

from ..analysis import Analysis
from ..errors import UnsupportedProgramError
from ..paddle import flags, guards, pending_backward
from ..paddle.legacy import merge_record
from ..paddle.legacy import program as legacy
from ..paddle.legacy import translation as legacy_translation
from ..paddle.ir import LEGACY
from ..plan import Options
from ..planner import plan_memory
from ..release import plan_releases, verify_releases
from ..report import REFERENCE_BATCH, Holder, Report
from ..reporting import make_report, release_report
from ..verify import check_plan
from .analysis import analyze_program
from .common import recompute_note, without_cycle_collection

log = logging.getLogger(__name__)


def optimize(program, options: Options, batch_size: Optional[int] = None,
                     reorder=None) -> Report:
    """Plan, check and apply memory sharing on a legacy program.

    The plan is made for the runtime's current garbage-collection mode
    (``FLAGS_eager_delete_tensor_gb``) and fully checked before the program
    is touched; the rewrite is all-or-nothing.  ``reorder`` (level 2): run
    on the rewritten program before its peak is analysed, returns notes.
    """
    start = time.perf_counter()
    legacy.check_backward_order(program)
    legacy.check_user_names(program, options)
    graph = LEGACY.read(program, options.fetch_list)
    runtime = flags.read_flags()
    batch = batch_size or REFERENCE_BATCH
    analysed_before = analysed(program, options, batch)
    # run translated to PIR with the GC on, an op reading one variable for
    # its dims and for its data fails: no dims-only substitutions there
    plan = plan_memory(graph, options, runtime.gc,
                       substitutions=not (runtime.gc and runtime.pir_executor))
    check_plan(graph, plan)
    homes = _homes(plan)
    untranslatable = None
    if runtime.pir_executor and options.level >= 1 and plan.groups:
        # run translated to PIR: buffers shared across shapes may not translate
        untranslatable = legacy_translation.translation_error(
            program, plan.groups, homes, plan.order, plan.substitutions)
        if untranslatable:
            plan = plan_memory(graph, dataclasses.replace(options, level=0), runtime.gc,
                               substitutions=not runtime.gc)
            check_plan(graph, plan)
            homes = _homes(plan)
    buffer_of = merge_record.apply_merges(program, plan.groups, homes, legacy.rewrite,
                                          plan.order, plan.substitutions)
    merge_record.mark_substituted(program, plan.substitutions)
    before_backward = _mark_if_before_backward(program, bool(buffer_of or plan.substitutions))
    if buffer_of or plan.substitutions:
        guards.install_legacy()
    if buffer_of:
        plan.reuses = [dataclasses.replace(r, renamed_to=buffer_of.get(r.var, r.renamed_to))
                       for r in plan.reuses]
    seconds = time.perf_counter() - start
    log.debug("memory_optimize: %d variables merged in %.3f s", len(plan.reuses), seconds)
    report = make_report(plan, options, runtime.gc_text, "legacy", seconds, batch_size=batch)
    order_notes = reorder() if reorder is not None else []
    _analysed_peaks(report, program, options, analysed_before)
    if untranslatable:
        report.notes = list(report.notes) + [
            "shared memory only between variables of one shape (as level 0): with "
            "FLAGS_enable_pir_in_executor=1 Paddle runs this program translated to PIR, "
            "which types each variable by its declared shape, and level 1's sharing across "
            f"shapes did not translate ({untranslatable})"]
    if before_backward:
        report.notes = list(report.notes) + [pending_backward.LEGACY_NOTE]
    report.notes = list(report.notes) + order_notes
    return report


def analysed(program, options: Options, batch: int) -> Optional[Analysis]:
    """:func:`analyze_program` of a legacy ``program`` at ``batch`` (what the
    report's peaks are, as on PIR), or None where it cannot be had: Paddle's
    translator refuses the program, or the analysis fails (the report then
    keeps the plan's own estimate; the figures never fail the rewrite,
    which is checked on its own, :func:`memopt.verify.check_plan`)."""
    try:
        return analyze_program(program, batch, fetch_list=sorted(options.fetch_list))
    except UnsupportedProgramError:
        return None
    except Exception as exc:  # a figure of the report, not the rewrite: say it, go on
        log.warning("memory_optimize: the report's peaks are the plan's own estimate: "
                    "memopt.analyze failed on this legacy program (%s: %s)",
                    type(exc).__name__, exc)
        return None


def _analysed_peaks(report: Report, program, options: Options,
                    before: Optional[Analysis]) -> None:
    """Set ``report``'s peaks and largest holders to :func:`analyze_program`'s of
    the legacy program before (``before``) and as it is now, so the report
    and ``memopt.analyze`` give one figure for one program (the plan's own
    estimate leaves out the executor's in-place pass and kernel
    workspaces)."""
    after = analysed(program, options, report.batch_size) if before else None
    if after is None:
        return
    b = report.batch_size
    report.persistable_bytes = before.persistable_bytes(b)
    report.peak_before, report.peak_after = before.step_peak(b), after.step_peak(b)
    report.top_holders = [Holder(h.name, h.bytes(b), tuple(h.names))
                          for h in after.held_at(None, b)[:5]]
    report.analyses = [before, after]


def _homes(plan) -> dict:
    """``{name: block index}`` of every variable a plan renames, and of its new name."""
    homes = {}
    for block_idx, mapping in plan.renames.items():
        for old, new in mapping.items():
            homes[old] = homes[new] = block_idx
    return homes


def _mark_if_before_backward(program, changed: bool) -> bool:
    """Record in a legacy ``program`` that memopt ``changed`` it while it
    could still be differentiated (:mod:`memopt.paddle.pending_backward`)."""
    if not (changed and pending_backward.can_still_be_differentiated(program)):
        return False
    merge_record.mark_before_backward(program)
    return True


def release(program, options: Options) -> Report:
    """Free each temporary of a legacy program right after its last use.

    With the garbage collector on (the default) Paddle does that itself and
    the program is left as it is.  With it off,
    :func:`memopt.release.plan_releases` picks the points,
    :func:`memopt.release.verify_releases` checks them and
    :func:`memopt.paddle.legacy.program.insert_releases` puts them in; fetching a
    released variable afterwards raises :class:`MergedVariableError`.
    """
    start = time.perf_counter()
    legacy.check_backward_order(program)
    legacy.check_user_names(program, options)
    graph = LEGACY.read(program, options.fetch_list)
    runtime = flags.read_flags()
    plan = plan_releases(graph, options.skip_opt_set | options.fetch_list)
    released: List[str] = []
    ops = 0
    if not runtime.gc and plan.after and runtime.pir_executor:
        raise UnsupportedProgramError(
            "release_memory cannot free variables of a legacy program that Paddle runs "
            "translated to PIR (FLAGS_enable_pir_in_executor=1): the translation turns each "
            "release (a share_buffer) into pd_op.share_data_, whose result is the variable "
            "it reads, so every released variable would alias one memory; nothing was "
            "changed. Run the program with FLAGS_enable_pir_in_executor=0 (the legacy "
            "executor; paddle.pir_utils.OldIrGuard() turns it off: call release_memory "
            "inside the guard the program runs in), or with the garbage collector on "
            "(FLAGS_eager_delete_tensor_gb=0: the executor frees each temporary itself), "
            "or build it in PIR")
    if not runtime.gc and plan.after:
        verify_releases(graph, plan.after)
        # each released name moves to a fresh memopt@buf_<k> (the record in
        # its desc) and leaves the program once the releases are in
        mapping, undo, finish = merge_record.rename_released(program, plan.released,
                                                             legacy.rewrite)
        try:
            ops = legacy.insert_releases(program, {i: [mapping.get(n, n) for n in names]
                                                   for i, names in plan.after.items()})
        except BaseException:
            undo()
            raise
        finish()
        released = plan.released
        guards.install_legacy()
    before_backward = _mark_if_before_backward(program, bool(released))
    seconds = time.perf_counter() - start
    report = release_report(plan, released, ops, options, runtime.gc, runtime.gc_text, "legacy",
                            seconds)
    if before_backward:
        report.notes = list(report.notes) + [pending_backward.LEGACY_NOTE]
    return report


def within_budget(program, options: Options, limit: int, batch: int) -> Report:
    """budget= on a legacy program: the recomputation plan of
    :func:`memopt.paddle.pir.budget.choose_plan` on its
    :class:`memopt.paddle.legacy.recompute.LegacyTarget`, then the legacy
    rewrite at ``min(level, 1)``; if that fails the plan is undone, so the
    call changes nothing.  The report's peaks are :func:`analyze_program`'s."""
    from dataclasses import replace

    from ..paddle.legacy import recompute as legacy_recompute
    from ..paddle.pir import budget as pir_budget
    from ..report import format_bytes

    if flags.read_flags().pir_executor:
        raise UnsupportedProgramError(
            "memory_optimize(budget=...) on a legacy Program needs the legacy executor "
            "(FLAGS_enable_pir_in_executor=0: a process started with FLAGS_enable_pir_api=0, "
            "or inside paddle.pir_utils.OldIrGuard()), which runs the depend ops that keep "
            "recomputed ops in the backward part; the executor now translates it to PIR. "
            "Call memory_optimize where the program runs, or build it in PIR")
    start = time.perf_counter()
    legacy.check_user_names(program, options)
    model = flags.runtime_model("legacy")
    fetch = sorted(options.fetch_list)
    target = legacy_recompute.LegacyTarget(program, fetch, kept=options.skip_opt_set)
    with without_cycle_collection():
        before_analysis = target.analysis(fetch, batch, model)
        before = before_analysis.step_peak(batch)
        pir_budget.require_supported(target)  # a peak memopt cannot model is no promise
        if before <= limit:  # the one model says it fits: nothing recomputed
            applied, recomputed, added = None, [], 0.0
            notes = [f"recompute: none needed: the step's peak {format_bytes(before)} fits "
                     f"the budget {format_bytes(limit)}"]
        else:
            chosen, applied = pir_budget.choose_plan(target, fetch, batch, limit, model)
            recomputed, added, note = recompute_note(chosen, limit, model)
            notes = [note]
        lower = replace(options, level=min(options.level, 1))
        try:
            # the sharing rewrite, tried on a copy first: kept only if the
            # program it makes still fits the budget as the plan was checked
            trial = program.clone()
            optimize(trial, lower)
            try:
                shared = pir_budget.guarded_peak(legacy_recompute.LegacyTarget(trial, fetch)
                                                 .analysis(fetch, batch, model), batch)
                why = f"is predicted at {format_bytes(shared)}, over the budget"
            except UnsupportedProgramError as exc:  # its merges unreadable: unchecked
                shared, why = None, f"cannot be read to check it against the budget ({exc})"
            if shared is not None and shared <= limit:
                report = optimize(program, lower)
            else:
                report = optimize(program, replace(lower, skip_opt_set=frozenset(
                    legacy.known_names(program))))
                notes.append(f"level {lower.level}'s sharing left out: the program it makes "
                             + why)
        except BaseException:
            if applied is not None:
                applied.undo()
            raise
        after_analysis = target.analysis(fetch, batch, model)
        report.peak_after = after_analysis.step_peak(batch)
        report.analyses = [before_analysis, after_analysis]  # (not the inner call's)
    report.peak_before = before
    report.batch_size = batch
    report.level = options.level
    report.notes = list(report.notes) + notes + (
        ["level 2: on a legacy program the memory-aware order is not combined with "
         "budget=; this program got the recomputation and level 1"]
        if options.level == 2 else [])
    report.recomputed = recomputed
    report.added_compute_percent = added
    report.budget = limit
    report.seconds = time.perf_counter() - start
    return report


def order(program, options: Options, batch_size) -> List[str]:
    """Level 2's memory-aware order of a legacy program, after level 1's
    rewrite (:func:`memopt.paddle.legacy.schedule.level2_order`: all or
    nothing); returns the report's notes."""
    from ..paddle.legacy import schedule as legacy_schedule

    with without_cycle_collection():
        return legacy_schedule.level2_order(program, int(batch_size or REFERENCE_BATCH),
                                            sorted(options.fetch_list),
                                            flags.runtime_model("legacy"))
