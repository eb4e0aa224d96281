"""Recompute to a budget on legacy programs: forward ops copied into the backward part.

The legacy counterpart of :mod:`memopt.paddle.pir.recompute`.
:func:`problem_of` describes a legacy training program's block 0 as a
:class:`memopt.recompute.RecomputeProblem` (its graph is
:func:`memopt.paddle.legacy.program.program_to_graph`'s: variable names are the
program's, op ``i`` is ``block.ops[i]``); :func:`apply_plan` copies the
planned forward ops (same type and attributes, outputs renamed to fresh
variables of the same shape, dtype and LoD level) right before the
backward op that first needs them, and renames the backward ops' reads of
each dropped variable to its copy, all or nothing
(:meth:`AppliedLegacyRecompute.undo` leaves the desc byte for byte as it
was).  :class:`LegacyTarget` hands these to the IR-neutral budget search of
:mod:`memopt.paddle.pir.budget`.

Not recomputed: random ops (a :data:`memopt.paddle.pir.program.RANDOM_OPS` type, a
``seed`` attribute or a ``Seed`` input: a second draw gives other values),
``print`` and ``py_func`` (:data:`memopt.paddle.pir.program.SIDE_EFFECT_OPS`), ops
writing a variable they read or one another op writes too (``sgd``,
``increment``, a user's in-place ``assign``: a second run would write
again), ops running sub-blocks and feed/fetch.  ``batch_norm`` in training
mode is copied reading and writing fresh statistics (``fill_constant``
zeros and ones: the legacy op wants ``Mean`` and ``MeanOut`` to be one
variable): its output comes from the batch's own statistics, and the
running statistics are updated once, by the forward op.

Keeping a copy in the backward part: Paddle 3.3.1 runs a legacy program on
its ProgramInterpreter, which runs an op as soon as its inputs are ready;
a copy reading only kept values would run back in the forward part and
hold its result all along.  The first copy of each group (a
:attr:`memopt.recompute.Clone.dep`) is preceded by a legacy ``depend`` op
(``X`` and ``Out`` the copy's input, ``Dep`` a value the backward part makes
right before), which the executor runs only once that value exists.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from ...errors import PlanError, UnsupportedProgramError
from ...graph import Graph
from ...recompute import RecomputePlan, RecomputeProblem
from ..pir.program import RANDOM_OPS, SIDE_EFFECT_OPS

__all__ = ["LEGACY_GC_LAG_OPS", "LEGACY_OUT_OF_PLACE", "draws_random", "op_flops", "LegacyRules", "problem_of",
           "AppliedLegacyRecompute", "apply_plan", "LegacyTarget"]

#: How many ops late the legacy executor's frees are taken to happen when a
#: plan is checked (:func:`memopt.paddle.pir.budget.gc_lag`; PIR: 4).
#: With frees at their op the plans' lowest steps fit, but single steps go
#: over the budget (the collector's lag on loaded cores); one op late is
#: what the unchanged programs' own largest steps reach, so a budget checked
#: that way is kept.  The price: small CNNs get no plan under their default
#: peak (``BudgetError`` names the smallest budget);
#: ``tests/sweeps/test_sweep_legacy_budget.py`` measures it.
LEGACY_GC_LAG_OPS = 1


#: Ops copied with fresh variables for the outputs they write over their
#: inputs: ``{type: {output slot: input slot}}``.
LEGACY_OUT_OF_PLACE = {"batch_norm": {"MeanOut": "Mean", "VarianceOut": "Variance"}}

#: FLOPs per output element for ops heavier than one operation per element.
_PER_ELEMENT = {"softmax": 5, "layer_norm": 8, "batch_norm": 8, "gelu": 10, "exp": 4,
                "tanh": 4, "sigmoid": 4, "softmax_with_cross_entropy": 8}
_FREE = frozenset({"feed", "fetch", "fetch_v2", "fill_constant", "assign_value", "shape",
                   "reshape2", "squeeze2", "unsqueeze2", "flatten_contiguous_range"})


def draws_random(desc) -> bool:
    """Whether legacy op ``desc`` (an ``OpDesc``) draws from the random
    generator: its type is one of :data:`RANDOM_OPS` (``pd_op.`` + type), or
    it has a ``seed`` attribute or a ``Seed`` input (random ops not listed,
    custom ones included)."""
    kind = desc.type()
    return ("pd_op." + kind in RANDOM_OPS or kind in ("uniform_random", "gaussian_random")
            or desc.has_attr("seed") or "Seed" in desc.input_names())


def _numel(shape, batch: int) -> int:
    n = 1
    for d in shape:
        n *= batch if d < 0 else int(d)
    return n


def op_flops(block, desc, batch: int) -> int:
    """Estimated FLOPs of legacy op ``desc`` of ``block`` at ``batch``:
    ``2 * out * (Cin/g * kh * kw)`` for a convolution, ``2 * out * K`` for a
    matmul (``K`` the contracted dimension), ``2 * out * (contracted sizes)``
    for an einsum, a few per output element otherwise (default 1); feeds,
    constants and reshapes 0."""
    kind = desc.type()
    if kind in _FREE:
        return 0

    def shape(name):
        var = block._find_var_recursive(name)
        try:
            return tuple(var.desc.shape()) if var is not None else ()
        except Exception:  # a variable without dims (a reader, a scope)
            return ()

    outs = [n for slot in desc.output_names() if slot not in ("XShape",)
            for n in desc.output(slot) if n != "@EMPTY@"]
    out = sum(_numel(shape(n), batch) for n in outs[:1]) if outs else 0
    if kind in ("conv2d", "depthwise_conv2d", "conv2d_transpose", "conv3d") \
            and desc.input("Filter"):
        return 2 * out * max(_numel(shape(desc.input("Filter")[0])[1:], 1), 1)
    if kind in ("matmul_v2", "matmul", "mul") and desc.input("X"):
        xs = shape(desc.input("X")[0])
        if kind == "mul":
            k = _numel(xs[desc.attr("x_num_col_dims"):], batch) if xs else 1
        else:
            trans = desc.attr("trans_x" if kind == "matmul_v2" else "transpose_X")
            k = int(xs[-2] if trans and len(xs) > 1 else xs[-1]) if xs else 1
        return 2 * out * max(abs(k), 1)
    if kind == "einsum" and desc.has_attr("equation"):
        lhs, _, rhs = desc.attr("equation").replace(" ", "").partition("->")
        sizes: Dict[str, int] = {}
        for term, name in zip(lhs.split(","), desc.input("Operands")):
            for letter, d in zip(term, shape(name)):
                sizes[letter] = batch if d < 0 else int(d)
        k = 1
        for letter in set(lhs) - set(rhs) - {","}:
            k *= sizes.get(letter, 1)
        return 2 * out * k
    return out * _PER_ELEMENT.get(kind, 1)


class LegacyRules:
    """The op facts :func:`memopt.recompute.problem_from_graph` needs, for
    graphs read from legacy programs (op ``i`` of the graph is
    ``block.ops[i]``): :func:`op_flops` and :meth:`reason`."""

    def __init__(self, program, graph: Graph):
        self._block = program.global_block()
        writers: Dict[str, int] = {}
        for op in graph.blocks[0].ops:
            for name in op.writes:
                writers[name] = writers.get(name, 0) + 1
        #: names more than one op of block 0 writes (written over)
        self.rewritten = frozenset(n for n, k in writers.items() if k > 1)

    def flops(self, graph, op, batch: int) -> int:
        return op_flops(self._block, self._block.ops[op.attrs["index"]].desc, batch)

    def reason(self, op) -> Optional[str]:
        """Why graph op ``op`` may not run twice (None: it may)."""
        desc = self._block.ops[op.attrs["index"]].desc
        kind = desc.type()
        if draws_random(desc):
            return "random"
        if "pd_op." + kind in SIDE_EFFECT_OPS:
            return "side effect"
        if op.sub_blocks:
            return "runs sub-blocks"
        if kind in ("feed", "fetch", "fetch_v2") or not op.writes:
            return "no results"
        fresh = LEGACY_OUT_OF_PLACE.get(kind, {})
        if fresh:
            if desc.has_attr("is_test") and desc.attr("is_test") or \
                    desc.has_attr("use_global_stats") and desc.attr("use_global_stats"):
                return "inference mode"
        kept = {n for slot in desc.output_names() if slot not in fresh
                for n in desc.output(slot)}
        if kept & set(op.reads) or kept & self.rewritten:
            return "writes over a variable"
        return None


def problem_of(program, batch: int, fetch_names=()) -> RecomputeProblem:
    """The :class:`RecomputeProblem` of legacy ``program``'s block 0 at
    ``batch``; ``fetch_names`` are kept (never dropped)."""
    from ...recompute import problem_from_graph
    from .program import program_to_graph

    graph = program_to_graph(program)
    _state_no_need_buffer(program.global_block(), graph)
    if fetch_names:
        graph.fetch_names = tuple(dict.fromkeys((*graph.fetch_names, *fetch_names)))
    rules = LegacyRules(program, graph)
    problem = problem_from_graph(graph, batch, rules)
    problem.written_over = rules.rewritten
    return problem


def _state_no_need_buffer(block, graph: Graph) -> None:
    """Set ``facts.no_need_buffer`` of block 0's graph ops: the variables an
    op reads only in the slots Paddle declares shape-only
    (``core.infer_no_need_buffer_slots``: ``elementwise_add_grad``'s ``X``
    and ``Y``...), which the executor frees before the op runs."""
    from paddle.base import core

    for op in graph.blocks[0].ops:
        desc = block.ops[op.attrs["index"]].desc
        attrs = {}
        for name in desc.attr_names():
            try:
                attrs[name] = desc.attr(name)
            except Exception:  # a block attribute: not needed here
                pass
        try:
            slots = core.infer_no_need_buffer_slots(
                desc.type(), {s: desc.input(s) for s in desc.input_names()},
                {s: desc.output(s) for s in desc.output_names()}, attrs)
        except Exception:  # an op without that information: all data
            continue
        if not slots:
            continue
        data = {n for s in desc.input_names() if s not in slots for n in desc.input(s)}
        shape_only = {n for s in slots if s in desc.input_names() for n in desc.input(s)}
        op.facts.no_need_buffer = tuple(sorted(shape_only - data))


class AppliedLegacyRecompute:
    """What :func:`apply_plan` did to a legacy program, and how to take it
    back: :meth:`undo` renames the redirected inputs back, removes the
    inserted ops and the variables it declared; the desc then serializes to
    the bytes it did before.  ``clones``: ``{recomputed name: its copy's
    variable name}``."""

    def __init__(self, block, inserted, renamed, declared, clones):
        self.clones: Dict[str, str] = clones
        self._block = block
        self._inserted = inserted      # Operators added
        self._renamed = renamed        # (Operator, slot, old names)
        self._declared = declared      # variable names added

    def undo(self) -> None:
        block = self._block
        for op, slot, names in reversed(self._renamed):
            op.desc.set_input(slot, names)
        for op in reversed(self._inserted):
            k = next((i for i, o in enumerate(block.ops) if o is op), None)
            if k is not None:
                block.desc._remove_op(k, k + 1)
                del block.ops[k]
        for name in reversed(self._declared):
            if block.has_var(name):
                block._remove_var(name)
        self._renamed, self._inserted, self._declared = [], [], []


def _declare_like(block, name: str, like: str) -> None:
    """Declare ``name`` in ``block``: a temporary with ``like``'s type, shape,
    dtype and LoD level."""
    if block.has_var(name):
        raise PlanError(f"apply_plan: variable {name} exists already (recomputed before?)")
    src = block._find_var_recursive(like)
    if src is None:
        raise PlanError(f"apply_plan: {like} is not declared")
    kwargs = {"type": src.desc.type()}
    try:
        kwargs.update(shape=src.desc.shape(), dtype=src.desc.dtype(),
                      lod_level=src.desc.lod_level())
    except Exception:  # a variable type without dims
        pass
    block.create_var(name=name, persistable=False, stop_gradient=True, **kwargs)


def _insert_copy(block, at: int, src_desc, inputs: Dict[str, List[str]],
                 outputs: Dict[str, List[str]]):
    """Insert at ``at`` a copy of op ``src_desc`` (type and attributes, the
    backward role) reading ``inputs`` and writing ``outputs`` (slot -> names)."""
    from paddle.base.framework import Operator

    from .program import ROLE_BACKWARD

    new = block.desc._insert_op(at)
    new.copy_from(src_desc)
    for slot, names in inputs.items():
        new.set_input(slot, names)
    for slot, names in outputs.items():
        new.set_output(slot, names)
    new._set_attr("op_role", ROLE_BACKWARD)
    if new.has_attr("op_role_var"):
        new._set_attr("op_role_var", [])
    op = Operator(block, new)
    block.ops.insert(at, op)
    return op


def _insert_fill(block, at: int, name: str, value: float):
    """Insert at ``at`` ``fill_constant`` writing ``value`` into all of
    ``name`` (its declared shape and dtype)."""
    from paddle.base.framework import Operator

    from .program import ROLE_BACKWARD

    var = block.var(name)
    new = block.desc._insert_op(at)
    op = Operator(block, new, type="fill_constant", outputs={"Out": [var]},
                  attrs={"shape": list(var.shape), "dtype": var.dtype, "value": value,
                         "op_role": ROLE_BACKWARD})
    block.ops.insert(at, op)
    return op


def apply_plan(program, problem: RecomputeProblem, plan: RecomputePlan) -> AppliedLegacyRecompute:
    """Copy the plan's forward ops into block 0 of legacy ``program`` (read
    as ``problem``) and rename the backward ops' reads of the dropped
    variables to the copies; all or nothing (on any failure everything is
    taken back and the error re-raised)."""
    from .program import ROLE_BACKWARD
    from .depend import insert_depend

    block = program.global_block()
    block._sync_with_cpp()
    ops = list(block.ops)
    graph_ops = problem.ops
    if len(ops) != len(graph_ops) or any(o.type != g.type for o, g in zip(ops, graph_ops)):
        raise PlanError("apply_plan: the program changed since it was read")
    start = next((i for i, op in enumerate(graph_ops) if op.role in ("backward", "optimize")),
                 len(ops))
    applied = AppliedLegacyRecompute(block, [], [], [], {})
    made: Dict[str, set] = {}  # tag -> names its copies made so far
    try:
        for c in plan.clones:
            src = ops[c.op].desc
            at = next(i for i, o in enumerate(block.ops) if o is ops[c.before])
            # an earlier copy's output (not the running statistics a batch_norm
            # copy reads and writes afresh)
            group = set(made.get(c.tag, ()))
            if c.dep is not None:
                applied._inserted.append(insert_depend(block, at, *c.dep, ROLE_BACKWARD))
                at += 1
            inputs = {slot: [n + "@RECOMPUTE" + c.tag if n in group else n
                             for n in src.input(slot)] for slot in src.input_names()}
            outputs: Dict[str, List[str]] = {}
            for slot in src.output_names():
                outputs[slot] = []
                for n in src.output(slot):
                    if n == "@EMPTY@":
                        outputs[slot].append(n)
                        continue
                    new = c.name(n)
                    _declare_like(block, new, n)
                    applied._declared.append(new)
                    applied.clones[n + c.tag] = new
                    outputs[slot].append(new)
            for out_slot, in_slot in LEGACY_OUT_OF_PLACE.get(src.type(), {}).items():
                # batch_norm reads and writes its running statistics as one
                # variable: the copy's are fresh ones, filled first
                fresh = outputs[out_slot]
                value = 1.0 if in_slot == "Variance" else 0.0
                applied._inserted.append(_insert_fill(block, at, fresh[0], value))
                at += 1
                inputs[in_slot] = list(fresh)
            applied._inserted.append(_insert_copy(block, at, src, inputs, outputs))
            made.setdefault(c.tag, set()).update(c.outputs)
        dropped = set(plan.dropped)
        shared = made.get("", set())
        for k in range(start, len(ops)):
            own = plan.readers.get(k, {})
            desc = ops[k].desc
            shape_only = set(graph_ops[k].facts.no_need_buffer)  # keep the original
            for slot in desc.input_names():
                names = desc.input(slot)
                new = [n if n in shape_only
                       else n + "@RECOMPUTE" + own[n] if n in own
                       else n + "@RECOMPUTE" if n in dropped and n in shared
                       else n for n in names]
                if new != names:
                    applied._renamed.append((ops[k], slot, names))
                    desc.set_input(slot, new)
        _verify_defined_before_use(block, start)
    except BaseException:
        applied.undo()
        raise
    return applied


def _verify_defined_before_use(block, start: int) -> None:
    """PlanError unless every ``@RECOMPUTE`` variable an op reads is written
    by an earlier op of block 0."""
    written: set = set()
    for i, op in enumerate(block.ops):
        for name in op.desc.input_arg_names():
            if "@RECOMPUTE" in name and name not in written:
                raise PlanError(f"op {i} ({op.type}) reads {name} before any op makes it")
        written.update(op.desc.output_arg_names())


class LegacyTarget:
    """A legacy program as :mod:`memopt.paddle.pir.budget`'s budget search
    takes it: the problem at a batch, a predictor of rewritten graphs, a
    plan applied (undoable) and the program's analysis as
    :func:`memopt.analyze` gives it."""

    def __init__(self, program, fetch_names=(), kept=()):
        #: frees taken this many ops late when a plan is checked
        #: (:func:`memopt.paddle.pir.budget.gc_lag`; see :data:`LEGACY_GC_LAG_OPS`)
        self.gc_lag_ops = LEGACY_GC_LAG_OPS
        self.program = program
        self.fetch_names = tuple(fetch_names)
        #: names the caller keeps as they are (``skip_opt_set``): never dropped
        self.kept = frozenset(kept)
        self._problems: Dict[int, RecomputeProblem] = {}

    def require_supported(self) -> None:
        """UnsupportedProgramError unless block 0 runs no sub-blocks and
        every tensor its ops write has a declared size (not an ``einsum``'s
        ``InnerCache``: its copies of the operands are held to the backward
        part, but the program gives them no shape, so no peak with them
        could be checked; measured on the legacy Transformer, batch 32: the
        steady step 5.18 MB where the model, without them, says 4.15 MB)."""
        from .program import UNSIZED, blocks_run

        run = blocks_run(self.program)
        if len(run) > 1:
            raise UnsupportedProgramError(
                "budget=: memopt recomputes in legacy programs whose block 0 runs no "
                "sub-blocks (while, conditional_block, recurrent); this one runs "
                f"block(s) {', '.join(map(str, sorted(run - {0})))}. Drop budget= "
                "(memory_optimize still rewrites it) or build the model without static "
                "control flow")
        graph = self.problem_of(1).graph
        unsized = {n for n, v in graph.blocks[0].vars.items() if v.kind == UNSIZED}
        op = next((op for op in graph.blocks[0].ops if unsized.intersection(op.writes)), None)
        if op is not None:
            name = sorted(unsized.intersection(op.writes))[0]
            raise UnsupportedProgramError(
                f"budget=: op {op.attrs['index']} ({op.type}) of this legacy program writes "
                f"{name}, a cache whose size the program does not declare, so memopt cannot "
                "check a step's peak against a budget. Drop budget= (memory_optimize still "
                "rewrites it), or build the model in PIR, or with matmul instead of einsum")

    def problem_of(self, batch: int) -> RecomputeProblem:
        if batch not in self._problems:
            if len(self._problems) > 8:
                self._problems.clear()
            problem = problem_of(self.program, batch, self.fetch_names)
            problem.pinned = problem.pinned | self.kept
            self._problems[batch] = problem
        return self._problems[batch]

    def predictor(self, batch: int, runtime):
        """``predict(graph, plan) -> Analysis``: the rewritten graph under
        ``runtime`` (legacy programs run no in-place pass); for the plan
        that drops nothing, the program's own :meth:`analysis` (what the
        rewritten programs of the other plans are checked with, so that
        the unchanged program is never predicted lower than it is)."""
        from ...analysis import from_graph

        own = []

        def predict(rewritten, plan):
            if not plan.dropped:
                if not own:
                    own.append(self.analysis(self.fetch_names, batch, runtime))
                return own[0]
            return from_graph(rewritten, batch, runtime, [])

        return predict

    def apply(self, plan: RecomputePlan, batch: int) -> AppliedLegacyRecompute:
        return apply_plan(self.program, self.problem_of(batch), plan)

    def analysis(self, fetch_names, batch: int, runtime):
        """The program as it is now, analysed as :func:`memopt.analyze` does."""
        from ...analysis import from_graph
        from ..runtime import read_program

        read = read_program(self.program, list(fetch_names), runtime)
        return from_graph(read.graph, batch, runtime, read.inplace, read.same_variable)
