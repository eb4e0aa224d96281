"""The public entry points: ``memory_optimize``, ``release_memory``, ``analyze``.

This module checks the arguments, reads the runtime's memory model
(:mod:`memopt.paddle.flags`), dispatches on the program type and wires the
adapters (:mod:`memopt.paddle.legacy.program`, :mod:`memopt.paddle.pir.program`,
:mod:`memopt.paddle.pir.rewrite`, :mod:`memopt.paddle.runtime`) to the core
(:mod:`memopt.planner`, :mod:`memopt.verify`, :mod:`memopt.release`,
:mod:`memopt.analysis`, :mod:`memopt.reporting`).  The work flows one way::

    Program -> adapter -> Graph -> planner -> Plan (pure data) -> checks
            -> adapter applies the plan all at once -> Report

The adapters never call back into this module or the planner.  Paddle is
imported only when a Paddle program is handed in.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc as python_gc
import logging
import math
import time
from typing import Any, Iterable, List, Optional

import numpy as np

from .analysis import Analysis, RuntimeModel, from_graph
from .any_order import single_reader_rule
from .candidates import variant_inplace
from .errors import UnsupportedProgramError
from .graph import Graph, unversioned
from .paddle import distributed, flags, pending_backward, sharding
from .paddle.legacy import merge_record
from .paddle.legacy import program as legacy
from .paddle.legacy import translation as legacy_translation
from .paddle.pir import inplace as pir_inplace
from .paddle.pir import owner as pir_owner
from .paddle.pir import program as pir
from .paddle.pir import retired as pir_retired
from .paddle.pir import rewrite as pir_rewrite
from .paddle import runtime as paddle_runtime
from .parallel import ProgramFacts, RankEstimate, Strategy, estimate_rank
from .plan import Options
from .planner import plan_memory
from .release import plan_releases, verify_releases
from .report import REFERENCE_BATCH, Holder, Report, Reuse
from .reporting import make_report, pir_release_report, pir_report, release_report
from .verify import check_plan

__all__ = ["memory_optimize", "release_memory", "analyze", "estimate", "program_facts",
           "resolve_options", "Options"]

log = logging.getLogger(__name__)


# -- arguments ---------------------------------------------------------------------

def _name_of(item, index: int, argument: str = "skip_opt_set") -> str:
    """The variable name of a skip_opt_set / fetch_list item: a str, a legacy
    Variable, or a PIR Value (named as :func:`memopt.paddle.pir.program.value_name`
    does)."""
    if isinstance(item, str):
        return item
    if type(item).__name__ == "Value" and hasattr(item, "get_defining_op"):
        try:
            return pir.value_name(item)
        except ValueError as exc:
            raise TypeError(f"{argument}[{index}]: {exc}") from None
    try:
        name = getattr(item, "name", None)
    except Exception:  # a PIR Value without a name raises
        name = None
    if isinstance(name, str) and name:
        return name
    raise TypeError(
        f"{argument}[{index}] is a {type(item).__name__} with no variable name; "
        "pass variable names (str) or Variables")


def _names(value, argument: str) -> frozenset:
    """The names of a skip_opt_set / fetch_list argument (None: none; a
    single Variable or Value is accepted as a fetch_list)."""
    if value is None:
        return frozenset()
    if isinstance(value, (str, bytes)):
        raise TypeError(
            f"{argument} must be a set, list or tuple of variable names, not the "
            f"string {value!r}: note that ({value!r}) is a string, not a "
            f"tuple; write ({value!r},) or {{{value!r}}}")
    if isinstance(value, (set, frozenset, list, tuple)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else list(value)
        return frozenset(_name_of(item, i, argument) for i, item in enumerate(items))
    if argument == "fetch_list" and (pir.is_pir_value(value) or hasattr(value, "name")):
        return frozenset([_name_of(value, 0, argument)])
    raise TypeError(
        f"{argument} must be None or a set, list or tuple of variable names or "
        f"Variables, got {type(value).__name__}")


def resolve_options(skip_opt_set=None, skip_grads: bool = True, level: int = 0,
                    print_log: bool = False, fetch_list=None) -> Options:
    """Check memory_optimize's arguments and turn them into :class:`Options`.

    Raises
    ------
    TypeError
        ``skip_opt_set`` is a bare string (``("fc")`` is the string ``"fc"``,
        not a tuple) or not a set/list/tuple of names or Variables;
        ``skip_grads`` or ``print_log`` is not a bool.
    ValueError
        ``level`` is not 0, 1 or 2.
    """
    names = _names(skip_opt_set, "skip_opt_set")
    fetched = _names(fetch_list, "fetch_list")
    for arg, value in (("skip_grads", skip_grads), ("print_log", print_log)):
        if not isinstance(value, bool) and type(value).__name__ != "bool_":
            raise TypeError(f"{arg} must be True or False, got {value!r}")
    if isinstance(level, bool) or level not in (0, 1, 2):
        raise ValueError(
            f"level must be 0 (reuse only between variables of the same shape and "
            f"dtype), 1 (any variable of the same dtype whose memory is provably "
            f"large enough) or 2 (level 1 and a memory-aware op order), got {level!r}")
    return Options(names, bool(skip_grads), int(level), bool(print_log), fetched)


# -- memory_optimize / release_memory ----------------------------------------------

def _default_program(program):
    if program is not None:
        return program
    import paddle

    return paddle.static.default_main_program()


@contextlib.contextmanager
def _without_cycle_collection():
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


def _bad_batch(batch_size) -> bool:
    """Whether ``batch_size`` is not a positive integer (a bool is not one)."""
    return isinstance(batch_size, bool) or not isinstance(
        batch_size, (int, np.integer)) or batch_size < 1


def _dispatch(program, options: Options, release: bool,
              batch_size: Optional[int] = None) -> Report:
    """memory_optimize (``release=False``) or release_memory at level 0/1 on
    either IR; the report's figures at ``batch_size`` (default
    :data:`memopt.report.REFERENCE_BATCH`)."""
    batch = int(batch_size) if batch_size else None
    with _without_cycle_collection():
        if legacy.is_legacy_program(program):
            return _legacy_release(program, options) if release \
                else _legacy_optimize(program, options, batch)
        if pir.is_pir_program(program):
            return _pir_release(program, options) if release \
                else _pir_optimize(program, options, batch)
    hint = ""
    if getattr(program, "_program", None) is not None:  # a CompiledProgram wraps one
        hint = (f": pass the Program the {type(program).__name__} was made from, "
                "before compiling it")
    raise UnsupportedProgramError(
        f"memory_optimize takes a Paddle static program (paddle.base.framework.Program "
        f"or paddle.pir.Program), got {type(program).__name__}{hint}")


def _legacy_optimize(program, options: Options, batch_size: Optional[int] = None,
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
    graph = _legacy_graph(program, options)
    runtime = flags.read_flags()
    batch = batch_size or REFERENCE_BATCH
    analysed_before = _legacy_analysis(program, options, batch)
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
        legacy.install_fetch_guard()
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


def _legacy_analysis(program, options: Options, batch: int) -> Optional[Analysis]:
    """:func:`analyze` of a legacy ``program`` at ``batch`` (what the
    report's peaks are, as on PIR), or None where it cannot be had: Paddle's
    translator refuses the program, or the analysis fails (the report then
    keeps the plan's own estimate; the figures never fail the rewrite,
    which is checked on its own, :func:`memopt.verify.check_plan`)."""
    try:
        return analyze(program, batch, fetch_list=sorted(options.fetch_list))
    except UnsupportedProgramError:
        return None
    except Exception as exc:  # a figure of the report, not the rewrite: say it, go on
        log.warning("memory_optimize: the report's peaks are the plan's own estimate: "
                    "memopt.analyze failed on this legacy program (%s: %s)",
                    type(exc).__name__, exc)
        return None


def _analysed_peaks(report: Report, program, options: Options,
                    before: Optional[Analysis]) -> None:
    """Set ``report``'s peaks and largest holders to :func:`analyze`'s of
    the legacy program before (``before``) and as it is now, so the report
    and ``memopt.analyze`` give one figure for one program (the plan's own
    estimate leaves out the executor's in-place pass and kernel
    workspaces)."""
    after = _legacy_analysis(program, options, report.batch_size) if before else None
    if after is None:
        return
    b = report.batch_size
    report.persistable_bytes = before.persistable_bytes(b)
    report.peak_before, report.peak_after = before.total_peak(b), after.total_peak(b)
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


def _legacy_graph(program, options: Options) -> Graph:
    """The program's graph with ``options.fetch_list`` fetched at the end."""
    graph = legacy.program_to_graph(program)
    if options.fetch_list:
        graph.fetch_names = tuple(dict.fromkeys((*graph.fetch_names,
                                                 *sorted(options.fetch_list))))
    return graph


def _legacy_release(program, options: Options) -> Report:
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
    graph = _legacy_graph(program, options)
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
        legacy.install_fetch_guard()
    before_backward = _mark_if_before_backward(program, bool(released))
    seconds = time.perf_counter() - start
    report = release_report(plan, released, ops, options, runtime.gc, runtime.gc_text, "legacy",
                            seconds)
    if before_backward:
        report.notes = list(report.notes) + [pending_backward.LEGACY_NOTE]
    return report


def _pir_optimize(program, options: Options, batch_size: Optional[int] = None,
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
    counted under :data:`R_NO_GAIN`).
    """
    start = time.perf_counter()
    batch = batch_size or REFERENCE_BATCH
    runtime = flags.read_flags()
    model = RuntimeModel(gc=runtime.gc, inplace=runtime.inplace)
    pg = pir.convert(program, sorted(options.fetch_list))
    pir_rewrite.check_user_names(pg, options)
    before = _pir_analysis(pg, batch, model)
    pir_rewrite.state_inplace_facts(pg)
    rewrites, reasons = variant_inplace(
        pg.graph, options, single_reader_rule(pg.graph) if any_order else None)
    if not variants and rewrites:
        reasons[R_NO_GAIN] = reasons.get(R_NO_GAIN, 0) + len(rewrites)
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
        # (an in-place variant takes its op's place: the values keep their names)
        after = _pir_analysis(pir.convert(program, sorted(options.fetch_list)), batch, model)
    else:
        after = before
    report = pir_report(pg.graph, before, after, reuses, reasons, len(rewrites), options,
                        runtime.gc, runtime.pir_text, batch, time.perf_counter() - start)
    report.analyses = [before, after]
    log.debug("PIR memory_optimize: %d ops in place in %.3f s", len(rewrites), report.seconds)
    return report


#: Why level 2 left level 1's in-place variants out (see :func:`_variants_pay`).
R_NO_GAIN = ("level 2: the in-place variants together lower no predicted peak (level 2 "
             "changes the program only where the model predicts it lower)")


def _variants_pay(program, options: Options, batch: int, model: RuntimeModel) -> bool:
    """Whether level 1's in-place variants (those level 2 may apply), tried
    on a clone of ``program``, lower its predicted peak under the runtime's
    own executor mode and raise it under none of
    :func:`memopt.paddle.pir.schedule.executor_modes`."""
    from .paddle.pir.schedule import executor_modes, mode_peaks

    clone = program.clone()
    _pir_optimize(clone, options, batch, any_order=True)
    modes = executor_modes(model)
    fetch = sorted(options.fetch_list)
    before, after = (mode_peaks(program, batch, modes, fetch=fetch),
                     mode_peaks(clone, batch, modes, fetch=fetch))
    return after["own"] < before["own"] and all(after[m] <= before[m] for m in before)


def _pir_analysis(pg, batch: int, model: RuntimeModel) -> Analysis:
    """The memory analysis of a read PIR program under ``model``."""
    read = paddle_runtime.executed(pg, model)
    return from_graph(read.graph, batch, model, read.inplace)


def _pir_release(program, options: Options) -> Report:
    """release_memory for a PIR program: nothing to insert (Paddle's garbage
    collector frees each value after its last use); the Report says how
    memory is released and what the analysis estimates.  The program is not
    changed."""
    start = time.perf_counter()
    runtime = flags.read_flags()
    model = RuntimeModel(gc=runtime.gc, inplace=runtime.inplace)
    pg = pir.convert(program, sorted(options.fetch_list))
    pir_rewrite.check_user_names(pg, options)
    an = _pir_analysis(pg, REFERENCE_BATCH, model)
    kept = sorted(set(options.skip_opt_set) & set(pg.values))
    report = pir_release_report(pg.graph, an, kept, runtime.gc, runtime.pir_text,
                                time.perf_counter() - start)
    report.analyses = [an, an]  # the program is not changed
    return report


def memory_optimize(program=None, skip_opt_set=None, skip_grads: bool = True,
                    level: int = 0, print_log: bool = False, *, fetch_list=None,
                    budget=None, batch_size: Optional[int] = None, optimizer=None,
                    set_to_zero: bool = True):
    """Rewrite a Paddle static program so that variables share memory.

    Parameters
    ----------
    program : a legacy ``paddle.base.framework.Program`` or a
        ``paddle.pir.Program``; None means
        ``paddle.static.default_main_program()``.  Rewritten in place.
    skip_opt_set : names or Variables never renamed and whose memory is
        never given to another (a set, list or tuple -- not a bare string).
    skip_grads : leave the backward part (gradients) alone.
    level : 0 -- share only between the same shape and dtype; 1 -- share
        between the same dtype whenever the memory taken over is provably
        large enough (sizes symbolic in the batch dimension are compared for
        every batch size); never across dtypes, as Paddle's executor reads
        each variable's declared dtype.  2 -- level 1 (only its in-place
        variants whose input no other op reads) plus, on PIR, saved values a
        saved concat holds again sliced out of it in the backward part and a
        memory-aware order of the ops (legacy programs: the order, kept by
        ``depend`` ops, :mod:`memopt.paddle.legacy.schedule`); each kept
        only where it lowers the predicted peak and raises it under no
        executor mode modelled.
    print_log : print the report (one line per reuse and a summary).
    fetch_list : (keyword only) what you will fetch from the program:
        Variables, PIR Values or names.  They keep their own memory and
        stay fetchable, as if in ``skip_opt_set``.

    Every name in ``skip_opt_set`` and ``fetch_list`` must be one the
    program has: a ValueError names those it does not, with the closest
    names it does have, and the program is left unchanged.

    budget : (keyword only) bytes (int) or a string such as ``"6GiB"``: the allocator peak
        one training step at ``batch_size`` may reach, parameters and
        optimizer state included.  memopt recomputes forward values in the
        backward part (PIR programs: an if/while op is kept whole, with
        every value it reads, and a training while loop needs a constant
        trip count; legacy programs without sub-blocks, run on the legacy
        executor) so the predicted peak fits with the least added compute
        (values in ``skip_opt_set`` are never dropped); the report says
        what is recomputed, the added compute and the predicted peak.
    batch_size : (keyword only) the batch size the budget is for (needed with
        ``budget``); level 2 plans its order for it; the report's figures are
        given at it (default 32).

    Returns
    -------
    Report
        What was merged and the estimated memory before/after.

    Raises
    ------
    TypeError, ValueError
        Bad arguments (see :func:`resolve_options`).
    UnsupportedProgramError
        ``program`` is not a Paddle static program.
    PlanError
        The plan failed a check (a bug): the program is unchanged.
    BudgetError
        No plan fits ``budget``: the message and the error's
        ``smallest_budget`` / ``largest_batch`` say the least budget that
        gets a plan at ``batch_size`` and the largest batch found that gets
        one within ``budget`` (both checked by planning there, so this
        function given either returns a plan; see
        :class:`memopt.errors.BudgetError`); the program is unchanged.

    Notes
    -----
    A ``paddle.jit.to_static`` step (what ``to_static`` returned for a
    function or a Layer, SOT or ``full_graph=True``) as ``program``: every
    training program Paddle builds for it from then on is rewritten as above
    before its first run, with ``skip_grads``, ``level``, ``budget`` and
    ``batch_size``; ``budget`` is then the allocator peak of one whole
    steady training step (``loss = step(*inputs); loss.backward();
    opt.step(); opt.clear_grad(set_to_zero)``), the state of ``optimizer``
    and the gradients ``clear_grad`` keeps (``set_to_zero``) counted outside
    the programs.  Call it before the step's first call
    (:class:`memopt.errors.StepAlreadyRunError` otherwise).  Returns a
    :class:`memopt.paddle.dygraph.to_static.StepOptimization`: ``.reports``
    (one per program built), ``.remove()`` to take memopt off; see
    :mod:`memopt.paddle.dygraph.to_static`.

    Merged variables' memory lives under fresh names (``memopt@buf_<k>``);
    the merged-away names leave the program, so fetching one fails by name
    -- from the program, its clones and anything saved from it -- and never
    returns another variable's data; where memopt is imported the error is
    :class:`memopt.errors.MergedVariableError`, naming it and the
    ``fetch_list`` fix.  (PIR: fetching a Value an in-place op memopt made
    writes over raises it too.)
    """
    from .paddle.dygraph import to_static as static_steps  # Paddle imported only if loaded

    if static_steps.is_static_step(program):
        return _optimize_step(program, skip_opt_set, skip_grads, level, print_log,
                              fetch_list, budget, batch_size, optimizer, set_to_zero)
    program = _default_program(program)
    if budget is None and batch_size is not None and _bad_batch(batch_size):
        raise ValueError(f"batch_size must be a positive integer, the batch the report's "
                         f"figures are given at (got batch_size={batch_size!r}); nothing "
                         "was changed")
    is_pir = pir.is_pir_program(program)
    if is_pir:  # Values an earlier rewrite replaced: their replacements (before any use)
        pir_retired.redirect(program)
        skip_opt_set = pir_owner.live_values(program, skip_opt_set, "skip_opt_set")
        fetch_list = pir_owner.live_values(program, fetch_list, "fetch_list")
    options = resolve_options(skip_opt_set, skip_grads, level, print_log, fetch_list)
    if is_pir:
        pir_owner.require_own_values(program, skip_opt_set=skip_opt_set, fetch_list=fetch_list)
    options, pending = _keep_for_pending_backward(program, options)
    # PIR ops are built in static mode (a DistModel's program is handed over
    # in dygraph mode)
    with (pir_inplace.static_mode() if is_pir else contextlib.nullcontext()):
        if is_pir:  # read from .json: the marks of an earlier rewrite are in its record
            pir_rewrite.restore_marks(program)
        if budget is not None or options.level == 2:
            report = _level2_or_budget(program, options, budget, batch_size)
        else:
            report = _dispatch(program, options, release=False, batch_size=batch_size)
        if is_pir:  # the marks, kept where Paddle's .json keeps them
            pir_rewrite.write_record(program)
    if pending:
        report.notes = list(report.notes) + [pending_backward.note(len(pending))]
    if options.print_log:
        print(report)
    return report


def _optimize_step(step, skip_opt_set, skip_grads, level, print_log, fetch_list, budget,
                   batch_size, optimizer, set_to_zero):
    """memory_optimize on a to_static step: the arguments checked, then
    :func:`memopt.paddle.dygraph.to_static.optimize_step` with this
    module's program path as the rewrite of each program."""
    from .paddle.dygraph import to_static as static_steps

    if skip_opt_set or fetch_list:
        raise ValueError("skip_opt_set and fetch_list name values of a static program; a "
                         "to_static step's programs are built later: pass neither")
    resolve_options(None, skip_grads, level, print_log)
    limit = parse_budget(budget) if budget is not None else None
    if (limit is not None or batch_size is not None) and _bad_batch(batch_size):
        raise ValueError(f"budget= needs batch_size=, the positive batch size the budget is "
                         f"for (got batch_size={batch_size!r}); nothing was changed")

    def rewrite(program, *, fetch_list, budget, batch_size, level):
        return memory_optimize(program, skip_grads=skip_grads, level=level,
                               fetch_list=fetch_list, budget=budget, batch_size=batch_size)

    return static_steps.optimize_step(step, rewrite, level=level, budget=limit,
                                      batch_size=batch_size, optimizer=optimizer,
                                      print_log=print_log, set_to_zero=set_to_zero)


def _keep_for_pending_backward(program, options: Options):
    """(options, kept): for a PIR ``program`` with trainable parameters and
    no backward op yet, ``options`` with every value a backward part
    appended later would read in ``read_later`` (never written over in
    place), and the values added (:mod:`memopt.paddle.pending_backward`; a
    legacy program is marked by the rewrite instead)."""
    if not pir.is_pir_program(program):
        return options, frozenset()
    with pir_inplace.static_mode():
        pending = pending_backward.pending_backward_values(program)
    added = pending - options.skip_opt_set - options.fetch_list
    if not added:
        return options, frozenset()
    return dataclasses.replace(options, read_later=options.read_later | added), added


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


def _level2_or_budget(program, options: Options, budget, batch_size) -> Report:
    """level=2 / budget= (PIR): recompute for the budget
    (:mod:`memopt.paddle.pir.budget`, :mod:`memopt.paddle.pir.recompute`),
    then the in-place rewrite at ``min(level, 1)``, then at level 2 the
    concat slices (:mod:`memopt.paddle.pir.concat_slices`; not after a
    recomputation, whose clones may read the same values) and the
    memory-aware order (:mod:`memopt.paddle.pir.schedule`).  A legacy
    program gets level 1 and the memory-aware order
    (:mod:`memopt.paddle.legacy.schedule`) at level 2, and a budget as
    :func:`_legacy_within_budget` plans it."""
    from dataclasses import replace

    limit = None
    bad_batch = batch_size is not None and _bad_batch(batch_size)
    if budget is not None:
        if batch_size is None or bad_batch:
            raise ValueError(f"budget= needs batch_size=, the positive batch size the budget "
                             f"is for (got batch_size={batch_size!r})")
        limit = parse_budget(budget)
    lower = replace(options, level=min(options.level, 1))
    if not pir.is_pir_program(program):
        if bad_batch:
            raise ValueError(f"batch_size must be a positive integer, the batch level 2 plans "
                             f"the order for (got batch_size={batch_size!r}); nothing was "
                             "changed")
        if limit is not None:
            if legacy.is_legacy_program(program):
                return _legacy_within_budget(program, options, limit, int(batch_size))
        if legacy.is_legacy_program(program):
            with _without_cycle_collection():
                report = _legacy_optimize(
                    program, lower, int(batch_size) if batch_size else None,
                    reorder=lambda: _legacy_order(program, options, batch_size))
        else:
            report = _dispatch(program, lower, release=False)  # names what it takes
        report.level = options.level
        return report
    from .paddle.pir import convert_cache as pir_convert_cache, loops as pir_loops

    start = time.perf_counter()
    batch = int(batch_size or REFERENCE_BATCH)
    model = flags.runtime_model("pir")
    notes: List[str] = []
    with _without_cycle_collection(), pir_convert_cache.shared():  # one read per state
        pg = pir.convert(program, sorted(options.fetch_list))
        pir_rewrite.check_user_names(pg, options)
        pg.kept = frozenset(options.skip_opt_set)  # never dropped by a recomputation
        model = pir_loops.runtime_for(program, model, budget=limit is not None)
        before_analysis = _pir_analysis(pg, batch, model)
        before = before_analysis.total_peak(batch)
        recomputed, added, applied = [], 0.0, None
        if limit is not None:
            named = {n: pg.values[n] for n in options.fetch_list | options.skip_opt_set
                     if n in pg.values}
            chosen, applied = _recompute_within(program, pg, options, batch, limit, model)
            recomputed, added, note = _recompute_note(chosen, limit)
            notes.append(note)
            if applied is not None:  # the clones moved the "%N" names on
                options, lower = (_renamed(program, o, named) for o in (options, lower))
        try:
            # the in-place rewrite is all or nothing itself; if it fails the
            # recomputation goes too, so the call changes nothing
            level2 = options.level == 2
            variants = not (level2 and applied is None
                            and not _variants_pay(program, lower, batch, model))
            report = _pir_optimize(program, lower, batch, any_order=level2, variants=variants)
            if not variants and report.not_merged.get(R_NO_GAIN):
                left = report.not_merged[R_NO_GAIN]
                notes.append(f"level 2: level 1's {left} in-place variants left out: together "
                             "they lower no predicted peak")
        except BaseException:
            if applied is not None:
                applied.undo()
            raise
        # the fetched Values: their "%N" names change when ops are added or moved
        fetched = _fetched_values(program, options.fetch_list)
        if options.level == 2:
            notes += _slices_and_order(program, batch, model, options.fetch_list, fetched,
                                       slices=applied is None)
        after_analysis = _pir_analysis(pir.convert(program, fetched), batch, model)
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


def _recompute_note(chosen, limit: int, lag: Optional[int] = None) -> tuple:
    """``(recomputed names, added compute %, the report's note)`` for the
    recomputation plan ``chosen`` (a :class:`memopt.recompute.Choice`) made
    for the budget ``limit``, checked with frees ``lag`` ops late (default
    :data:`memopt.paddle.pir.budget.GC_LAG_OPS`)."""
    from .paddle.pir.budget import GC_LAG_OPS
    from .report import format_bytes

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


def _legacy_within_budget(program, options: Options, limit: int, batch: int) -> Report:
    """budget= on a legacy program: the recomputation plan of
    :func:`memopt.paddle.pir.budget.choose_plan` on its
    :class:`memopt.paddle.legacy.recompute.LegacyTarget`, then the legacy
    rewrite at ``min(level, 1)``; if that fails the plan is undone, so the
    call changes nothing.  The report's peaks are :func:`analyze`'s."""
    from dataclasses import replace

    from .paddle.legacy import recompute as legacy_recompute
    from .paddle.pir import budget as pir_budget
    from .report import format_bytes

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
    with _without_cycle_collection():
        before_analysis = target.analysis(fetch, batch, model)
        before = before_analysis.total_peak(batch)
        chosen, applied = pir_budget.choose_plan(target, fetch, batch, limit, model)
        recomputed, added, note = _recompute_note(chosen, limit, target.gc_lag_ops)
        notes = [note]
        lower = replace(options, level=min(options.level, 1))
        try:
            # the sharing rewrite, tried on a copy first: kept only if the
            # program it makes still fits the budget as the plan was checked
            trial = program.clone()
            _legacy_optimize(trial, lower)
            try:
                shared = pir_budget.guarded_peak(legacy_recompute.LegacyTarget(trial, fetch)
                                                 .analysis(fetch, batch, model), batch,
                                                 target.gc_lag_ops)
                why = f"is predicted at {format_bytes(shared)}, over the budget"
            except UnsupportedProgramError as exc:  # its merges unreadable: unchecked
                shared, why = None, f"cannot be read to check it against the budget ({exc})"
            if shared is not None and shared <= limit:
                report = _legacy_optimize(program, lower)
            else:
                report = _legacy_optimize(program, replace(lower, skip_opt_set=frozenset(
                    legacy.known_names(program))))
                notes.append(f"level {lower.level}'s sharing left out: the program it makes "
                             + why)
        except BaseException:
            if applied is not None:
                applied.undo()
            raise
        after_analysis = target.analysis(fetch, batch, model)
        report.peak_after = after_analysis.total_peak(batch)
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


def _legacy_order(program, options: Options, batch_size) -> List[str]:
    """Level 2's memory-aware order of a legacy program, after level 1's
    rewrite (:func:`memopt.paddle.legacy.schedule.level2_order`: all or
    nothing); returns the report's notes."""
    from .paddle.legacy import schedule as legacy_schedule

    with _without_cycle_collection():
        return legacy_schedule.level2_order(program, int(batch_size or REFERENCE_BATCH),
                                            sorted(options.fetch_list),
                                            flags.runtime_model("legacy"))


def _slices_and_order(program, batch: int, model, fetch_names, fetched, slices: bool) -> list:
    """Level 2's zero-FLOP steps after the in-place rewrite: the concat
    slices (``slices``: not after a recomputation) and the memory-aware
    order; returns the report's notes.  Both only lower a predicted peak, so
    if either fails the program goes back to what the in-place rewrite left
    (its slices undone, the ops in their order) and a note says what was
    left out and why: the call never returns a half-applied step."""
    from .paddle.pir import concat_slices as pir_concat_slices
    from .paddle.pir import recompute as pir_recompute
    from .paddle.pir import schedule as pir_schedule
    from .report import format_bytes

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


def _renamed(program, options: Options, named: dict) -> Options:
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


def _fetched_values(program, names) -> list:
    """The PIR Values of ``program`` that ``names`` (fetch_list names) name
    now: analyses after ops are added or moved take these, as a fetched
    value stays alive to the end of the step."""
    values = pir.convert(program, sorted(names)).values
    return [values[name] for name in sorted(names) if name in values]


def _recompute_within(program, pg, options: Options, batch: int, limit: int, model):
    """Apply the best recomputation plan for ``limit`` whose rewritten
    program, read back and analysed by the same model, still fits
    (:func:`memopt.paddle.pir.budget.choose_plan`).  Returns ``(choice,
    AppliedRecompute or None)``; BudgetError when none fits (the program
    unchanged)."""
    from .paddle.pir import budget as pir_budget

    return pir_budget.choose_plan(pg, sorted(options.fetch_list), batch, limit, model)


def _batch_planner(program, fetch_list: list, runtime: RuntimeModel):
    """``planner(budget, start_batch, limit) -> int`` for
    :meth:`Analysis.max_batch_size` (``recompute=True``): the largest batch
    found at which ``memory_optimize(program, budget=budget, batch_size=n)``
    returns a plan under ``runtime``
    (:func:`memopt.paddle.pir.budget.largest_planned_batch`, planning the
    program as it is when called, searched from the estimate of the grid
    at ``start_batch``); the program is left as it was."""
    def planner(budget: int, start_batch: int, limit: int) -> int:
        from .paddle.pir import budget as pir_budget, loops as pir_loops

        fetch_names = sorted(_names(fetch_list, "fetch_list"))  # as memory_optimize reads them
        with pir_inplace.static_mode(), _without_cycle_collection():
            pg = pir.convert(program, fetch_names)
            model = pir_loops.runtime_for(program, runtime, budget=True)  # as budget= does
            _, choices = pir_budget.plan_recompute(pg, start_batch, budget, model)
            return pir_budget.largest_planned_batch(
                pg, fetch_names, budget, model, limit=limit, order=choices,
                start=pir_budget.estimated_batch(choices, budget, limit))

    return planner


def release_memory(program=None, skip_opt_set=None, *, fetch_list=None) -> Report:
    """Free each temporary of ``program`` right after its last use.

    Fluid did this by inserting ``delete_var`` ops.  With Paddle's
    eager-deletion garbage collector on (``FLAGS_eager_delete_tensor_gb``
    >= 0, the default) the executor frees every temporary after its last
    use itself, and the program is left as it is.  With it off, a legacy
    program gets a release op right after the last use of each temporary of
    its global block (:mod:`memopt.release`: gradients included; variables
    of control flow, fetched or likely fetched variables and ``skip_opt_set``
    are kept); a later fetch of a released variable raises
    :class:`memopt.errors.MergedVariableError`.  Call it after
    :func:`memory_optimize`: the two together hold the least memory a run
    with the collector off can.  PIR programs are left as they are.  The
    Report's ``released`` lists the freed names.  ``fetch_list`` (keyword)
    names what you will fetch: kept, like ``skip_opt_set``; both must name
    variables the program has (else ValueError, program unchanged).  A
    released variable is renamed to a fresh ``memopt@buf_<k>`` and its own
    name leaves the program, so fetching it fails by name everywhere.
    """
    program = _default_program(program)
    if pir.is_pir_program(program):
        skip_opt_set = pir_owner.live_values(program, skip_opt_set, "skip_opt_set")
        fetch_list = pir_owner.live_values(program, fetch_list, "fetch_list")
    options = resolve_options(skip_opt_set, fetch_list=fetch_list)
    if pir.is_pir_program(program):
        pir_owner.require_own_values(program, skip_opt_set=skip_opt_set, fetch_list=fetch_list)
    return _dispatch(program, options, release=True)


# -- analyze ---------------------------------------------------------------------------

def _is_step(obj) -> bool:
    """Whether ``obj`` is a dygraph step (a Layer, a to_static function, a
    Python function) rather than a program."""
    from .paddle.dygraph.capture import is_step

    return is_step(obj)


def analyze(program_or_graph: Any, batch_size: Optional[int] = None, *,
            fetch_list: Iterable = (), runtime: Optional[RuntimeModel] = None,
            input_spec=None, optimizer=None, mode: Optional[str] = None,
            set_to_zero: bool = True, amp: Optional[dict] = None) -> Analysis:
    """Memory analysis of one step of a program, or of a dygraph training step.

    Parameters
    ----------
    program_or_graph : a ``paddle.pir.Program``, a legacy
        ``paddle.base.framework.Program`` or a memopt :class:`Graph`; or a
        dygraph *step* -- an ``nn.Layer`` whose forward returns the loss, a
        function of the inputs returning the loss, or what
        ``paddle.jit.to_static`` made of either -- given with ``input_spec``:
        the whole training step ``loss = step(*inputs); loss.backward();
        opt.step(); opt.clear_grad()`` is predicted without running it
        (parameters, gradients as ``clear_grad(set_to_zero=...)`` leaves them,
        ``optimizer``'s state and what its eager update allocates), ``mode``
        ``"eager"`` (default) or ``"to_static"``; ``amp``: the
        ``paddle.amp.auto_cast`` keywords the step runs under.  See
        :func:`memopt.paddle.dygraph.analyze_step`.
    batch_size : the batch size the figures default to (``-1`` dimensions);
        every method also takes its own.
    fetch_list : what the step fetches (Values/Variables or names): live to
        the end.
    runtime : the executor's memory behaviour; default: read from Paddle's
        flags (:func:`memopt.paddle.flags.runtime_model`), or GC on without in-place
        for a bare Graph.

    Returns
    -------
    Analysis
        ``peak()``, ``timeline()``, ``held_at()``, ``breakdown()``,
        ``max_batch_size(budget)``, ``report()``, ``to_json()``.

    Raises
    ------
    UnsupportedProgramError : anything else.
    ValueError : a batch size below 1.
    """
    if batch_size is not None and (not isinstance(batch_size, (int, np.integer))
                                   or isinstance(batch_size, bool) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    if input_spec is not None or optimizer is not None or mode is not None or (
            not isinstance(program_or_graph, Graph) and _is_step(program_or_graph)):
        from .paddle.dygraph import analyze_step

        if input_spec is None:
            raise ValueError("analyze(step, ...) needs input_spec=[InputSpec(...), ...]: one "
                             "per input of the step, the batch dimension None")
        return analyze_step(program_or_graph, input_spec, optimizer, mode=mode or "eager",
                            batch_size=None if batch_size is None else int(batch_size),
                            set_to_zero=set_to_zero, amp=amp)
    fetch_list = list(fetch_list or ())
    if isinstance(program_or_graph, Graph):
        graph = program_or_graph
        if fetch_list:
            graph.fetch_names = tuple(dict.fromkeys(
                (*graph.fetch_names, *[f if isinstance(f, str) else f.name for f in fetch_list])))
        rt = runtime or RuntimeModel(inplace=False)
        return from_graph(graph, batch_size, rt)
    ir = paddle_runtime.is_program(program_or_graph)
    rt = runtime or flags.runtime_model(ir or "pir")
    read = paddle_runtime.read_program(program_or_graph, fetch_list, rt)
    analysis = from_graph(read.graph, batch_size, rt, read.inplace, read.same_variable)
    if ir == "pir":
        analysis.batch_planner = _batch_planner(program_or_graph, fetch_list, rt)
    return analysis


# -- estimate: each rank's peak under a parallel strategy ------------------------
# Parameters and optimizer state are read from the program's persistable
# variables, the step's gradients and activations from analyze() at the
# micro-batch, whether the program is already one rank's program from its
# communication ops (memopt.paddle.distributed); memopt.parallel does the
# arithmetic.

_OTHER_MARKS = ("@GRAD", "GradientMerge", "@MERGED", "@BroadCast", "learning_rate",
                "_step_counter_", "@GradMergeCond")


def _parameter_names(program) -> set:
    try:
        return {p.name for p in program.global_block().all_parameters()}
    except Exception:  # pragma: no cover - a program without the API
        return set()


def _parameter_order(program) -> list:
    """Parameter names in the program's order (legacy: creation order, the
    order ``append_backward`` pairs them with gradients); [] when unknown."""
    try:
        return [p.name for p in program.global_block().all_parameters()]
    except Exception:
        return []


def _first_reads(program) -> list:
    """Variable names in the order a legacy program's ops first read them
    ([] for other programs)."""
    try:
        return [n for op in program.global_block().ops for n in op.input_arg_names]
    except Exception:
        return []


def program_facts(program, *, fetch_list: Iterable = (), runtime=None,
                  analysis=None, is_view: bool = False) -> ProgramFacts:
    """:class:`ProgramFacts` of a Paddle program (PIR or legacy).

    A persistable variable is a parameter when the program lists it as one;
    gradient-merge accumulators, the learning rate and step counters are
    "other"; every remaining persistable variable is optimizer state.
    """
    if analysis is None:
        analysis = analyze(program, fetch_list=fetch_list, runtime=runtime)
    params = _parameter_names(program)
    # a program read back from a file lists no Parameters: a persistable
    # variable with a gradient is one
    declared = {unversioned(var.name) for _, var in analysis.graph.all_vars()}
    params |= {name[:-len("@GRAD")] for name in declared if name.endswith("@GRAD")}
    sizes = {"parameters": 0, "optimizer": 0, "other": 0}
    seen = set()
    for _, var in analysis.graph.all_vars():
        name = unversioned(var.name)  # name#k: a later version, one buffer
        if not var.persistable or name in seen:
            continue
        seen.add(name)
        nbytes = var.size.at(1)
        if name in params:
            sizes["parameters"] += nbytes
        elif any(mark in name for mark in _OTHER_MARKS) or var.size.power > 0:
            # (growing with the batch: no optimizer state, but an inference
            # program's output, which PIR's fetch op makes persistable)
            sizes["other"] += nbytes
        else:
            sizes["optimizer"] += nbytes
    # float parameters: their gradients have the same bytes
    gradient_bytes = sizes["parameters"]

    def step_peak(b: int) -> tuple:
        out = analysis.breakdown(batch_size=b)
        grads = out.get("gradient", 0)
        rest = sum(v for k, v in out.items() if k not in ("gradient", "parameter"))
        return grads, rest

    def boundary(b: int) -> int:
        # the largest activation that grows with the batch (a stage's output;
        # fixed-size holders such as reshaped weights never cross a stage)
        acts = [h.bytes(b) for h in analysis.holders
                if h.category == "activation" and h.size.power >= 1]
        return max(acts, default=0)

    comm = distributed.communication_ops(analysis.graph)
    # parameters in the program's order with their bytes, and each one's
    # optimizer state: what fleet's sharding assigns to owners
    size_of: dict = {}
    for _, var in analysis.graph.all_vars():
        name = unversioned(var.name)
        if var.persistable and name not in size_of:
            size_of[name] = var.size.at(1)
    # fleet pairs parameters with gradients in creation order; the order the
    # ops first read them is that order for a program built in this process
    # and for one read back from a file (whose variables come sorted by name)
    order = [n for n in dict.fromkeys(_first_reads(program)) if n in params and n in size_of]
    order += [n for n in _parameter_order(program) if n in size_of and n not in order]
    state_of: dict = {}
    for name, nbytes in size_of.items():
        if name in params or any(mark in name for mark in _OTHER_MARKS):
            continue
        owner = sharding.state_owner(name, order)
        if owner:
            state_of[owner] = state_of.get(owner, 0) + nbytes
    rank_view = None
    if not comm and not is_view and paddle_runtime.is_program(program) == "legacy":
        def rank_view(owned):
            view = sharding.rank_view(program, owned, order)
            return program_facts(view, fetch_list=fetch_list, runtime=runtime, is_view=True)
    return ProgramFacts(parameters=sizes["parameters"], optimizer_state=sizes["optimizer"],
                        other_persistable=sizes["other"], gradient_bytes=gradient_bytes,
                        step_peak=step_peak, boundary=boundary,
                        distributed=bool(comm), communication_ops=comm,
                        param_order=tuple((n, size_of[n]) for n in order),
                        state_of=state_of, rank_view=rank_view, analysis=analysis)


def estimate(program=None, strategy: Optional[Strategy] = None, batch_size: int = 1, *,
             fetch_list: Iterable = (), runtime=None, **strategy_options) -> RankEstimate:
    """Each rank's peak memory for ``program`` under ``strategy``.

    Parameters
    ----------
    program : a Paddle training program (PIR or legacy; default: the default
        main program), as built for one device -- or one rank's program
        already rewritten by fleet / auto-parallel (then nothing is divided).
    strategy : a :class:`memopt.Strategy`; or pass its fields as keywords
        (``dp=2, sharding_stage=1, micro_batch_size=8, recompute=True,
        gradient_merge_steps=4, tp=..., pp=...``).
    batch_size : the global batch (all ranks, one optimizer step).
    fetch_list, runtime : as for :func:`memopt.analyze`.

    Returns
    -------
    RankEstimate
        ``.total`` bytes per rank, ``.components``, ``str()`` and ``.to_json()``.

    Examples
    --------
    >>> est = memopt.estimate(main, dp=2, sharding_stage=1, batch_size=64)  # doctest: +SKIP
    >>> print(est)                                                           # doctest: +SKIP
    """
    if strategy is not None and strategy_options:
        raise TypeError("pass either strategy=Strategy(...) or its fields as keywords, "
                        f"not both (got {sorted(strategy_options)})")
    if strategy is None:
        try:
            strategy = Strategy(**strategy_options)
        except TypeError as exc:
            raise TypeError(f"memopt.estimate: {exc}; the strategy fields are "
                            "dp, tp, pp, sharding_stage, micro_batch_size, recompute, "
                            "recompute_segments, gradient_merge_steps, fused_gradients") from None
    elif not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a memopt.Strategy, got {type(strategy).__name__}")
    if program is None:
        import paddle

        program = paddle.static.default_main_program()
    facts = program_facts(program, fetch_list=fetch_list, runtime=runtime)
    return estimate_rank(facts, strategy, batch_size)
