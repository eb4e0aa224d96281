"""What to recompute so a training step fits a memory budget.

A training step keeps the forward values its backward part reads (the
*saved* values) from the forward pass until the backward pass uses them;
at the turn from forward to backward they are all alive, and that is
usually the step's peak.  Recomputation drops some of them and computes
them again from values that are kept, right before the backward part needs
them: less memory, more compute (Chen et al. 2016; Checkmate, MLSys'20;
MONeT, ICLR'21).

This module is pure data (no Paddle).  An adapter describes the top-level
block as a :class:`RecomputeProblem` (the :class:`memopt.graph.Graph`, the
cost of each op and which ops may run twice); :func:`plan_for_budget`
chooses the values to drop and returns a :class:`RecomputePlan` the adapter
applies to the program.

How values are chosen
---------------------
*Candidates* are saved values whose op may run twice: not random
(``dropout``, ``uniform``, ``gaussian``... would give other values), writing
over no operand (``sgd_``; the adapter may clone an in-place op as its
out-of-place form instead, as Paddle's ``batch_norm_`` whose second run
must not update the running statistics again) and running no sub-block.  A candidate
``v`` is recomputed by cloning the op that made it; each input the clone
needs that the backward part no longer has (a value that was not saved, or
a dropped one) is recomputed the same way, recursively -- a *recipe* of
forward ops.  An input whose own op may not run twice (a dropout's output,
a constant ``assign_value_`` wrote in place, as a causal mask) is held
alive for the clone instead, unless some op writes over it later.
Candidates are ranked by bytes freed per FLOP of their one-op recipe
(largest first: a ReLU, a concat or a GELU before a convolution).  The
adapter may pin values (:attr:`RecomputeProblem.pinned`: read where no
clone can be read, inside a region op's blocks, or kept as they are by the
caller's ``skip_opt_set``; never dropped) and bar
others (:attr:`RecomputeProblem.barred`: written over where the block does
not show it; never read, held or made again by a clone).

The sets of values tried (:func:`candidate_sets`, fixed for a program and
batch, whatever the budget) are prefixes of that ranking and checkpoint
segments (a candidate kept every ``1/m`` of the candidates' bytes, the
smallest one of each such segment, or a whole cut of the forward part
(:func:`forward_cuts`): everything later forward ops read, held for the
clones even where no backward op reads it); each plan's peak is predicted by
:mod:`memopt.analysis` on the rewritten graph (clones placed right before
the first backward op that reads them, backward reads redirected to them),
and the plan for a budget is the one with the least added compute whose
predicted peak fits (:func:`plan_for_budget`).  So a lower budget never
gets a higher predicted peak.

Units: bytes and FLOPs at the planning batch size; op positions are indices
into the top-level block.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from .errors import PlanError
from .graph import Block, Graph, Op, OpFacts
from .overwrites import read_after_overwrite

__all__ = ["RecomputeProblem", "RecomputePlan", "Clone", "Choice", "saved_values",
           "candidates", "candidate_sets", "make_plan", "rewrite_graph", "prefix_grid",
           "grid_plans", "evaluate_grid", "plan_for_budget", "problem_from_graph", "kept_inplace",
           "CLONE_SUFFIX", "ORDER_OP", "is_copy_dep", "forward_cuts", "CloneSpelling"]

#: A recomputed value's name: the original's plus this suffix.
CLONE_SUFFIX = "@RECOMPUTE"


@dataclass
class RecomputeProblem:
    """The top-level block of a training program, as recomputation sees it.

    Attributes
    ----------
    graph : one-block graph (ops with roles ``forward`` / ``backward`` /
        ``optimize``; ``facts.no_need_buffer`` for shape-only reads).
    flops : estimated FLOPs of each op at the planning batch size.
    reusable : per op, None if it may run twice, else why not (a reason
        shown in the report: ``"random"``, ``"writes persistable state"``...).
    available : values the backward part always has (parameters, feeds).
    batch_size : the batch the sizes are taken at.
    """

    graph: Graph
    flops: List[int]
    reusable: List[Optional[str]]
    available: frozenset
    batch_size: int
    #: how :func:`rewrite_graph` spells a clone as ops (the adapter's, so
    #: that the rewritten graph has the ops the applied program has)
    spelling: "CloneSpelling" = None
    #: values never dropped (read where a clone cannot be read: inside a
    #: region op's blocks; or the caller's ``skip_opt_set``); clones may
    #: read them
    pinned: frozenset = frozenset()
    #: values a clone never reads, holds or makes again (written over
    #: where the block does not show it: inside a region op's blocks; or
    #: while ops still read them, by an in-place op or a second write of a
    #: legacy variable: :mod:`memopt.overwrites`)
    barred: frozenset = frozenset()
    #: names the adapter knows some op writes over (a legacy variable
    #: written by two ops): never held for a clone (:func:`_holdable`)
    written_over: frozenset = frozenset()

    def __post_init__(self):
        if self.spelling is None:
            self.spelling = CloneSpelling()

    @property
    def ops(self) -> List[Op]:
        return self.graph.blocks[0].ops

    def size(self, name: str) -> int:
        var = self.graph.blocks[0].vars.get(name)
        if var is None or not var.is_dense or var.persistable:
            return 0
        return var.size.at(self.batch_size)


@dataclass(frozen=True)
class Clone:
    """One forward op run again: ``op`` (its position) placed right before
    op ``before`` of the original block; ``outputs`` the values it makes
    again (renamed ``name + CLONE_SUFFIX``).

    ``dep = (input, trigger)``: the clone reads ``input`` through an
    ordering op that also waits for ``trigger`` (a value the backward part
    makes right before), so an executor that runs every op as soon as its
    inputs are ready cannot run the clone back in the forward part (where
    its result would be held all along).  None: one of its inputs is
    another clone's output, which already waits."""

    op: int
    before: int
    outputs: Tuple[str, ...]
    dep: Optional[Tuple[str, str]] = None
    #: "" for a clone every backward reader shares; ``"#k"`` for one made
    #: for the readers of group ``k`` alone (:func:`make_plan`'s ``per_reader``)
    tag: str = ""

    def name(self, original: str) -> str:
        """The clone's name for ``original`` (one of :attr:`outputs`)."""
        return original + CLONE_SUFFIX + self.tag


@dataclass
class RecomputePlan:
    """Drop ``dropped`` (saved values) and run ``clones`` (in order) instead;
    ``flops`` is the added compute, ``step_flops`` the step's own
    (forward + backward) estimate."""

    dropped: List[str] = field(default_factory=list)
    clones: List[Clone] = field(default_factory=list)
    flops: int = 0
    step_flops: int = 0
    #: backward op position -> ``{dropped name: tag}`` for the readers that
    #: read their own group's clones (others read the shared ``""`` clones)
    readers: Dict[int, Dict[str, str]] = field(default_factory=dict)
    #: forward values the backward part does not read that the clones read
    #: as they are (held alive from the forward part instead of made again:
    #: a checkpoint of :func:`forward_cuts` that is no saved value)
    held: List[str] = field(default_factory=list)

    @property
    def added_percent(self) -> float:
        return 100.0 * self.flops / self.step_flops if self.step_flops else 0.0


def problem_from_graph(graph: Graph, batch: int, rules) -> RecomputeProblem:
    """The :class:`RecomputeProblem` of a one-block graph at ``batch``;
    ``rules`` (from the adapter) has ``flops(graph, op, batch)`` (an op's
    estimated FLOPs) and ``reason(op)`` (why it may not run twice, or
    None).  Values written over while ops still read them are barred
    (:func:`memopt.overwrites.read_after_overwrite`)."""
    ops = graph.blocks[0].ops
    available = frozenset(var.name for _, var in graph.all_vars()
                          if var.persistable or var.is_data or var.is_feed)
    return RecomputeProblem(graph, [rules.flops(graph, op, batch) for op in ops],
                            [rules.reason(op) for op in ops], available, batch,
                            barred=read_after_overwrite(graph))


def kept_inplace(graph: Graph, pairs: Sequence) -> list:
    """The executor's in-place ``(position, input, output)`` pairs of the
    original program that still hold in ``graph`` (rewritten): a pair whose
    input a clone or ordering op reads is dropped (the input no longer dies
    at the op, so the executor's pass leaves it)."""
    cloned_reads = {n for op in graph.blocks[0].ops if op.attrs
                    and op.attrs.get("recompute_of") is not None for n in op.reads}
    return [p for p in pairs if p[1] not in cloned_reads]


def _first_backward(ops: Sequence[Op]) -> int:
    for i, op in enumerate(ops):
        if op.role in ("backward", "optimize"):
            return i
    return len(ops)


def _real_reads(op: Op) -> Tuple[str, ...]:
    shape_only = set(op.facts.no_need_buffer)
    return tuple(n for n in op.reads if n not in shape_only)


def saved_values(problem: RecomputeProblem) -> Dict[str, List[int]]:
    """``{saved value: positions of the backward ops that read its data}``
    for the forward-made values (dense, not persistable, not fetched or
    fed) whose data some backward op reads.  A read for the shape only
    (``no_need_buffer``: ``concat_grad``'s inputs) keeps no memory alive in
    Paddle's executor and keeps reading the original value: it neither
    makes a value saved nor places its clone."""
    ops = problem.ops
    start = _first_backward(ops)
    made: Dict[str, int] = {}
    for i, op in enumerate(ops[:start]):
        for name in op.writes:
            made.setdefault(name, i)
    fetched = set(problem.graph.fetch_names)
    held: set = set()
    for op in ops[start:]:
        held.update(_real_reads(op))
    out: Dict[str, List[int]] = {}
    for i, op in enumerate(ops[start:], start):
        for name in _real_reads(op):
            if name in held and name in made and name not in fetched \
                    and name not in problem.available and problem.size(name) > 0:
                var = problem.graph.blocks[0].vars[name]
                if not (var.is_feed or var.is_data):
                    out.setdefault(name, []).append(i)
    return out


def _makers(problem: RecomputeProblem) -> Dict[str, int]:
    start = _first_backward(problem.ops)
    made: Dict[str, int] = {}
    for i, op in enumerate(problem.ops[:start]):
        for name in op.writes:
            made.setdefault(name, i)
    return made


def candidates(problem: RecomputeProblem) -> List[str]:
    """Saved values that may be recomputed, best first (bytes per FLOP of
    their own op; ties by position)."""
    saved = saved_values(problem)
    makers = _makers(problem)
    out = []
    for name in saved:
        i = makers[name]
        if problem.reusable[i] is not None or name in problem.pinned or name in problem.barred:
            continue
        if _recipe(problem, [name], set(saved) - {name}, makers) is None:
            continue
        out.append(name)
    return sorted(out, key=lambda n: (-problem.size(n) / (problem.flops[makers[n]] + 1.0),
                                      makers[n], n))


def _recipe(problem: RecomputeProblem, wanted: Sequence[str], kept: set,
            makers: Dict[str, int]) -> Optional[List[int]]:
    """Positions of the forward ops to run again (in forward order) so that
    every name in ``wanted`` is made again from ``kept`` and always
    available values; None if one of them may not run twice."""
    need: set = set()
    stack = list(wanted)
    targets = set(wanted)
    seen: set = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        i = makers.get(name)
        if i is None or name in problem.barred:
            return None  # not made in the forward part (or written over): nothing to clone
        if problem.reusable[i] is not None:
            if name not in targets and _holdable(problem, name):
                continue  # an input kept alive to the clone, not made again
            return None
        if i in need:
            continue
        need.add(i)
        for src in problem.ops[i].reads:
            if src in problem.barred:
                return None  # its data depends on whether a region ran yet
            if src in kept or src in problem.available:
                continue
            var = problem.graph.blocks[0].vars.get(src)
            if var is not None and (var.persistable or var.is_feed or var.is_data):
                continue
            stack.append(src)
    return sorted(need)


def _holdable(problem: RecomputeProblem, name: str) -> bool:
    """Whether a clone may read ``name`` itself, held alive from the forward
    part, when its op may not run twice (a random op's output, the result
    of an in-place op such as ``assign_value_``): yes unless some op writes
    over it (its buffer would hold other data by the time the clone runs)
    or reads it through an in-place op whose overwrites are not known.
    Holding it costs its bytes until the clone; the prediction of the
    rewritten graph counts them."""
    held = problem.__dict__.setdefault("_not_holdable", None)
    if held is None:
        held = set(problem.written_over)
        for op in problem.ops:
            held.update(src for src, _ in op.facts.overwrites)
            if op.type.endswith("_") and not op.facts.overwrites:
                held.update(op.reads)
        problem.__dict__["_not_holdable"] = held
    var = problem.graph.blocks[0].vars.get(name)
    return var is not None and var.is_dense and name not in held and name not in problem.barred


def make_plan(problem: RecomputeProblem, dropped: Sequence[str],
              per_reader: Optional[int] = None, held: Sequence[str] = ()) -> RecomputePlan:
    """The clones that recompute ``dropped`` (saved values) for the backward
    part, each placed right before the first backward op that needs it
    (directly or through a later clone).  PlanError if one cannot be
    recomputed.

    ``per_reader`` (an op count ``g``): clones are shared only by backward
    readers within ``g`` ops of a group's first reader; a later reader
    starts a group with clones of its own, made right before it (more
    compute, but a value read at both ends of the backward part is not
    held across it).  Values made from parameters and feeds alone stay
    kept in this mode (such a clone could not be held back, see
    :attr:`Clone.dep`).

    ``held``: forward values (not saved) the clones read as they are, kept
    alive until then rather than made again; PlanError unless each may be
    (:func:`_holdable`: dense, never written over)."""
    ops = problem.ops
    saved = saved_values(problem)
    makers = _makers(problem)
    dropped = list(dict.fromkeys(dropped))
    pinned = [n for n in dropped if n in problem.pinned or n in problem.barred]
    if pinned:
        raise PlanError(f"cannot drop {pinned}: pinned (skip_opt_set, or read inside a "
                        f"region op) or written over inside a region op")
    held = [n for n in dict.fromkeys(held) if n not in saved]
    for name in held:
        if name not in makers or not _holdable(problem, name):
            raise PlanError(f"cannot hold {name} for the clones: it is written over or "
                            "not made in the forward part")
    if per_reader is not None:
        start = _first_backward(ops)
        dropped = [n for n in dropped
                   if _ordering(problem, makers[n], len(ops) - 1, start) is not None]
        plan = _plan_per_reader(problem, dropped, (set(saved) - set(dropped)) | set(held),
                                saved, makers, per_reader)
        plan.held = _held_read(problem, plan, held)
        return plan
    kept = (set(saved) - set(dropped)) | set(held)
    recipe = _recipe(problem, dropped, kept, makers)
    if recipe is None:
        raise PlanError(f"cannot recompute {dropped}: an op on the way may not run twice")
    in_recipe = set(recipe)
    start = _first_backward(ops)
    # first backward use of each recipe op's outputs (via clones too)
    first: Dict[int, int] = {}
    for name in dropped:
        first[makers[name]] = min(first.get(makers[name], len(ops)), min(saved[name]))
    # propagate: a recipe op must run before every recipe op that reads it
    for j in reversed(recipe):
        if j not in first:
            continue
        for src in ops[j].reads:
            i = makers.get(src)
            if i in in_recipe and i != j:
                first[i] = min(first.get(i, len(ops)), first[j])
    clones = []
    recomputed = {n for i in recipe if i in first for n in ops[i].writes}
    for i in recipe:
        if i not in first:  # made by the recipe but read by no clone or backward op
            continue
        dep = None
        if not any(n in recomputed for n in ops[i].reads):
            dep = _ordering(problem, i, first[i], start)
        clones.append(Clone(i, first[i], tuple(ops[i].writes), dep))
    clones.sort(key=lambda c: (c.before, c.op))
    flops = sum(problem.flops[c.op] for c in clones)
    step = 3 * sum(problem.flops[:start])
    plan = RecomputePlan(dropped, clones, flops, step)
    plan.held = _held_read(problem, plan, held)
    return plan


def _held_read(problem: RecomputeProblem, plan: RecomputePlan, held: Sequence[str]) -> List[str]:
    """The names of ``held`` some clone of ``plan`` reads."""
    read = {n for c in plan.clones for n in problem.ops[c.op].reads}
    return [n for n in held if n in read]


def _plan_per_reader(problem: RecomputeProblem, dropped: List[str], kept: set,
                     saved: Dict[str, List[int]], makers: Dict[str, int],
                     gap: int) -> RecomputePlan:
    """:func:`make_plan` with clones grouped by reader: walking the backward
    readers of dropped values in order, a reader within ``gap`` ops of the
    current group's first reader joins it, else it starts a new group whose
    clones (its recipe from the kept values) are made right before it."""
    ops = problem.ops
    start = _first_backward(ops)
    wanted: Dict[int, List[str]] = {}
    for name in dropped:
        for k in saved[name]:
            wanted.setdefault(k, []).append(name)
    groups: List[Tuple[int, List[int]]] = []
    for k in sorted(wanted):
        if groups and k - groups[-1][0] <= gap:
            groups[-1][1].append(k)
        else:
            groups.append((k, [k]))
    clones: List[Clone] = []
    readers: Dict[int, Dict[str, str]] = {}
    for first, members in groups:
        names = list(dict.fromkeys(n for k in members for n in wanted[k]))
        recipe = _recipe(problem, names, kept, makers)
        if recipe is None:
            raise PlanError(f"cannot recompute {names}: an op on the way may not run twice")
        tag = f"#{first}"
        made = {n for i in recipe for n in ops[i].writes}
        for i in recipe:
            dep = None
            if not any(n in made for n in ops[i].reads):
                dep = _ordering(problem, i, first, start)
                if dep is None and ops[i].reads:
                    raise PlanError(f"op {i} of a clone group cannot be held back")
            clones.append(Clone(i, first, tuple(ops[i].writes), dep, tag))
        for k in members:
            readers[k] = {n: tag for n in wanted[k]}
    flops = sum(problem.flops[c.op] for c in clones)
    step = 3 * sum(problem.flops[:start])
    return RecomputePlan(dropped, clones, flops, step, readers)


class _OrderingIndex:
    """What :func:`_ordering` reads of a problem's ops, built once per
    problem and backward start (it is asked once per clone and per dropped
    value: tens of thousands of times on a big program, each of which
    walked every op before).

    - ``dense_temp(name)``: a dense temporary (not persistable, fed, written
      by a region op or barred);
    - ``first_write[name]``: the first backward position (from ``start``)
      whose op writes ``name``;
    - ``latest[i - start]``: the first dense temporary written by the last op
      at or before ``i`` (from ``start``) that writes one; None if none."""

    def __init__(self, problem: RecomputeProblem, start: int) -> None:
        ops = problem.ops
        self.key = (ops, len(ops), problem.barred, problem.graph.blocks[0].vars, start)
        self.variables = problem.graph.blocks[0].vars
        self.barred = problem.barred
        # values a region op writes (a while's carried values live in its body)
        self.inner = {n for o in ops if o.sub_blocks or o.facts.synthetic == "before"
                      for n in o.writes}
        self._dense: Dict[str, bool] = {}
        self.first_write: Dict[str, int] = {}
        self.latest: List[Optional[str]] = []
        trigger = None
        for i in range(start, len(ops)):
            for n in ops[i].writes:
                self.first_write.setdefault(n, i)
            own = next((n for n in ops[i].writes if self.dense_temp(n)), None)
            if own is not None:
                trigger = own
            self.latest.append(trigger)

    def dense_temp(self, name: str) -> bool:
        known = self._dense.get(name)
        if known is None:
            var = self.variables.get(name)
            known = (var is not None and var.is_dense and not var.persistable
                     and not var.is_feed and not var.is_data and name not in self.inner
                     and name not in self.barred)
            self._dense[name] = known
        return known

    def fits(self, problem: RecomputeProblem, start: int) -> bool:
        """Whether this index was built for ``problem`` as it is now."""
        ops = problem.ops
        key = self.key
        return (key[0] is ops and key[1] == len(ops) and key[2] is problem.barred
                and key[3] is problem.graph.blocks[0].vars and key[4] == start)


def _ordering_index(problem: RecomputeProblem, start: int) -> _OrderingIndex:
    index = problem.__dict__.get("_ordering_index")
    if index is None or not index.fits(problem, start):
        index = _OrderingIndex(problem, start)
        problem.__dict__["_ordering_index"] = index
    return index


def _ordering(problem: RecomputeProblem, op: int, before: int,
              start: int) -> Optional[Tuple[str, str]]:
    """``(input, trigger)`` for a clone of ``op`` placed before ``before``
    (see :attr:`Clone.dep`): the input is a dense temporary the op reads
    (the ordering op rewrites its input's dims in place, to the same dims)
    or, when the op reads no temporary, a fed value (read through a copy:
    :func:`is_copy_dep`); never a parameter; the trigger a dense value a backward
    op before ``before`` makes (one ``before`` reads if any).  None when
    there is no such pair (nothing of the backward part runs before it)."""
    ops = problem.ops
    index = _ordering_index(problem, start)
    variables = index.variables
    dense_temp = index.dense_temp
    inputs = [n for n in ops[op].reads if dense_temp(n) and n not in problem.available]
    if not inputs:
        # a fed value, read through a copy (see Clone.dep): never written over
        inputs = [n for n in ops[op].reads if n in variables and variables[n].is_dense
                  and not variables[n].persistable and (variables[n].is_feed
                                                       or variables[n].is_data)]
    if not inputs:
        return None
    # a value ``before`` reads that a backward op before it makes
    first_write = index.first_write
    trigger = next((n for n in ops[before].reads
                    if first_write.get(n, before) < before and dense_temp(n)), None)
    if trigger is None and before - 1 >= start:
        trigger = index.latest[before - 1 - start]
    return None if trigger is None else (inputs[0], trigger)


def is_copy_dep(graph: Graph, dep: Optional[Tuple[str, str]]) -> bool:
    """Whether the ordering op of ``dep`` (a :attr:`Clone.dep` of a plan for
    ``graph``) copies its input (a fed value, never written over) rather
    than viewing it in place."""
    if dep is None:
        return False
    var = graph.blocks[0].vars.get(dep[0])
    return var is not None and (var.is_feed or var.is_data)


#: The op type of the ordering op in a rewritten graph (see :attr:`Clone.dep`).
ORDER_OP = "memopt.after"


class CloneSpelling:
    """How :func:`rewrite_graph` spells one clone as ops of the rewritten
    graph.  This generic spelling is one :data:`ORDER_OP` for a
    :attr:`Clone.dep` and the cloned op itself; an adapter whose applied
    program has other ops there (Paddle: a few tiny ops per ordering, the
    out-of-place form of an in-place op) spells them as it emits them, so
    that schedules and late frees see the same op sequence."""

    def order_ops(self, problem: RecomputeProblem, clone: Clone, waited: str,
                  variables: Dict[str, object]) -> List[Op]:
        """The ops that make ``waited``: ``clone.dep``'s input once
        ``clone.dep``'s trigger exists (declaring any new value in
        ``variables``)."""
        x, trigger = clone.dep
        copy = is_copy_dep(problem.graph, clone.dep)
        return [Op(ORDER_OP, (x, trigger), (waited,), (), "backward", False,
                   {"recompute_of": clone.op},
                   OpFacts(overwrites=() if copy else ((x, waited),),
                           no_need_buffer=(trigger,)))]

    def clone_ops(self, problem: RecomputeProblem, clone: Clone, op: Op,
                  variables: Dict[str, object]) -> List[Op]:
        """The ops that run ``op`` (the clone of ``problem.ops[clone.op]``,
        reads and writes already renamed), in order."""
        return [op]

    def finish(self, problem: RecomputeProblem, plan: RecomputePlan, ops: List[Op],
               origin: List[Optional[int]]) -> List[Op]:
        """The rewritten block's ops once every clone is placed (``origin``:
        each op's position in ``problem.ops``, None for an added op)."""
        return ops


def rewrite_graph(problem: RecomputeProblem, plan: RecomputePlan) -> Tuple[Graph, List[str]]:
    """The graph with ``plan`` applied: each clone (an op reading the
    clones of its group's recomputed inputs) inserted right before its
    backward op, and backward reads of dropped values redirected to the
    clones (a reader in :attr:`RecomputePlan.readers` to its group's).
    Returns the graph and its clone names.  Shape-only reads keep the
    original value (see :func:`saved_values`).  Each clone is spelled by
    ``problem.spelling`` (:class:`CloneSpelling`)."""
    ops = problem.ops
    block0 = problem.graph.blocks[0]
    spelling = problem.spelling
    variables = dict(block0.vars)
    made: Dict[str, set] = {}  # tag -> names its clones make
    for c in plan.clones:
        made.setdefault(c.tag, set()).update(c.outputs)
        for name in c.outputs:
            # a clone of an in-place update (batch_norm_'s statistics) makes a
            # fresh temporary, not a persistable value
            variables[c.name(name)] = replace(block0.vars[name], name=c.name(name),
                                              is_fetch=False, persistable=False)
    before: Dict[int, List[Clone]] = {}
    for c in plan.clones:
        before.setdefault(c.before, []).append(c)
    start = _first_backward(ops)
    dropped = set(plan.dropped)
    shared = made.get("", set())
    new_ops: List[Op] = []
    origin: List[Optional[int]] = []
    for i, op in enumerate(ops):
        for c in before.get(i, ()):
            src = ops[c.op]
            attrs = dict(src.attrs or {})
            attrs["recompute_of"] = c.op
            facts = replace(src.facts, overwrites=())  # a clone writes fresh values
            group = made[c.tag]
            reads = [n + CLONE_SUFFIX + c.tag if n in group else n for n in src.reads]
            if c.dep is not None:
                x = c.dep[0]
                waited = f"{x}@AFTER{len(new_ops)}"
                variables[waited] = replace(block0.vars[x], name=waited, is_fetch=False,
                                            is_feed=False, is_data=False)
                added = spelling.order_ops(problem, c, waited, variables)
                new_ops.extend(added)
                origin.extend([None] * len(added))
                reads = [waited if n == x else n for n in reads]
            added = spelling.clone_ops(problem, c, Op(
                src.type, tuple(reads), tuple(c.name(n) for n in src.writes), (), "backward",
                False, attrs, facts), variables)
            new_ops.extend(added)
            origin.extend([None] * len(added))
        if i >= start:
            shape_only = set(op.facts.no_need_buffer)
            own = plan.readers.get(i, {})
            reads = tuple(n if n in shape_only
                          else n + CLONE_SUFFIX + own[n] if n in own
                          else n + CLONE_SUFFIX if n in dropped and n in shared
                          else n for n in op.reads)
            if reads != op.reads:
                op = replace(op, reads=reads)
        new_ops.append(op)
        origin.append(i)
    new_ops = spelling.finish(problem, plan, new_ops, origin)
    # the blocks region ops run are kept as they are: nothing in them changes
    graph = Graph(blocks=[Block(0, -1, new_ops, variables), *problem.graph.blocks[1:]],
                  fetch_names=problem.graph.fetch_names)
    return graph, sorted(c.name(n) for c in plan.clones for n in c.outputs)


def prefix_grid(n: int, points: int = 16) -> List[int]:
    """The prefix lengths tried: every ``k`` up to ``points``, else about
    ``points`` of them spread evenly, always 0 and ``n``."""
    if n <= points:
        return list(range(n + 1))
    return sorted({round(n * i / points) for i in range(points + 1)})


#: Segment lengths of the checkpoint family (see :func:`candidate_sets`).
SEGMENTS = (2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)


def candidate_sets(problem: RecomputeProblem,
                   points: int = 16) -> List[Tuple[str, List[str], List[str]]]:
    """The sets of saved values to drop that are tried, each ``(label,
    names, held)`` (``held``: values the clones read as they are, see
    :func:`make_plan`); fixed for a program and batch, whatever the budget:

    - ``cheap k``: the first ``k`` candidates by bytes per FLOP
      (:func:`candidates`), ``k`` on :func:`prefix_grid`;
    - ``segments m``: checkpoints (Chen et al.): walking the candidates in
      forward order, one is kept whenever the bytes dropped since the last
      kept one reach ``1/m`` of all candidates' bytes, the others dropped,
      so the backward part recomputes one segment at a time from its
      checkpoint (``m`` in :data:`SEGMENTS`);
    - ``small checkpoints m``: the same segments with each checkpoint moved
      to the smallest value of its segment (:func:`_small_checkpoints`);
    - ``cuts m``: segments of about ``1/m`` of the candidates' bytes again,
      each ending at a whole cut of the forward part
      (:func:`forward_cuts`, :func:`_cut_checkpoints`): everything the later
      forward part reads is kept there, so a segment is made again from its
      cut alone, never from the segment before it.

    Dropping every candidate at once would recompute the whole forward part
    in one go at the start of the backward part, which saves nothing: the
    segments are what bound the recomputed values alive at once."""
    ranked = candidates(problem)
    out: List[Tuple[str, List[str], List[str]]] = []
    seen: set = set()
    for k in prefix_grid(len(ranked), points):
        key = frozenset(ranked[:k])
        if key not in seen:
            seen.add(key)
            out.append((f"cheap {k}", ranked[:k], []))
    makers = _makers(problem)
    ordered = sorted(ranked, key=lambda n: (makers[n], n))
    total = sum(problem.size(n) for n in ordered)
    for m in SEGMENTS:
        if m >= len(ordered):
            break
        # a checkpoint whenever the bytes dropped since the last one reach
        # 1/m of all candidates' bytes: segments of about equal memory
        limit, run, dropped = total / m, 0, []
        for n in ordered:
            run += problem.size(n)
            if run >= limit:
                run = 0
                continue
            dropped.append(n)
        key = frozenset(dropped)
        if key not in seen:
            seen.add(key)
            out.append((f"segments {m}", dropped, []))
        dropped = _small_checkpoints(problem, ordered, total / m)
        key = frozenset(dropped)
        if key not in seen:
            seen.add(key)
            out.append((f"small checkpoints {m}", dropped, []))
    cuts = forward_cuts(problem)
    for m in SEGMENTS:
        if m >= len(ordered):
            break
        dropped, held = _cut_checkpoints(problem, ordered, cuts, total / m)
        key = frozenset(dropped)
        if key not in seen:
            seen.add(key)
            out.append((f"cuts {m}", dropped, held))
    return out


def forward_cuts(problem: RecomputeProblem) -> List[Tuple[int, frozenset]]:
    """``[(position, values)]``: the forward positions where the forward
    part could be cut -- after op ``position``, the values made so far
    that a later forward op still reads (``values``, never parameters or
    feeds) are each a saved value or may be held for the clones
    (:func:`_holdable`), so keeping them lets every later forward value be
    made again from them alone.  A residual block's output, a U-Net
    decoder level's input together with the encoder's skips still to come,
    a dense block's features so far (each layer's output, read by every
    later concat: the concats, their batch norms and ReLUs are then made
    again from them, as in memory-efficient DenseNets)."""
    ops = problem.ops
    start = _first_backward(ops)
    saved = saved_values(problem)
    variables = problem.graph.blocks[0].vars
    makers = _makers(problem)
    last: Dict[str, int] = {}
    for i, op in enumerate(ops[:start]):
        for name in op.reads:
            if name in makers and makers[name] < i:
                last[name] = i
    live: set = set()
    out: List[Tuple[int, frozenset]] = []
    for i, op in enumerate(ops[:start]):
        for name in op.writes:
            var = variables.get(name)
            if last.get(name, -1) > i and name not in problem.available \
                    and not (var is not None and (var.persistable or var.is_feed or var.is_data)):
                live.add(name)
        live = {n for n in live if last[n] > i}
        if live and all(n in saved or _holdable(problem, n) for n in live):
            out.append((i, frozenset(live)))
    return out


def _cut_checkpoints(problem: RecomputeProblem, ordered: Sequence[str],
                     cuts: Sequence[Tuple[int, frozenset]],
                     limit: float) -> Tuple[List[str], List[str]]:
    """``(dropped, held)`` when the checkpoints are whole forward cuts
    (:func:`forward_cuts`): walking the forward part, once the candidates'
    bytes made since the last cut reach ``limit`` the cut with the fewest
    bytes among those passed since (the latest of equals) is taken and
    its values are kept (``held``: those no backward op reads); every
    other candidate is dropped.  A segment's
    recipes then stop at its cut instead of reaching into the segment
    before it (a checkpoint inside a residual block leaves the shortcut's
    input to be made again from further back)."""
    makers = _makers(problem)
    made_at: Dict[int, int] = {}
    for n in ordered:
        made_at[makers[n]] = made_at.get(makers[n], 0) + problem.size(n)
    kept: set = set()
    window: List[Tuple[int, int, frozenset]] = []  # (bytes, position, values)
    last_cut, run, k = -1, 0, 0
    positions = sorted(made_at)
    for pos, values in cuts:
        while k < len(positions) and positions[k] <= pos:
            run += made_at[positions[k]]
            k += 1
        window.append((sum(problem.size(n) for n in values), pos, values))
        if run < limit:
            continue
        _, cut, values = min(window, key=lambda w: (w[0], -w[1]))
        kept.update(values)
        last_cut = cut
        run = sum(b for p, b in made_at.items() if last_cut < p <= pos)
        window = [w for w in window if w[1] > last_cut]
    saved = saved_values(problem)
    return [n for n in ordered if n not in kept], sorted(n for n in kept if n not in saved)


def _small_checkpoints(problem: RecomputeProblem, ordered: Sequence[str],
                       limit: float) -> List[str]:
    """The candidates to drop when checkpoints are the smallest values
    (Chen et al.'s segments, cut where the graph is thin): walking
    ``ordered`` (forward order), once the bytes since the last checkpoint
    reach ``limit`` the smallest value among them (the latest of equals)
    is kept as the next checkpoint and the walk goes on after it.  A
    transformer's residual stream or a block's output is cut rather than
    an attention map, so a segment's recipes stop at small kept values."""
    kept: set = set()
    start, run = 0, 0
    for j, name in enumerate(ordered):
        run += problem.size(name)
        if run < limit:
            continue
        window = ordered[start:j + 1]
        k = start + min(range(len(window)),
                        key=lambda i: (problem.size(window[i]), -i))
        kept.add(ordered[k])
        start = k + 1
        run = sum(problem.size(n) for n in ordered[start:j + 1])
    return [n for n in ordered if n not in kept]


@dataclass
class Choice:
    """A plan, its label (:func:`candidate_sets`), its predicted total peak
    (bytes at the problem's batch) and the prediction itself (any object
    with ``total_peak(batch)``: an :class:`memopt.analysis.Analysis`)."""

    label: str
    plan: RecomputePlan
    peak: int
    prediction: object = None

    @property
    def k(self) -> int:
        """How many saved values the plan drops."""
        return len(self.plan.dropped)


def grid_plans(problem: RecomputeProblem, points: int = 16,
               per_reader: bool = True) -> Iterator[Tuple[str, RecomputePlan]]:
    """``(label, plan)`` for every plan of the grid, in the grid's order: each
    set of :func:`candidate_sets` with shared clones, then (unless
    ``per_reader`` is False) with clones per group of readers
    (:data:`READER_GAPS`) where that makes clones; sets that cannot be
    recomputed are left out.  Not predicted (see :func:`evaluate_grid`)."""
    gaps = (None, *READER_GAPS) if per_reader else (None,)
    for label, dropped, held in candidate_sets(problem, points):
        for gap in gaps:
            try:
                plan = make_plan(problem, dropped, gap, held)
            except PlanError:
                continue
            if gap is not None and not plan.clones:
                continue
            yield (label if gap is None else f"{label}, clones per reader {gap}"), plan


def evaluate_grid(problem: RecomputeProblem, predict: Callable[[Graph, RecomputePlan], object],
                  points: int = 16,
                  keep: Optional[Callable[[RecomputePlan], bool]] = None,
                  per_reader: bool = True) -> List[Choice]:
    """:class:`Choice` for every plan of :func:`grid_plans` (only those
    ``keep`` accepts, when given; the per-reader plans not even made when
    ``per_reader`` is False); ``predict`` gives a rewritten graph's
    prediction (``.total_peak(batch)`` in bytes)."""
    out = []
    for name, plan in grid_plans(problem, points, per_reader):
        if keep is not None and not keep(plan):
            continue
        graph, _ = rewrite_graph(problem, plan)
        prediction = predict(graph, plan)
        out.append(Choice(name, plan, prediction.total_peak(problem.batch_size), prediction))
    return out


#: Reader gaps of the per-reader clone variant tried for every set
#: (:func:`make_plan`'s ``per_reader``).
READER_GAPS = (8,)


def plan_for_budget(choices: Sequence[Choice], budget: int) -> Optional[Choice]:
    """The choice with the least added compute whose peak fits ``budget``
    (ties: the lower peak, then the earlier choice); None when none fits.

    Monotone: the choices are fixed, so for a lower budget ``B' < B`` the
    fitting set shrinks; if ``B``'s choice still fits ``B'`` it is chosen
    again, else its peak is above ``B'`` and so above the new choice's."""
    fitting = [(c.plan.flops, c.peak, i) for i, c in enumerate(choices) if c.peak <= budget]
    if not fitting:
        return None
    return choices[min(fitting)[2]]
