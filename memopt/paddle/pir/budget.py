"""``memory_optimize(budget=...)`` on PIR programs: the recomputation plan for a budget.

:func:`plan_recompute` reads the program's grid of recomputation plans
(:func:`memopt.recompute.evaluate_grid`, each predicted by
:mod:`memopt.analysis` under the current flags: GC, the executor's in-place
pass, its dataflow schedule), keeps those the model vouches for under
those flags (:func:`vouched`: no per-reader clone plans on the
multi-thread executor) and orders those whose predicted peak, with
Paddle's garbage collector up to :data:`GC_LAG_OPS` ops behind, fits
``budget`` by added compute.  :func:`choose_plan` applies the first whose
rewritten program, read back, still fits (:func:`rewritten_peak`), or
raises :class:`memopt.errors.BudgetError` with the smallest budget that
gets a plan at that batch (:func:`smallest_budget`) and the largest batch
found that gets one within the budget (:func:`largest_planned_batch`):
both figures checked by planning as ``memory_optimize`` does, so
``memory_optimize`` given either returns a plan.  The program is changed
only by the plan :func:`choose_plan` returns (the others are undone);
:mod:`memopt.api` wires the steps.

``pg`` is a read PIR program (:class:`memopt.paddle.pir.program.PirGraph`) or a
*target* bringing its IR's steps itself (``problem_of``, ``predictor``,
``apply``, ``analysis``, ``require_supported``: a legacy program's
:class:`memopt.paddle.legacy.recompute.LegacyTarget`); the search is the same.
"""
from __future__ import annotations

import logging

from ...errors import BudgetError

log = logging.getLogger(__name__)

__all__ = ["GC_LAG_OPS", "WORKERS_CHECKED", "FETCH_CARRIED", "gc_lag", "fetch_carry",
           "carried_bytes", "fed_again_bytes", "guarded_peak", "budget_error",
           "recompute_choices", "vouched", "offered", "estimated_batch", "plan_recompute",
           "rewritten_peak", "choose_plan", "smallest_budget", "plans_at",
           "largest_planned_batch", "require_supported"]

#: How many ops late a free may be taken to happen when a plan is checked
#: against a budget (:meth:`memopt.analysis.Analysis.total_peak_pending`).
#: Paddle 3.3.1's CPU garbage collector queues every free on its own thread
#: (``InterpreterCoreEventGarbageCollector::Free``), so a buffer stays
#: allocated until that thread gets a core, and no rewrite of the program
#: changes that thread.  4 ops covers the lag of the U-Net and DenseNet
#: steps measured by ``benchmarks/bench_recompute.py``; steps of a few
#: milliseconds on busy cores can lag further (docs/guide/level2.rst, "Where
#: the promise is weakest").
GC_LAG_OPS = 4


#: Worker counts the multi-thread schedule is also modelled with when a
#: plan is checked.  Paddle's executor runs 4 threads, but on a machine
#: whose cores are busy fewer of them run at once, and its interleaving
#: then lies between one thread's and four's: a plan is checked under each.
WORKERS_CHECKED = (1, 2)

#: With Paddle's garbage collector on, how many buffers the size of each
#: fetched value (not persistable) a PIR training loop holds beyond what
#: :mod:`memopt.analysis` counts (the value itself, kept to the step's end),
#: at every step after the first: Paddle 3.3.1's executor keeps the last
#: step's fetch results (after ``exe.run`` returns, the allocator still
#: counts two buffers of each fetched value, three while the caller holds
#: the arrays it returned), and ``out = exe.run(...)`` holds the previous
#: step's arrays while the next step runs; during a step, the fetch copy
#: the executor makes adds up to one more: every later step holds the
#: first's bytes plus two buffers of each fetched value.  A budget is
#: checked with these three buffers counted
#: (:func:`guarded_peak`'s ``carried``); fetch only the loss to leave them
#: out.
FETCH_CARRIED = 3

_ALTERNATES: dict = {}


def gc_lag(pg) -> int:
    """How many ops late frees are taken to happen for ``pg``: a target's
    own ``gc_lag_ops`` (its executor's collector), else :data:`GC_LAG_OPS`."""
    return getattr(pg, "gc_lag_ops", GC_LAG_OPS)


def fetch_carry(pg) -> int:
    """How many buffers the size of each fetched value a step of ``pg``
    holds beyond the analysis (:data:`FETCH_CARRIED`): a target's own
    ``fetch_carried`` (a legacy program's: none measured, 0), else
    :data:`FETCH_CARRIED` for a PIR program; 0 for a to_static training
    program (:func:`memopt.paddle.dygraph.hook.is_step_program`: its outputs
    become eager tensors, no Executor fetch copies them)."""
    from ..dygraph.hook import is_step_program

    if is_step_program(getattr(pg, "program", None)):
        return 0
    return getattr(pg, "fetch_carried", 0 if _is_target(pg) else FETCH_CARRIED)


def carried_bytes(prediction, batch: int, carried: int) -> int:
    """``carried`` buffers the size of each fetched value of
    ``prediction``'s graph that is dense and not persistable, at ``batch``,
    with the garbage collector on (0 with it off: ``fetch_copies`` counts
    those)."""
    from ...graph import size_at

    if not carried or not prediction.runtime.gc:
        return 0
    graph = prediction.graph
    total = 0
    for name in dict.fromkeys(graph.fetch_names):
        var = graph.find_var(name)
        if var is not None and not var.persistable and var.is_dense:
            total += carried * size_at(var.size, batch)
    return total


def fed_again_bytes(prediction, batch: int) -> int:
    """With the garbage collector off, one more buffer of each fed input
    (dense, not persistable) at ``batch``; 0 with it on.  Every buffer of
    a step stays allocated into the next (nothing frees it), and the next
    step's feed is copied in while the last one's is still held: measured
    (``tests/sweeps/test_sweep_optimizers.py``, PIR, LookAhead MLP at batch 64 then
    16, a plan at its smallest budget to the byte) steps 72-4,165 bytes
    over the budget, the fed ``x`` counted once."""
    from ...graph import size_at

    if prediction.runtime.gc:
        return 0
    total = 0
    for _, var in prediction.graph.all_vars():
        if (var.is_feed or var.is_data) and var.is_dense and not var.persistable:
            total += size_at(var.size, batch)
    return total


def guarded_peak(prediction, batch: int, window: int = GC_LAG_OPS, carried: int = 0) -> int:
    """The total peak a budget is checked against: ``prediction``'s (an
    :class:`memopt.analysis.Analysis`) with frees up to ``window`` ops late,
    the largest over the executor's schedule with its own worker count and
    with each of :data:`WORKERS_CHECKED` (dataflow schedule only), plus
    ``carried`` buffers of each fetched value (:func:`carried_bytes`) and,
    with the garbage collector off, the next step's feeds
    (:func:`fed_again_bytes`)."""
    return (_lagged_peak(prediction, batch, window) + carried_bytes(prediction, batch, carried)
            + fed_again_bytes(prediction, batch))


def _lagged_peak(prediction, batch: int, window: int) -> int:
    """:func:`guarded_peak` without the fetched values' buffers."""
    peak = prediction.total_peak_pending(window, batch)
    runtime = prediction.runtime
    if runtime.schedule != "dataflow":
        return peak
    key = id(prediction)
    alternates = _ALTERNATES.get(key)
    if alternates is None or alternates[0] is not prediction:
        from dataclasses import replace

        from ...analysis import modes_of

        alternates = (prediction, modes_of(
            prediction,
            [replace(runtime, workers=w) for w in WORKERS_CHECKED if w != runtime.workers]))
        if len(_ALTERNATES) > 256:
            _ALTERNATES.clear()
        _ALTERNATES[key] = alternates
    return max([peak] + [a.total_peak_pending(window, batch) for a in alternates[1]])


def recompute_choices(pg, batch: int, runtime, offered_only: bool = False):
    """The grid of recomputation plans of ``pg`` at ``batch`` with their
    predictions: ``(problem, [Choice])``; with ``offered_only`` only the
    plans :func:`vouched` keeps under ``runtime`` are predicted and
    returned."""
    from ... import recompute

    problem = _problem(pg, batch)
    keep = (lambda plan: offered(plan, runtime)) if offered_only else None
    # a per-reader plan (it always has readers) is never offered under dataflow: not made
    choices = recompute.evaluate_grid(problem, _predictor(pg, batch, runtime), keep=keep,
                                      per_reader=not (offered_only
                                                      and runtime.schedule == "dataflow"))
    for c in choices:
        c.peak = guarded_peak(c.prediction, batch, gc_lag(pg), fetch_carry(pg))
    return problem, choices


def _is_target(pg) -> bool:
    """Whether ``pg`` brings its IR's steps (see the module docstring)."""
    return hasattr(pg, "problem_of") and hasattr(pg, "apply")


def _problem(pg, batch: int):
    """The :class:`memopt.recompute.RecomputeProblem` of ``pg`` at ``batch``."""
    from . import recompute as pir_recompute

    return pg.problem_of(batch) if _is_target(pg) else pir_recompute.problem_of(pg, batch)


def _predictor(pg, batch: int, runtime):
    """The predictor of ``pg``'s rewritten graphs
    (:func:`memopt.paddle.pir.recompute.predictor`), the executor's
    in-place pass run again on each (its options read from ``pg``)."""
    from . import recompute as pir_recompute

    if _is_target(pg):
        return pg.predictor(batch, runtime)
    from .inplace import inplace_options

    options = inplace_options(pg, runtime.device) if runtime.inplace else {}
    return pir_recompute.predictor(batch, runtime, [], options, pg.graph)


def vouched(choices, runtime) -> list:
    """The plans of ``choices`` the model can vouch for under ``runtime``.

    Under the multi-thread executor (``runtime.schedule == "dataflow"``,
    Paddle's default) the plans that clone per group of readers
    (``plan.readers``: :data:`memopt.recompute.READER_GAPS`) are left out.
    Such a plan makes every dropped value again once per group, thousands
    of tiny ops (on an 8-layer BERT, more than twice the program's own),
    and on that executor their measured step peaks depart from the model
    (up to several times the budget), while the one-thread executors
    (``FLAGS_new_executor_serial_run``, ``FLAGS_new_executor_sequential_run``)
    hold them as modelled.  The model already runs ready clones early (the clones wait
    for a backward value through their ordering ops, and its multi-worker
    schedules let them run as soon as that exists), so what departs is not
    captured by it; until it is, those plans are not offered there.  The
    program schedule (``FLAGS_new_executor_sequential_run``) keeps them.
    :func:`plan_recompute` and so :class:`BudgetError`'s smallest budget
    and largest batch use these plans only."""
    return [c for c in choices if offered(c.plan, runtime)]


def offered(plan, runtime) -> bool:
    """Whether ``plan`` is one :func:`vouched` keeps under ``runtime``."""
    return runtime.schedule != "dataflow" or not plan.readers


def estimated_batch(choices, budget: int, limit: int = 1 << 20,
                    window: int = GC_LAG_OPS, carried: int = 0) -> int:
    """A guess at the largest batch that fits ``budget``: the largest batch
    some plan of ``choices`` fits at (:func:`guarded_peak`) with each plan's
    structure kept as it was planned at their batch; 0 if none.  Only a
    guess: planning at another batch makes other plans, and a plan's
    rewritten program may predict above its grid figure
    (:func:`largest_planned_batch` checks; it starts from this).  A plan is
    looked at only if it fits one batch beyond the best so far (its peak
    grows with the batch); its batch is searched by
    :func:`memopt.batch_search.largest_passing` from there."""
    from ...batch_search import largest_passing

    best = 0
    for c in sorted(choices, key=lambda c: c.peak):
        if best >= limit or guarded_peak(c.prediction, best + 1, window, carried) > budget:
            continue
        best = largest_passing(lambda n, c=c: guarded_peak(c.prediction, n, window,
                                                            carried) <= budget,
                               best + 1, limit, {best + 1: True})
    return best


def require_supported(pg) -> None:
    """UnsupportedProgramError for a program the target cannot recompute in
    (a legacy target: :meth:`LegacyTarget.require_supported`).  Every PIR
    program can be planned: region ops are opaque (:mod:`memopt.paddle.pir.regions`)."""
    if _is_target(pg):
        pg.require_supported()


def plan_recompute(pg, batch: int, budget: int, runtime):
    """``(fitting, choices)``: every plan of the grid the model vouches for
    under ``runtime`` (``choices``, :func:`vouched`) and those whose guarded
    peak (:func:`guarded_peak`) fits ``budget`` bytes at
    ``batch``, best first: least added compute, then the lower peak (see
    the module docstring).  :func:`choose_plan` applies the first and
    checks the rewritten program with the same model, going on to the next
    if the check fails."""
    require_supported(pg)
    _, choices = recompute_choices(pg, batch, runtime, offered_only=True)
    fitting = sorted((c for c in choices if c.peak <= budget),
                     key=lambda c: (c.plan.flops, c.peak))
    return fitting, choices


def rewritten_peak(pg, plan, fetch_names, batch: int, runtime):
    """``(guarded peak, applied)``: ``plan`` applied to ``pg.program``
    (:func:`memopt.paddle.pir.recompute.apply_plan`), the rewritten program
    read back and analysed under ``runtime`` at ``batch``
    (:func:`guarded_peak`); the caller keeps or undoes ``applied``.  On an
    error the plan is undone."""
    from ...analysis import from_graph
    from . import program as pir, recompute as pir_recompute
    from ..runtime import executed

    # the fetched Values, not their "%N" names: clones added before a value
    # made after the backward (an edited gradient) move its name on
    fetched = fetch_names if _is_target(pg) else [pg.values.get(n, n) for n in fetch_names]
    applied = pg.apply(plan, batch) if _is_target(pg) else pir_recompute.apply_plan(pg, plan)
    try:
        if _is_target(pg):
            after = pg.analysis(fetch_names, batch, runtime)
        else:
            read = executed(pir.convert(pg.program, fetched), runtime)
            after = from_graph(read.graph, batch, runtime, read.inplace)
        return guarded_peak(after, batch, gc_lag(pg), fetch_carry(pg)), applied
    except BaseException:
        applied.undo()
        raise


def choose_plan(pg, fetch_names, batch: int, budget: int, runtime):
    """What ``memory_optimize(budget=budget, batch_size=batch)`` does to
    recompute: the best plan of :func:`plan_recompute` whose rewritten
    program still fits (:func:`rewritten_peak`) is applied and
    ``(choice, applied)`` returned (``applied`` None for the plan that
    drops nothing); a plan whose rewritten program does not fit is undone
    and the next tried.  When none fits, :class:`BudgetError` (see
    :func:`budget_error`), the program unchanged.  ``fetch_names``: the
    names the caller fetches (sorted), as ``pg`` was read with."""
    fitting, choices = plan_recompute(pg, batch, budget, runtime)
    checked: dict = {}  # id(choice) -> its rewritten program's guarded peak
    for choice in fitting:
        if not choice.k:
            return choice, None
        actual, applied = rewritten_peak(pg, choice.plan, fetch_names, batch, runtime)
        checked[id(choice)] = actual
        if actual <= budget:
            return choice, applied
        log.info("recompute plan %s: %d bytes predicted on the rewritten program, over the "
                 "budget %d; undone", choice.label, actual, budget)
        applied.undo()
    smallest = smallest_budget(pg, fetch_names, batch, runtime, choices, checked)
    largest = largest_planned_batch(pg, fetch_names, budget, runtime,
                                    start=estimated_batch(choices, budget, batch - 1,
                                                          gc_lag(pg), fetch_carry(pg)),
                                    limit=batch - 1, order=choices)
    raise budget_error(budget, batch, smallest, largest, gc_lag(pg))


def smallest_budget(pg, fetch_names, batch: int, runtime, choices, checked=None) -> int:
    """The least budget at which :func:`choose_plan` at ``batch`` returns a
    plan: the least, over the plans ``choices`` (:func:`plan_recompute`'s,
    at ``batch``), of the larger of the plan's guarded peak and its
    rewritten program's (the plan that drops nothing: its own).  Exact for
    that grid: at this budget that plan passes both checks, at any lower
    one every plan fails one.  ``checked`` (``id(choice)`` -> rewritten
    peak) spares checks already made; the plans are checked leanest first
    until the next one's own peak is no lower than the best found."""
    checked = {} if checked is None else checked
    best = None
    for c in sorted(choices, key=lambda c: (c.peak, c.plan.flops)):
        if best is not None and c.peak >= best:
            break
        if c.k and id(c) not in checked:
            actual, applied = rewritten_peak(pg, c.plan, fetch_names, batch, runtime)
            applied.undo()
            checked[id(c)] = actual
        need = max(c.peak, checked[id(c)]) if c.k else c.peak
        best = need if best is None else min(best, need)
    return best if best is not None else 0


def plans_at(pg, fetch_names, batch: int, budget: int, runtime, order=()) -> bool:
    """Whether :func:`choose_plan` at ``batch`` returns a plan for
    ``budget`` (the program is left as it was).  The same plans and checks,
    made lazily and stopping at the first plan that passes both: the grid's
    plans at ``batch`` (:func:`memopt.recompute.grid_plans`) the model vouches
    for (:func:`offered`), each predicted (:func:`recompute_choices`'s
    predictor), its guarded peak checked against ``budget`` (the one-worker
    peak first: the guarded peak is no lower), then its rewritten program
    (:func:`rewritten_peak`).  ``order``: choices of another batch; plans
    with their labels are tried first, leanest first (a guess at which
    passes; the answer does not depend on it)."""
    from ... import recompute

    require_supported(pg)
    problem = _problem(pg, batch)
    predict = _predictor(pg, batch, runtime)
    rank = {c.label: k for k, c in enumerate(sorted(order, key=lambda c: (c.peak, c.plan.flops)))}
    plans = [(label, plan) for label, plan in recompute.grid_plans(problem)
             if offered(plan, runtime)]
    plans.sort(key=lambda lp: rank.get(lp[0], len(rank)))
    for _, plan in plans:
        graph, _ = recompute.rewrite_graph(problem, plan)
        prediction = predict(graph, plan)
        if prediction.total_peak_pending(gc_lag(pg), batch) > budget \
                or guarded_peak(prediction, batch, gc_lag(pg), fetch_carry(pg)) > budget:
            continue
        if not plan.dropped:
            return True
        actual, applied = rewritten_peak(pg, plan, fetch_names, batch, runtime)
        applied.undo()
        if actual <= budget:
            return True
    return False


def largest_planned_batch(pg, fetch_names, budget: int, runtime, *, start: int,
                          limit: int = 1 << 20, order=()) -> int:
    """The largest batch found at which ``memory_optimize(budget=budget,
    batch_size=n)`` under ``runtime`` returns a plan (:func:`plans_at`
    checked it: the program, planned at ``n``, fits; ``n + 1`` was tried and
    refused, or ``n == limit``); 0 if batch 1 is refused.  Searched from
    ``start`` (a guess: :func:`estimated_batch`) by
    :func:`memopt.batch_search.largest_passing`, each step a planning.
    The largest such batch if a batch fits whenever a larger one does;
    otherwise a larger batch beyond a refused one might fit too.  ``order``
    as for :func:`plans_at`."""
    from ...batch_search import largest_passing

    return largest_passing(
        lambda n: plans_at(pg, fetch_names, n, budget, runtime, order), start, limit)


def budget_error(budget: int, batch: int, smallest: int, largest: int,
                 window: int = GC_LAG_OPS) -> BudgetError:
    """The :class:`BudgetError` for ``budget`` at ``batch``: ``smallest``
    the least budget that gets a plan at ``batch`` (:func:`smallest_budget`),
    ``largest`` the largest batch found that gets one within ``budget``
    (:func:`largest_planned_batch`), both checked by planning as
    ``memory_optimize`` does."""
    from ...report import format_bytes

    return BudgetError(
        f"no plan fits the budget {format_bytes(budget)} at batch size {batch}: the smallest "
        f"budget memopt can fit at this batch is {format_bytes(smallest)} (with Paddle's "
        f"garbage collector up to {window} ops behind); the largest batch that fits "
        f"{format_bytes(budget)} is {largest}" + (" (none)" if largest == 0 else "")
        + " (both checked by planning at them). The program is unchanged.",
        budget, batch, smallest, largest)
