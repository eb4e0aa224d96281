"""The public entry points: ``memory_optimize``, ``release_memory``, ``analyze``,
``estimate``.

Each checks its arguments, picks the program's IR once
(:func:`memopt.paddle.ir.ir_of`) and hands the program to the policy
(:mod:`memopt.policy`: level 0/1, level 2, a budget), which runs the IR's
pipeline (:mod:`memopt.pipeline.legacy`, :mod:`memopt.pipeline.pir`).  The
work flows one way::

    Program -> adapter -> Graph -> planner -> Plan (pure data) -> checks
            -> adapter applies the plan all at once -> Report

The adapters never call back into this module or the planner.  Paddle is
imported only when a Paddle program is handed in.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np

from . import policy
from .analysis import Analysis, RuntimeModel, from_graph
from .graph import Graph
from .paddle import pending_backward
from .paddle.ir import ir_of
from .parallel import RankEstimate, Strategy, estimate_rank
from .pipeline.analysis import analyze_program
from .pipeline.arguments import resolve_options
from .pipeline.common import bad_batch, default_program
from .pipeline.facts import program_facts
from .plan import Options
from .policy import parse_budget
from .report import Report

__all__ = ["memory_optimize", "release_memory", "analyze", "estimate", "program_facts",
           "resolve_options", "parse_budget", "Options"]


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
    program = default_program(program)
    if budget is None and batch_size is not None and bad_batch(batch_size):
        raise ValueError(f"batch_size must be a positive integer, the batch the report's "
                         f"figures are given at (got batch_size={batch_size!r}); nothing "
                         "was changed")
    ir = ir_of(program)
    ir.before_rewrite(program)
    skip_opt_set, fetch_list = ir.live_arguments(program, skip_opt_set, fetch_list)
    options = resolve_options(skip_opt_set, skip_grads, level, print_log, fetch_list)
    ir.check_own_values(program, skip_opt_set, fetch_list)
    options, pending = ir.keep_for_pending_backward(program, options)
    with ir.session(program):
        if budget is not None or options.level == 2:
            report = policy.level2_or_budget(program, options, budget, batch_size)
        else:
            report = policy.dispatch(program, options, release=False, batch_size=batch_size)
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
    if (limit is not None or batch_size is not None) and bad_batch(batch_size):
        raise ValueError(f"budget= needs batch_size=, the positive batch size the budget is "
                         f"for (got batch_size={batch_size!r}); nothing was changed")

    def rewrite(program, *, fetch_list, budget, batch_size, level):
        return memory_optimize(program, skip_grads=skip_grads, level=level,
                               fetch_list=fetch_list, budget=budget, batch_size=batch_size)

    return static_steps.optimize_step(step, rewrite, level=level, budget=limit,
                                      batch_size=batch_size, optimizer=optimizer,
                                      print_log=print_log, set_to_zero=set_to_zero)



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
    program = default_program(program)
    ir = ir_of(program)
    skip_opt_set, fetch_list = ir.live_arguments(program, skip_opt_set, fetch_list)
    options = resolve_options(skip_opt_set, fetch_list=fetch_list)
    ir.check_own_values(program, skip_opt_set, fetch_list)
    return policy.dispatch(program, options, release=True)



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
    return analyze_program(program_or_graph, batch_size, fetch_list=fetch_list,
                           runtime=runtime)



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
