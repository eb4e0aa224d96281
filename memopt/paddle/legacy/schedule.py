"""memory_optimize level 2 on legacy programs: block 0's ops in a memory-aware order.

The legacy counterpart of :mod:`memopt.paddle.pir.schedule`.
:func:`order_problem` describes block 0 of a legacy ``Program`` as a
:class:`memopt.schedule.OrderProblem`.  A legacy variable is a name, not an
SSA value: one name may be written by several ops (an in-place op with the
same name in and out, ``increment``, ``assign`` to an existing variable,
optimizer ops writing parameters and moments, and level 1's merged names
``memopt@buf_<k>``), so an op runs after

- the last earlier op writing a name it reads (read after write),
- every op reading a name since it was last written, and that writer, for a
  name it writes (write after read, write after write);

where an op's names include those its sub-blocks (``while``,
``conditional_block`` and their grads) read and write at any depth.  Ops
drawing random numbers keep their relative order (each takes the
generator's next numbers), and so do ops writing nothing and collective /
synchronising ops; ``feed`` and ``fetch`` ops, and the first op of the
backward part (where ``clone(for_test=True)`` cuts the program), stay where
they are (every op keeps its side of them).

:func:`plan_order` makes the candidate orders of :mod:`memopt.schedule`
(and the program's own), applies each to a clone of the program with the
``depend`` ops that keep it (:func:`order_edges`) and keeps the one the
analysis of :func:`memopt.analyze` (the program translated to PIR, the
executor's dataflow schedule, the runtime's GC mode) predicts the lowest
peak for -- only if it lowers the runtime's own predicted peak by
:data:`MIN_GAIN` (5%) and raises it under none of
:func:`memopt.paddle.pir.schedule.executor_modes`, with frees on time or
late.  :func:`apply_order` puts the real program's ops in that order with
:func:`memopt.paddle.legacy.program.rewrite`, adds the ``depend`` ops
(:mod:`memopt.paddle.legacy.depend`) and checks the result op by op; all or
nothing (:func:`level2_order`).

Paddle's ProgramInterpreter builds its own dependencies from the same names
but runs every ready op at once on its threads, whatever its place in the
program (measured, see :func:`order_edges`): without the ``depend`` ops a
new program order would change little.  Nothing is computed twice, no op
changes and a ``depend`` leaves its variable as it is: the results are
bit-identical.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence, Set, Tuple

from ...errors import PlanError, UnsupportedProgramError
from ...schedule import OrderOp, OrderProblem, candidate_orders, check_topological
from ..distributed import is_communication
from .program import EMPTY_VAR, _sub_block_ids, program_to_graph, rewrite
from .depend import insert_depends
from ..pir.program import SIDE_EFFECT_OPS
from ..pir.schedule import OrderChoice, choose_order, executor_modes, peaks_by_mode

log = logging.getLogger(__name__)

__all__ = ["order_problem", "plan_order", "apply_order", "mode_peaks", "level2_order",
           "LEGACY_RANDOM_OPS", "draws_random"]

#: Legacy op types drawing from Paddle's random generator.
LEGACY_RANDOM_OPS = frozenset({
    "dropout", "uniform_random", "gaussian_random", "randint", "randperm", "bernoulli",
    "multinomial", "truncated_gaussian_random", "uniform_random_batch_size_like",
    "gaussian_random_batch_size_like", "sampling_id", "random_crop", "rrelu", "exponential",
    "poisson", "random_routing", "class_center_sample", "fused_dropout_add",
    "fused_bias_dropout_residual_layer_norm", "seed", "dirichlet", "binomial"})

#: The least share of the predicted peak a new order must save to be
#: applied to a legacy program.  Larger than PIR's 1%
#: (:data:`memopt.paddle.pir.schedule.MIN_GAIN`): measured on Paddle 3.3.1
#: (``benchmarks/bench_legacy_level2.py``, GC on), ResNet-50's optimizer order
#: predicted 2.6% lower (108.5 -> 105.7 MiB) measured 130.5 MB (median
#: step) where level 1's program measured 119.0-123.4 MB in three fresh
#: processes, while the branches model's 37% lower measured 17.9 -> 10.6 MB.
MIN_GAIN = 0.05

#: The candidate that keeps the program's own order with ``depend`` ops (the
#: executor runs ready ops in parallel otherwise).
KEPT = "program, kept"

#: Ops that stay where they are: every op keeps its side of them.
_FIXED_OPS = frozenset({"feed", "fetch", "fetch_v2"})


def draws_random(desc) -> bool:
    """Whether legacy op ``desc`` draws random numbers: a
    :data:`LEGACY_RANDOM_OPS` type or any op with a ``seed`` attribute."""
    return desc.type() in LEGACY_RANDOM_OPS or desc.has_attr("seed")


def _names_at_any_depth(program, desc) -> Tuple[Set[str], Set[str]]:
    """``(reads, writes)`` of op ``desc`` with those of the ops of the
    sub-blocks it runs, at any depth (``@EMPTY@`` left out)."""
    reads = set(desc.input_arg_names())
    writes = set(desc.output_arg_names())
    todo = list(_sub_block_ids(desc))
    seen: Set[int] = set()
    while todo:
        idx = todo.pop()
        if idx in seen or not 0 <= idx < program.num_blocks:
            continue
        seen.add(idx)
        for pop in program.block(idx).ops:
            reads.update(pop.desc.input_arg_names())
            writes.update(pop.desc.output_arg_names())
            todo.extend(_sub_block_ids(pop.desc))
    reads.discard(EMPTY_VAR)
    writes.discard(EMPTY_VAR)
    return reads, writes


#: ``op_role`` values that start the backward part for Paddle's
#: ``clone(for_test=True)`` (``core.prune_backward`` keeps the ops before the
#: first op whose role is exactly Backward or Backward | Loss).
_BACKWARD_START_ROLES = (0x0001, 0x0101)


def first_backward_op(program) -> Optional[int]:
    """Index of block 0's op where ``clone(for_test=True)`` cuts the
    program (its first Backward or Backward | Loss op), or None."""
    for i, pop in enumerate(program.global_block().ops):
        desc = pop.desc
        if desc.has_attr("op_role") and int(desc.attr("op_role")) in _BACKWARD_START_ROLES:
            return i
    return None


def name_dependencies(program) -> List[Set[int]]:
    """For each op of block 0, the earlier ops it must follow (see the
    module docstring: read/write hazards on names, sub-block names
    included, random / sink / collective ops chained, feed / fetch and the first backward op fixed)."""
    ops = program.global_block().ops
    after: List[Set[int]] = [set() for _ in ops]
    last_writer: Dict[str, int] = {}
    readers: Dict[str, Set[int]] = {}
    last_random = last_sink = last_fixed = None
    boundary = first_backward_op(program)
    for i, pop in enumerate(ops):
        desc = pop.desc
        reads, writes = _names_at_any_depth(program, desc)
        for name in reads:
            if name in last_writer:
                after[i].add(last_writer[name])
        for name in writes:
            after[i].update(readers.get(name, ()))
            if name in last_writer:
                after[i].add(last_writer[name])
        for name in reads:
            readers.setdefault(name, set()).add(i)
        for name in writes:
            last_writer[name] = i
            readers[name] = set()
        if draws_random(desc):
            if last_random is not None:
                after[i].add(last_random)
            last_random = i
        if not writes or is_communication(desc.type()) or \
                "pd_op." + desc.type() in SIDE_EFFECT_OPS:
            if last_sink is not None:
                after[i].add(last_sink)
            last_sink = i
        if desc.type() in _FIXED_OPS or i == boundary:
            after[i].update(range(i))
            last_fixed = i
        elif last_fixed is not None:
            after[i].add(last_fixed)
        after[i].discard(i)
    return after


def order_problem(program, batch: int, graph=None) -> OrderProblem:
    """The :class:`OrderProblem` of block 0 of legacy ``program`` (see the
    module docstring); sizes at ``batch``.  ``graph``: the program read by
    :func:`memopt.paddle.legacy.program.program_to_graph`, if at hand."""
    graph = graph or program_to_graph(program)
    after = name_dependencies(program)
    block = graph.blocks[0]
    made: Set[str] = set()
    out = []
    pops = program.global_block().ops
    for i, op in enumerate(block.ops):
        makes = {}
        for name in op.writes:
            var = graph.var(name, 0)
            if var is not None and var.is_dense and not var.persistable and name not in made:
                makes[name] = var.size.at(batch)
                made.add(name)
        data = set(_data_inputs(pops[i])) if not op.sub_blocks else set(op.reads)
        out.append(OrderOp(after=tuple(sorted(after[i])), makes=makes,
                           reads=tuple(n for n in op.reads if n in data),
                           optimize=op.role == "optimize" and not op.sub_blocks))
    keep = frozenset(var.name for _, var in graph.all_vars()
                     if var.persistable or var.is_feed or var.is_data or var.is_fetch
                     or var.name in graph.fetch_names)
    return OrderProblem(out, keep)


def _op_signature(pop) -> tuple:
    desc = pop.desc
    return (desc.type(),
            tuple((s, tuple(desc.input(s))) for s in sorted(desc.input_names())),
            tuple((s, tuple(desc.output(s))) for s in sorted(desc.output_names())))


def apply_order(program, order: List[int]) -> int:
    """Put block 0's ops of ``program`` in ``order`` (indices into the
    current order) and add the ``depend`` ops that make the executor keep
    it (:func:`enforce_order`), then check that block 0 holds exactly the
    planned ops; otherwise put the program back as it was (its serialized
    desc byte for byte) and raise PlanError.  Returns the ``depend`` ops
    added."""
    block = program.global_block()
    if sorted(order) != list(range(len(block.ops))):
        raise PlanError("apply_order: not a permutation of block 0's ops")
    want = [_op_signature(block.ops[i]) for i in order]
    before = program.desc.serialize_to_string()
    added: list = []
    try:
        added = enforce_order(program, order)
        got = [_op_signature(pop) for pop in block.ops if not any(pop is op for op in added)]
        if got != want or block.desc.op_size() != len(block.ops):
            raise PlanError("apply_order: block 0's ops are not in the planned order after "
                            "the moves (the program's own order is restored)")
    except BaseException:
        if program.desc.serialize_to_string() != before:
            _restore_block0(program, before)
        raise
    return len(added)


def _restore_block0(program, before: bytes) -> None:
    """Put block 0's ops of ``program`` back as they are in ``before`` (its
    serialized desc from before a change): every op desc copied back from a
    parse of it, the Operators made anew."""
    from paddle.base.framework import Operator, Program

    back = Program.parse_from_string(before).global_block().desc
    block = program.global_block()
    desc = block.desc
    desc._remove_op(0, desc.op_size())
    for k in range(back.op_size()):
        desc.append_op().copy_from(back.op(k))
    block.ops = [Operator(block, desc.op(k)) for k in range(desc.op_size())]


def order_edges(program, order: Sequence[int]) -> List[Tuple[int, int, str, str]]:
    """The ``depend`` ops that make Paddle's executor run block 0 in
    ``order``: ``(a, b, x, z)`` -- op ``b`` (index of the program as it is)
    waits for op ``a``, the latest op before it in ``order`` with an output
    ``z`` to wait for, through ``depend(X=[x], Dep=[z], Out=[x])`` with
    ``x`` an input ``b`` reads for its data.

    Measured (Paddle 3.3.1, legacy ProgramInterpreter, GC on): the executor
    does not follow program order among ready ops after its first step --
    four branches ``linear -> mean`` put one after the other in the program
    held all four 1 MiB ``linear`` outputs at once (4.0 MiB, as in the
    branches-last order) in every step but the first (1.0 MiB).  So each op
    of ``order`` waits for the one before it, unless it already depends on
    it -- in the backward and optimizer parts only, through a tensor those
    parts write (a gradient): ``clone(for_test=True)`` and
    ``save_inference_model`` cut or prune these parts away, so inference
    programs get no ``depend`` (measured: a forward ``depend`` writing an
    input of the next op pulled the loss's ``elementwise_sub`` and its
    label into an inference program pruned to the prediction).  The
    forward part, whose values are mostly saved for the backward part, is
    left to the executor.
    ``x`` and ``z`` are non-persistable dense tensors (an op writing only
    parameters, as ``sgd``, is waited for through the op before it; a
    ``depend`` waiting for a parameter fails on Paddle 3.3.1); an op
    without such an input is left unchained, and no op waits across a
    feed, a fetch or an op running sub-blocks."""
    block = program.global_block()
    ops = block.ops
    after = name_dependencies(program)
    ancestors = [0] * len(ops)  # bitsets of the ops each op follows, transitively
    for i, deps in enumerate(after):
        for j in deps:
            ancestors[i] |= ancestors[j] | (1 << j)
    later_part = [bool(_role_of(pop) & _LATER_ROLES) for pop in ops]
    written_late = {n for pop, late in zip(ops, later_part) if late
                    for n in pop.desc.output_arg_names()}
    edges = []
    last = None  # (op, its output a depend can wait for) latest in ``order``
    for b in order:
        db = ops[b].desc
        if db.type() in _FIXED_OPS or _sub_block_ids(db):
            last = None  # nothing waits across them
            continue
        if last is not None and not (ancestors[b] >> last[0]) & 1:
            a, z = last
            x = next((n for n in _data_inputs(ops[b]) if n in written_late and n != z
                      and _plain_tensor(block, n)), None) if later_part[b] else None
            if x is not None:
                edges.append((a, b, x, z))
        z = next((n for slot in db.output_names() if slot not in _NO_DATA_SLOTS
                  for n in db.output(slot) if _plain_tensor(block, n)), None)
        if z is not None:
            last = (b, z)
    return edges


#: op_role bits of the backward and optimizer parts (legacy.ROLE_BACKWARD,
#: ROLE_OPTIMIZE, ROLE_LR_SCHED).
_LATER_ROLES = 0x0001 | 0x0002 | 0x0010


def _role_of(pop) -> int:
    desc = pop.desc
    return int(desc.attr("op_role")) if desc.has_attr("op_role") else 0


#: Output slots that hold no data (``XShape``: dims only, never allocated;
#: einsum's ``InnerCache``): a ``depend`` on them finds no tensor.
_NO_DATA_SLOTS = frozenset({"XShape", "InnerCache"})


def _data_inputs(pop) -> List[str]:
    """The inputs op ``pop`` reads for their data: its no-need-buffer slots
    (read for their dims, whose memory the GC may free before the op runs)
    left out."""
    from paddle.base import core

    desc = pop.desc
    inputs = {slot: desc.input(slot) for slot in desc.input_names()}
    try:
        dims_only = core.infer_no_need_buffer_slots(
            desc.type(), inputs, {slot: desc.output(slot) for slot in desc.output_names()},
            {name: pop.attr(name) for name in pop.attr_names})
    except Exception:  # an op whose attributes Python cannot read: no inputs offered
        return []
    return [n for slot, names in inputs.items() if slot not in dims_only for n in names]


def _plain_tensor(block, name: str) -> bool:
    """A non-persistable dense tensor of ``block``.  (A ``depend`` whose
    ``Dep`` is a parameter an ``sgd`` op writes fails at run time on Paddle
    3.3.1: "There are no kernels which are registered in the depend
    operator", measured.)"""
    if name == EMPTY_VAR or not block.has_var(name):
        return False
    from paddle.base import core

    var = block.var(name)
    return var.desc.type() == core.VarDesc.VarType.DENSE_TENSOR and not var.persistable


def enforce_order(program, order: Sequence[int]) -> list:
    """Put block 0's ops in ``order`` and add the ``depend`` ops
    (:func:`order_edges`) that make the executor keep it; returns the
    Operators added.  Not all or nothing by itself (see :func:`apply_order`)."""
    edges = order_edges(program, order)
    position = {i: k for k, i in enumerate(order)}
    rewrite(program, {}, list(order))
    return insert_depends(program, [(position[a], position[b], x, z) for a, b, x, z in edges])


def mode_peaks(program, batch: int, modes, order: Optional[Sequence[int]] = None,
               fetch=()) -> dict:
    """``{mode label: predicted total peak}`` and ``{label + "+lag": the same
    with frees GC_LAG_OPS ops late}`` of legacy ``program`` (block 0's ops in
    ``order``, if given: applied to a clone), analysed as :func:`memopt.analyze`
    does under each of ``modes``; ``fetch``: names alive to the end."""
    from ..runtime import read_program

    clone = program
    if order is not None:
        clone = program.clone()
        enforce_order(clone, order)
    read = read_program(clone, list(fetch), modes[0][1])
    return peaks_by_mode(read.graph, batch, modes, read.inplace, read.same_variable)


def plan_order(program, batch: int, runtime=None, fetch=()) -> OrderChoice:
    """Choose block 0's order of legacy ``program`` with the lowest predicted
    peak at ``batch``; the program is not changed.  Kept only if it lowers
    the runtime's own prediction by :data:`MIN_GAIN` and raises none of
    :func:`executor_modes` (with frees on time or late); otherwise the
    program's own order (``OrderChoice.order`` None, ``note`` says why)."""
    from ..flags import runtime_model

    runtime = runtime or runtime_model("legacy")
    fetch = list(fetch)
    problem = order_problem(program, batch)
    modes = executor_modes(runtime)
    table, orders = {}, {}
    table["program"] = mode_peaks(program, batch, modes, None, fetch)
    orders["program"] = list(range(len(problem.ops)))
    for name, order in candidate_orders(problem):
        check_topological(problem, order)
        # every order, the program's own too, with the depend ops keeping it
        name = KEPT if name == "program" else name
        table[name] = mode_peaks(program, batch, modes, order, fetch)
        orders[name] = order
    return choose_order(table, orders, MIN_GAIN)


def level2_order(program, batch: int, fetch=(), runtime=None) -> List[str]:
    """Level 2's order step on a legacy program (after level 1's rewrite):
    plan, apply, and return the report's notes.  All or nothing: if
    anything fails the program is byte-identical to what it was (its
    serialized desc) and a note says the order was left out and why."""
    from ...report import format_bytes
    from ..flags import read_flags

    if read_flags().pir_executor:
        return ["level 2: the program's own order kept: the order and the depend ops that "
                "keep it are made for the legacy executor, and Paddle runs this program "
                "translated to PIR (FLAGS_enable_pir_in_executor=1)"]
    before = program.desc.serialize_to_string()
    try:
        choice = plan_order(program, batch, runtime, fetch)
        if choice.order is None:
            tried = ", ".join(f"{k} {format_bytes(v)}" for k, v in choice.peaks.items())
            return [choice.note or ("level 2: the program's own order kept: no other order "
                                    f"lowers the predicted peak ({tried})")]
        added = apply_order(program, choice.order)
        from ..guards import install_legacy

        install_legacy()  # names the executor to use if run translated to PIR
        what = ("the program's own order" if choice.name == KEPT
                else f"ops reordered ({choice.name} order)")
        return [f"level 2: {what}, {added} depend ops keep it: predicted peak "
                f"{format_bytes(choice.peaks['program'])} -> "
                f"{format_bytes(choice.peaks[choice.name])}"]
    except UnsupportedProgramError as exc:  # memopt cannot predict its peak: nothing done
        if program.desc.serialize_to_string() != before:
            _restore_block0(program, before)
        return [f"level 2: the program's own order kept: its peak cannot be predicted ({exc})"]
    except Exception as exc:  # noqa: BLE001 - reported in the notes, program restored
        if program.desc.serialize_to_string() != before:
            _restore_block0(program, before)
        log.warning("level 2's order left out: %r", exc)
        return [f"level 2: the memory-aware order left out: {type(exc).__name__}: {exc} "
                "(the program keeps level 1's rewrite)"]
