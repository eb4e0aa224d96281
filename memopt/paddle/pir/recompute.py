"""Recompute to a budget on PIR: forward ops cloned into the backward part.

:func:`problem_of` describes a PIR training program's top-level block as a
:class:`memopt.recompute.RecomputeProblem`: the neutral graph, each op's
estimated FLOPs (:func:`op_flops`) and whether it may run twice;
:func:`predictor` predicts a rewritten graph's total peak the way
:func:`memopt.analyze` does (the executor's in-place pass kept where the
input still dies at the op); :func:`apply_plan` clones the planned ops
(``Operation.clone`` with a ``paddle.pir.IrMapping``, at
``paddle.pir.set_insertion_point``) right before the backward op that first
needs them and points every backward read of a dropped value's data at its
clone (``OpOperand.set_source``; shape-only reads keep the original), all
or nothing.

Not recomputed: random ops (:data:`RANDOM_OPS`: a second draw gives other
values), ops seen beyond their values
(:data:`memopt.paddle.pir.program.SIDE_EFFECT_OPS`: ``pd_op.print``), communication
ops (:func:`memopt.paddle.distributed.is_communication`: a tensor-parallel
``all_reduce`` run again on one rank's schedule is a collective every rank
must join in the same order), ops that write over an operand
(``batch_norm_``'s running statistics, ``sgd_``: a second run would update
twice), ops that run regions, and the glue of vectors on their own (``builtin.combine`` /
``builtin.split`` are cloned along with the op that uses them).
A region op (``pd_op.if``, ``pd_op.while``) is opaque
(:mod:`memopt.paddle.pir.regions`): every top-level value it reads, in its
regions too, is kept (``RecomputeProblem.pinned``), and no clone reads or
makes again a value it writes over (``RecomputeProblem.barred``); its
blocks are left as they are.

Forcing the order: Paddle 3.3.1's ``pd_op.depend`` (``paddle._C_ops.depend``)
builds in PIR but its CPU kernel refuses to run unless the input and the
output are one variable ("PreconditionNotMetError: Input(X) and Output(Out)
variable should be the same", ``depend_kernel_impl.h:27``), which the PIR
executor does not arrange for a Python-built depend op; so the clones are
kept in the backward part by their position alone (Paddle's executor runs
ready ops lowest index first).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

from ...errors import PlanError
from ...recompute import CLONE_SUFFIX, CloneSpelling, RecomputePlan, RecomputeProblem, is_copy_dep
from ...graph import Graph, Op, OpFacts, Var
from ..distributed import is_communication
from .inplace import insertion_point_kept
from .program import COMBINE_OP, RANDOM_OPS, SIDE_EFFECT_OPS, SPLIT_OP, SLICE_OP, PirGraph

log = logging.getLogger(__name__)

__all__ = ["RANDOM_OPS", "OUT_OF_PLACE", "PIR_RULES", "op_flops", "problem_of", "predictor",
           "PirSpelling", "rewritten_options", "apply_plan", "verify_defined_before_use",
           "waiting_for", "redirect_data_uses"]

#: In-place ops cloned as their out-of-place form: ``batch_norm_`` writes
#: the running statistics over its ``mean``/``variance`` operands; a clone
#: that did so too would update them twice, so the clone is a
#: ``batch_norm`` reading zeros/ones for them, whose new statistics nobody
#: reads (measured: cloned as ``batch_norm`` on the real statistics, the
#: running mean came out different -- the executor updated it in place).  In training mode
#: (``is_test`` and ``use_global_stats`` False) its output is computed from
#: the batch's own statistics only, by the same kernel: bit-identical.
OUT_OF_PLACE = {"pd_op.batch_norm_": "batch_norm"}

#: FLOPs per output element for ops heavier than one operation per element.
_PER_ELEMENT = {"pd_op.softmax": 5, "pd_op.layer_norm": 8, "pd_op.batch_norm": 8,
                "pd_op.batch_norm_": 8, "pd_op.gelu": 10, "pd_op.exp": 4,
                "pd_op.tanh": 4, "pd_op.sigmoid": 4, "pd_op.cross_entropy_with_softmax": 8}


def _numel(shape, batch: int) -> int:
    n = 1
    for d in shape:
        n *= batch if d < 0 else int(d)
    return n


def op_flops(graph: Graph, op, batch: int) -> int:
    """Estimated FLOPs of one op of a PIR program's graph at ``batch``:
    ``2 * out * (Cin/g * kh * kw)`` for a convolution (the filter is its
    second operand), ``2 * out * K`` for a matmul (K: the first operand's
    last dimension), a few per output element otherwise
    (:data:`_PER_ELEMENT`, default 1); glue and constants 0."""
    name = op.type
    if name.startswith("builtin.") or name in ("pd_op.data", "pd_op.full",
                                               "pd_op.full_int_array"):
        return 0
    var = graph.blocks[0].vars
    out = sum(_numel(var[n].shape, batch) for n in op.writes
              if n in var and var[n].is_dense)
    if name in ("pd_op.conv2d", "pd_op.depthwise_conv2d", "pd_op.conv2d_transpose") \
            and len(op.reads) > 1 and op.reads[1] in var:
        return 2 * out * max(_numel(var[op.reads[1]].shape[1:], 1), 1)
    if name == "pd_op.matmul" and op.reads and op.reads[0] in var and var[op.reads[0]].shape:
        return 2 * out * max(int(var[op.reads[0]].shape[-1]), 1)
    return out * _PER_ELEMENT.get(name, 1)


def _reason(op) -> Optional[str]:
    """Why graph op ``op`` may not run twice (None: it may)."""
    name = op.type
    if name in RANDOM_OPS:
        return "random"
    if name in SIDE_EFFECT_OPS:
        return "side effect"
    if is_communication(name):
        return "communication"
    if op.sub_blocks:
        return "runs regions"
    if name.startswith("builtin.") or name.startswith("cf.") or op.facts.synthetic:
        return "glue"
    if name in OUT_OF_PLACE:
        return None  # cloned as its out-of-place form (see OUT_OF_PLACE)
    if op.facts.overwrites or name.endswith("_"):
        return "writes over an operand"
    if not op.writes:
        return "no results"
    return None


class _PirRules:
    """The op facts :func:`memopt.recompute.problem_from_graph` needs, for
    graphs read from PIR programs: :func:`op_flops` and :func:`_reason`."""

    @staticmethod
    def flops(graph, op, batch: int) -> int:
        return op_flops(graph, op, batch)

    @staticmethod
    def reason(op) -> Optional[str]:
        return _reason(op)


#: The rules for graphs read from PIR programs (see :class:`_PirRules`).
PIR_RULES = _PirRules()


def problem_of(pg: PirGraph, batch: int) -> RecomputeProblem:
    """The :class:`RecomputeProblem` of a PIR program's top-level block at
    ``batch``; its region ops' values pinned and barred
    (:mod:`memopt.paddle.pir.regions`), and ``pg.kept`` pinned too."""
    from ...recompute import problem_from_graph
    from .regions import region_reads, region_writes

    problem = problem_from_graph(pg.graph, batch, PIR_RULES)
    problem.spelling = PirSpelling(pg)
    problem.pinned = region_reads(pg) | pg.kept
    problem.barred = problem.barred | region_writes(pg)
    return problem


class PirSpelling(CloneSpelling):
    """A clone spelled as :func:`apply_plan` emits it into the program and
    :func:`memopt.paddle.pir.program.convert` reads it back, op for op: the
    ordering ops of :func:`waiting_for`, a ``builtin.combine`` per vector
    operand, ``batch_norm_`` as ``full``/``full_like`` twice and
    ``batch_norm`` (:func:`_out_of_place`), a ``builtin.split`` /
    ``builtin.slice`` per forward unpacking of its results, and the
    backward part's vectors of redirected values moved to their readers
    (:func:`_sink_glue`)."""

    def __init__(self, pg: PirGraph):
        from .regions import top_level_ops

        self._pg = pg
        self._top = top_level_ops(pg)  # the PIR op of each graph op of block 0

    def _new(self, variables, stem: str, shape, dtype: str) -> str:
        """Declare a fresh dense temporary ``stem@k`` in ``variables``."""
        name = f"{stem}@{len(variables)}"
        variables[name] = Var(name, tuple(shape), dtype)
        return name

    def order_ops(self, problem, clone, waited, variables):
        """:func:`waiting_for`'s ops: ``shape64`` of the input and of the
        trigger, the trigger's first dim (two ``full_int_array``, ``slice``),
        times zero (``full``, ``scale``), added to the dims (``add``) and
        the input viewed through ``reshape_`` (``reshape`` for a fed one)."""
        x, trigger = clone.dep
        var = problem.graph.blocks[0].vars
        tag = {"recompute_of": clone.op}

        def op(kind, reads, writes, inplace=None, **facts):
            attrs = dict(tag, inplace=inplace) if inplace else dict(tag)
            return Op(kind, tuple(reads), tuple(writes), (), "backward", False, attrs,
                      OpFacts(**facts))

        dims = self._new(variables, "dims", (len(var[x].shape),), "int64")
        tdims = self._new(variables, "dims", (len(var[trigger].shape),), "int64")
        lo = self._new(variables, "index", (1,), "int64")
        hi = self._new(variables, "index", (1,), "int64")
        first = self._new(variables, "dim", (), "int64")
        factor = self._new(variables, "zero", (1,), "float32")
        zero = self._new(variables, "dim", (), "int64")
        same = self._new(variables, "dims", (len(var[x].shape),), "int64")
        copy = is_copy_dep(problem.graph, clone.dep)
        return [op("pd_op.shape64", [x], [dims], no_need_buffer=(x,)),
                op("pd_op.shape64", [trigger], [tdims], no_need_buffer=(trigger,)),
                op("pd_op.full_int_array", [], [lo]), op("pd_op.full_int_array", [], [hi]),
                op("pd_op.slice", [tdims, lo, hi], [first]), op("pd_op.full", [], [factor]),
                op("pd_op.scale", [first, factor], [zero], inplace=((first, zero),)),
                op("pd_op.add", [dims, zero], [same], inplace=((dims, same),)),
                op("pd_op.reshape" if copy else "pd_op.reshape_", [x, same], [waited],
                   overwrites=() if copy else ((x, waited),))]

    def clone_ops(self, problem, clone, op, variables):
        """The combines of its vector operands, the op (``batch_norm_``:
        its out-of-place form on fresh statistics), the forward
        splits/slices of its results."""
        src = self._top[clone.op]
        glue = {"recompute_of": clone.op}
        out = [Op(COMBINE_OP, (), (), (), "backward", False, dict(glue))
               for v in src.operands_source() if v.initialized()
               and v.get_defining_op() is not None
               and v.get_defining_op().name() == COMBINE_OP]
        if op.type in OUT_OF_PLACE:
            reads = list(op.reads)
            for k in (1, 2):
                var = variables[reads[k]]
                fill = self._new(variables, "zero", (1,), "float32")
                stat = self._new(variables, "stat", var.shape, var.dtype)
                out += [Op("pd_op.full", (), (fill,), (), "backward", False, dict(glue)),
                        Op("pd_op.full_like", (reads[k], fill), (stat,), (), "backward", False,
                           dict(glue))]
                reads[k] = stat
            # its in-place variant (the executor's pass) writes the new
            # statistics over the fresh ones
            pairs = ((reads[1], op.writes[1]), (reads[2], op.writes[2]))
            op = replace(op, type="pd_op." + OUT_OF_PLACE[op.type], reads=tuple(reads),
                         attrs=dict(op.attrs, inplace=pairs))
        out.append(op)
        forward = set(self._forward_ids())
        for r in src.results():
            if not r.initialized():
                continue
            for user in r.all_used_ops_in_same_block():
                if user.name() in (SPLIT_OP, SLICE_OP) and user.id() in forward:
                    out.append(Op(user.name(), (), (), (), "backward", False, dict(glue)))
        return out

    def _forward_ids(self) -> List[int]:
        """``id()`` of the PIR ops of the forward part."""
        ids = self.__dict__.get("_fwd")
        if ids is None:
            ops = self._pg.graph.blocks[0].ops
            start = next((i for i, op in enumerate(ops)
                          if op.role in ("backward", "optimize")), len(ops))
            ids = [op.id() for op in self._top[:start] if op is not None]
            self._fwd = ids
        return ids

    def finish(self, problem, plan, ops, origin):
        """:func:`_sink_glue`: a backward ``builtin.combine`` whose vector
        a reader reads with a clone made after it moves right before its
        first reader."""
        where = {p: k for k, p in enumerate(origin) if p is not None}
        writer = {n: k for k, op in enumerate(ops) for n in op.writes}
        moves = []
        for k, (op, p) in enumerate(zip(ops, origin)):
            if p is None or op.type != COMBINE_OP or self._top[p] is None:
                continue
            comb = self._top[p]
            names = {self._pg.name_of.get(v.id) for v in comb.operands_source()
                     if v.initialized()}
            users = sorted(where[q] for q in (self._position(u, p) for u in
                                              comb.result(0).all_used_ops_in_same_block())
                           if q is not None and q in where)
            if not users:
                continue
            read = {n for u in users for n in ops[u].reads
                    if CLONE_SUFFIX in n and n.split(CLONE_SUFFIX)[0] in names}
            if any(writer.get(n, -1) > k for n in read):
                moves.append((k, users[0]))
        if not moves:
            return ops
        order = list(range(len(ops)))
        for k, target in moves:
            order.remove(k)
            order.insert(order.index(target), k)
        return [ops[k] for k in order]

    def _position(self, pir_op, near: int) -> Optional[int]:
        """The position of ``pir_op`` in the program as read (searched
        from ``near`` on)."""
        ops = self._top
        for q in range(near, len(ops)):
            if ops[q] is not None and ops[q].id() == pir_op.id():
                return q
        return None


def predictor(batch: int, runtime, inplace_pairs: list, options: Optional[dict] = None,
              graph: Optional[Graph] = None):
    """``predict(graph, plan) -> Analysis`` for graphs rewritten from a
    program's: :func:`memopt.analysis.from_graph` under ``runtime``.  The
    executor's in-place pairs: with ``options`` (the original program's
    :func:`memopt.paddle.pir.inplace.inplace_options`, ``graph`` its graph)
    its pass run again on the rewritten graph
    (:func:`rewritten_options`, :func:`memopt.paddle.pir.inplace.inplace_where`);
    else the original's ``inplace_pairs`` that still hold
    (:func:`memopt.recompute.kept_inplace`)."""
    from ...analysis import from_graph
    from ...recompute import kept_inplace
    from .inplace import inplace_where

    def predict(rewritten, plan: RecomputePlan):
        if options is None or not runtime.inplace:
            pairs = kept_inplace(rewritten, inplace_pairs) if runtime.inplace else []
        else:
            pairs = inplace_where(rewritten, rewritten_options(graph, rewritten, options))
        return from_graph(rewritten, batch, runtime, pairs)

    return predict


def rewritten_options(original: Graph, rewritten: Graph, options: dict) -> list:
    """Per op of ``rewritten`` (from ``original`` by
    :func:`memopt.recompute.rewrite_graph`), the in-place pairs the
    executor's pass may take there: the original op's ``options``
    (clones and redirected readers: their operands renamed alike), the
    pairs :class:`PirSpelling` declares for the ops it adds (``attrs``
    ``"inplace"``)."""
    # ``options`` is keyed by flat position (every block, walk order)
    ops = [op for _, op in original.walk_ops()]
    at = {op.attrs["pir_id"]: k for k, op in enumerate(ops) if op.attrs and "pir_id" in op.attrs}
    out = []
    for op in rewritten.blocks[0].ops:
        attrs = op.attrs or {}
        if "inplace" in attrs:
            out.append(list(attrs["inplace"]))
            continue
        k = at.get(attrs.get("pir_id"))
        if k is None or k not in options or ops[k].type != op.type:
            out.append([])
            continue
        src = ops[k]
        out.append([(op.reads[src.reads.index(i)], op.writes[src.writes.index(o)])
                    for i, o in options[k]])
    return out


class AppliedRecompute:
    """What :func:`apply_plan` did to a program, and how to take it back.

    ``clones`` maps each recomputed name to its clone Value.  :meth:`undo`
    points every redirected use back at the original value and erases every
    op the plan added, leaving the block as it was read; memory_optimize
    calls it when a later step of the same call fails, so the call changes
    the program all at once or not at all.  The original ops go back to
    their original order too (:func:`_sink_glue` may have moved a
    ``builtin.combine``): the block reads as it was, op for op."""

    def __init__(self, block, original_ops, redirected, clones):
        self.clones: Dict[str, object] = clones
        self._block = block
        self._original = list(original_ops)
        self._known = {op.id() for op in original_ops}
        self._redirected = redirected

    @insertion_point_kept()
    def undo(self) -> None:
        from paddle import pir

        pir.set_insertion_point_to_block_end(self._block)
        for user, k, old in reversed(self._redirected):
            user.operand(k).set_source(old)
        for op in reversed(list(self._block.ops)):
            if op.id() not in self._known:
                op.erase()
        self._redirected = []
        restore_order(self._block, self._original)


def restore_order(block, original_ops) -> None:
    """Put the ops of ``block`` (the same ops as ``original_ops``) back in
    the order of ``original_ops``; nothing moves when it already is."""
    if [op.id() for op in block.ops] == [op.id() for op in original_ops]:
        return
    for k in range(len(original_ops) - 2, -1, -1):
        original_ops[k].move_before(original_ops[k + 1])


@insertion_point_kept()
def apply_plan(pg: PirGraph, plan: RecomputePlan) -> AppliedRecompute:
    """Clone the plan's ops into ``pg.program`` and point the backward
    part's uses of the dropped values at the clones; all or nothing (on any
    failure the new ops are removed and every use put back).  Returns the
    :class:`AppliedRecompute` (``.clones``: ``{recomputed name: the clone
    Value}``; ``.undo()`` takes it all back).

    A clone's :attr:`~memopt.recompute.Clone.dep` becomes a few tiny ops
    right before it: ``s = shape64(input) + 0 * shape64(trigger)[0]`` (int64)
    and ``input' = reshape_(input, s)`` -- the same dims, in place (no copy,
    no change to the data) -- which the clone reads instead of ``input``,
    directly or as an element of the vector it reads (so that a ``concat``
    clone waits too).
    """
    import paddle
    from paddle import pir

    from .regions import top_level_ops

    program = pg.program
    ops = list(program.global_block().ops)
    top = top_level_ops(pg)  # by graph position; None: a synthetic op
    read = [op for op in top if op is not None]
    if len(ops) != len(read) or any(a.id() != b.id() for a, b in zip(ops, read)):
        raise PlanError("apply_plan: the program changed since it was read")
    start = next((i for i, op in enumerate(pg.graph.blocks[0].ops)
                  if op.role in ("backward", "optimize")), len(top))
    backward = {op for op in top[start:] if op is not None}
    forward = {op for op in top[:start] if op is not None}
    options = paddle.pir.CloneOptions(False, True, True)
    new_of: Dict[int, object] = {}    # original value id -> its clone
    made: List[object] = []           # new ops, in insertion order
    redirected: List[Tuple[object, int, object]] = []  # (op, operand index, original)
    clones: Dict[str, object] = {}
    block = program.global_block()
    try:
        for c in plan.clones:
            src, anchor = top[c.op], top[c.before]
            if src is None or anchor is None:
                raise PlanError(f"apply_plan: clone of op {c.op} before op {c.before}: "
                                "one of them is no op of the program")
            pir.set_insertion_point(anchor)
            waited = None
            if c.dep is not None:
                x, trigger = pg.values[c.dep[0]], pg.values[c.dep[1]]
                waited = waiting_for(x, trigger, copy=is_copy_dep(pg.graph, c.dep))
            mapping = paddle.pir.IrMapping()
            for v in src.operands_source():
                if not v.initialized():
                    continue
                d = v.get_defining_op()
                if d is not None and d.name() == COMBINE_OP:
                    inner = paddle.pir.IrMapping()
                    for e in d.operands_source():
                        if waited is not None and e.id == pg.values[c.dep[0]].id:
                            inner.add(e, waited)  # the clone waits through its vector too
                        else:
                            inner.add(e, new_of.get(e.id, e))
                    comb = d.clone(inner, options)
                    comb.move_before(anchor)
                    made.append(comb)
                    mapping.add(v, comb.result(0))
                elif waited is not None and v.id == pg.values[c.dep[0]].id:
                    mapping.add(v, waited)
                else:
                    mapping.add(v, new_of.get(v.id, v))
            if src.name() in OUT_OF_PLACE:
                new = _out_of_place(src, mapping)
            else:
                new = src.clone(mapping, options)
            new.move_before(anchor)
            made.append(new)
            for r_old, r_new in zip(src.results(), new.results()):
                if not r_old.initialized():
                    continue
                new_of[r_old.id] = r_new
                if r_old.id in pg.name_of:
                    clones[pg.name(r_old) + c.tag] = r_new
                for user in r_old.all_used_ops_in_same_block():
                    if user.name() in (SPLIT_OP, SLICE_OP) and user.get_parent_block() \
                            is not None and user in forward:
                        inner = paddle.pir.IrMapping()
                        inner.add(r_old, r_new)
                        sp = user.clone(inner, options)
                        sp.move_before(anchor)
                        made.append(sp)
                        for e_old, e_new in zip(user.results(), sp.results()):
                            if e_old.initialized():
                                new_of[e_old.id] = e_new
                                if e_old.id in pg.name_of:
                                    clones[pg.name(e_old) + c.tag] = e_new
        own = {top[k] for k in plan.readers}
        for name in plan.dropped:
            new = clones.get(name)
            if new is not None:
                redirected.extend(redirect_data_uses(pg.values[name], new, backward - own))
            elif not any(name in r for r in plan.readers.values()):
                raise PlanError(f"apply_plan: {name} has no clone")
        for k in sorted(plan.readers):
            for name, tag in sorted(plan.readers[k].items()):
                new = clones.get(name + tag)
                if new is None:
                    raise PlanError(f"apply_plan: {name} has no clone for op {k}")
                redirected.extend(redirect_data_uses(pg.values[name], new, {top[k]}))
        pir.set_insertion_point_to_block_end(block)
        _sink_glue(block)
        verify_defined_before_use(block)
    except Exception:
        AppliedRecompute(block, ops, redirected, clones).undo()
        raise
    return AppliedRecompute(block, ops, redirected, clones)


def _reads_data(op, value) -> bool:
    """Whether ``op`` reads ``value``'s data (not only its shape); a
    ``builtin.combine`` does when some op reading its vector does."""
    if op.name() == COMBINE_OP:
        vector = op.result(0)
        return any(_reads_data(user, vector) for user in vector.all_used_ops())
    try:
        return not op.is_no_need_buffer(value)
    except Exception:  # ops without that information: assume data
        return True


def redirect_data_uses(old, new, ops: set) -> list:
    """Point the operands of ``ops`` that read ``old``'s data at ``new``;
    shape-only reads keep ``old`` (see :func:`memopt.recompute.saved_values`).
    Returns ``[(op, operand index, old)]`` for the undo."""
    done = []
    for user in old.all_used_ops():
        if not _reads_data(user, old):
            continue
        if user not in ops and not (user.name() == COMBINE_OP and any(
                u in ops for u in user.result(0).all_used_ops())):
            continue
        for k in range(user.num_operands()):
            if user.operand_source(k).is_same(old):
                user.operand(k).set_source(new)
                done.append((user, k, old))
    return done


def _sink_glue(block) -> None:
    """Move each ``builtin.combine`` that now reads a clone made after it
    (a backward op's vector of forward values, redirected) to right before
    the first op that uses its vector: glue, so moving it changes nothing
    but the order."""
    ops = list(block.ops)
    position = {op.id(): i for i, op in enumerate(ops)}
    for i, op in enumerate(ops):
        if op.name() != COMBINE_OP:
            continue
        late = any(v.initialized() and v.get_defining_op() is not None
                   and position.get(v.get_defining_op().id(), -1) > i
                   for v in op.operands_source())
        if not late:
            continue
        users = sorted(op.result(0).all_used_ops_in_same_block(),
                       key=lambda u: position.get(u.id(), len(ops)))
        if users:
            op.move_before(users[0])


def verify_defined_before_use(block) -> None:
    """PlanError unless every operand of every op of ``block`` is made by an
    earlier op of the block (or is a block argument)."""
    seen = set()
    for i, op in enumerate(block.ops):
        for k, v in enumerate(op.operands_source()):
            if not v.initialized():
                continue
            d = v.get_defining_op()
            if d is not None and d.id() not in seen:
                raise PlanError(f"op {i} ({op.name()}) reads operand {k} before {d.name()} "
                                "makes it")
        seen.add(op.id())


def _out_of_place(src, mapping):
    """Build the out-of-place form of in-place op ``src`` (see
    :data:`OUT_OF_PLACE`) on the mapped operands, at the insertion point."""
    import paddle

    attrs = src.attrs()
    if attrs.get("is_test") or attrs.get("use_global_stats"):
        raise PlanError(f"{src.name()} in inference mode is not recomputed")
    args = [mapping.look_up(v) for v in src.operands_source()]
    # the running statistics: fresh copies' worth of memory (C values), so
    # that nothing -- Paddle's in-place pass included -- can write the
    # clone's unused new statistics over the real ones
    args[1], args[2] = paddle.zeros_like(args[1]), paddle.ones_like(args[2])
    fn = getattr(paddle._C_ops, OUT_OF_PLACE[src.name()])
    results = fn(*args, False, attrs["momentum"], attrs["epsilon"], attrs["data_format"],
                 False, attrs["trainable_statistics"])
    new = results[0].get_defining_op()
    if new.num_results() != src.num_results():
        raise PlanError(f"the out-of-place form of {src.name()} does not match it")
    return new


def waiting_for(x, trigger, copy: bool = False):
    """``x`` viewed through ``reshape_`` to its own dims (``copy``: through
    the out-of-place ``reshape``, for a fed value), computed so that the op
    waits for ``trigger`` (see :func:`apply_plan`)."""
    import paddle

    ops = paddle._C_ops
    dims = ops.shape64(x)
    first = ops.slice(ops.shape64(trigger), [0], [0], [1], [1], [0])
    zero = ops.scale(first, 0.0, 0.0, True)
    waited = (ops.reshape if copy else ops.reshape_)(x, ops.add(dims, zero))
    waited.set_type(x.type())
    return waited
