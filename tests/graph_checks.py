"""The planner's properties on one generated graph, checked independently
(shared by tests/memopt/test_fuzz_graph.py, which says what they are, and
scripts/fuzz_paddle.py --graphs).

:func:`plan_and_check` plans a :class:`strategies.GeneratedProgram` at a level
and GC mode and checks the plan (:func:`check_independently`, then runs the
original and the planned graph in :mod:`memopt.interpreter`);
:func:`release_and_check` does the same for release points.
"""
import copy
from dataclasses import replace

from memopt import interpreter
from memopt.graph import Block, Graph, Op, OpFacts
from memopt.liveness import analyze_graph
from memopt.plan import Options
from memopt.planner import plan_memory
from memopt.problems import Buffer
from memopt.release import plan_releases, verify_releases
from memopt.simulate import check_groups
from memopt.verify import check_plan

from strategies import GeneratedProgram


class _Grouping:
    def __init__(self, groups):
        self.groups = groups
        self.group_of = {b.id: k for k, group in enumerate(groups) for b in group}


def _uses(graph: Graph):
    """For every name: the blocks whose ops use it, and whether a control op does."""
    blocks, control = {}, set()
    for block in graph.blocks:
        for op in block.ops:
            for name in (*op.reads, *op.writes):
                blocks.setdefault(name, set()).add(block.idx)
            if op.sub_blocks:
                control.update(op.reads, op.writes)
    return blocks, control


def check_independently(graph: Graph, plan, options: Options) -> None:
    """The plan's rules, checked from the graph without the planner's code."""
    blocks, control = _uses(graph)
    homes = {}
    for idx, var in graph.all_vars():
        homes.setdefault(var.name, []).append(idx)
    fetched = set(graph.fetch_names)
    loss = {n for b in graph.blocks for op in b.ops if op.facts.loss for n in op.writes}
    grads = {n for b in graph.blocks for op in b.ops if op.role == "backward" for n in op.writes}

    def may_share(name: str, block_idx: int) -> None:
        assert homes.get(name) == [block_idx], f"{name!r} is not declared only in block {block_idx}"
        var = graph.blocks[block_idx].vars[name]
        assert var.is_dense, f"{name!r} ({var.kind}) shares memory"
        assert not (var.persistable or var.is_feed or var.is_data or var.is_fetch), name
        assert name not in options.skip_opt_set, f"{name!r} is in skip_opt_set"
        assert name not in fetched and name not in loss, name
        if options.skip_grads:
            assert "@GRAD" not in name and name not in grads, f"gradient {name!r}"
        assert blocks.get(name) == {block_idx}, f"{name!r} is used in blocks {blocks.get(name)}"
        assert name not in control, f"{name!r} is used by a control-flow op"

    for block_idx, mapping in plan.renames.items():
        for old, new in mapping.items():
            may_share(old, block_idx)
            may_share(new, block_idx)
            assert new not in mapping, f"{old!r} -> {new!r}, which is renamed again"

    live = analyze_graph(graph)
    intervals = live.intervals()
    outside = live.live_in(0) if live.positions else frozenset()
    merged = {n for m in plan.renames.values() for pair in m.items() for n in pair}
    assert not merged & outside, f"values from outside merged: {sorted(merged & outside)}"
    handover = {src: pos for src, _, pos in plan.inplace}
    buffers, grouped = {}, set()
    for name, interval in intervals.items():
        var = graph.find_var(name) or next(
            (b.vars[name] for b in graph.blocks if name in b.vars), None)
        if var is None or not var.is_dense or var.persistable or var.size.coefficient == 0:
            continue
        lower, upper = interval.half_open
        if name in handover:
            # the in-place op reads its source before it writes the output there
            assert interval.end == handover[name], (name, interval, handover[name])
            if handover[name] > lower:
                upper = handover[name]
        size = var.size
        buffers[name] = Buffer(name, lower, upper, size if size.power else size.coefficient)
    groups = []
    for group in plan.groups:
        assert len(group) >= 2
        owner = group[0]
        for name in group[1:]:
            assert any(m.get(name) == owner for m in plan.renames.values()), (name, owner)
        groups.append([buffers[n] for n in group])
        grouped.update(group)
    groups += [[b] for n, b in buffers.items() if n not in grouped]

    var_of = {n: graph.find_var(n) or next(b.vars[n] for b in graph.blocks if n in b.vars)
              for n in buffers}

    def compatible(a, b):
        # both levels keep dtypes (Paddle's executor reads declared dtypes);
        # level 0 keeps shapes too
        va, vb = var_of[a.id], var_of[b.id]
        return va.dtype == vb.dtype and (options.level == 1 or tuple(va.shape) == tuple(vb.shape))

    def fits(member, first):
        return var_of[member.id].size.provably_le(var_of[first.id].size)

    # in-place sources that hand over where they start cannot be trimmed: their
    # single step is shared with the output by definition of running in place
    trimmed = [b for b in buffers.values()
               if not (b.id in handover and handover[b.id] <= b.lower)]
    keep = {b.id for b in trimmed}
    check_groups(trimmed, _Grouping([[b for b in g if b.id in keep] for g in groups
                                     if any(b.id in keep for b in g)]),
                 compatible=compatible, fits=fits if options.level == 1 else None)
    if plan.gc:
        assert all(r.how == "in-place" for r in plan.reuses), "GC on: renaming planned"


def planned_graph(graph: Graph, plan) -> Graph:
    """The graph the plan's renames apply to: block 0's ops in ``plan.order``
    (the planner may move optimizer ops up), everything else shared."""
    order = getattr(plan, "order", None)
    assert not getattr(plan, "substitutions", None), "no dims-only reads were generated"
    if order is None:
        return graph
    ops = graph.blocks[0].ops
    assert sorted(order) == list(range(len(ops))), "plan.order is not a permutation"
    for k, i in enumerate(order):
        if i > k:  # moved up
            assert ops[i].role == "optimize" and not ops[i].sub_blocks, \
                f"op {i} ({ops[i].type}, {ops[i].role}) moved up"
    b0 = graph.blocks[0]
    block0 = Block(0, b0.parent, [ops[i] for i in order], b0.vars)
    return Graph(blocks=[block0, *graph.blocks[1:]], fetch_names=graph.fetch_names)


def plan_and_check(program: GeneratedProgram, level: int, gc: bool):
    graph = program.graph
    options = Options(program.skip_opt_set, program.skip_grads, level)
    before = copy.deepcopy(graph)
    plan = plan_memory(graph, options, gc)
    assert graph == before, "plan_memory changed its input graph"
    check_plan(graph, plan)
    planned = planned_graph(graph, plan)
    check_independently(planned, plan, options)
    diff = interpreter.compare(graph, plan.renames, planned=planned)
    assert diff is None, f"level {level}, gc {gc}: {diff}\nrenames: {plan.renames}"
    return plan


def rewritten(graph: Graph, renames) -> Graph:
    """``graph`` with every use renamed as ``renames`` says: the program the
    adapter writes (names, not storage slots, are shared)."""
    def new_name(name: str, block_idx: int) -> str:
        return renames.get(graph.home_of(name, block_idx), {}).get(name, name)

    blocks = []
    for block in graph.blocks:
        ops = [replace(op, reads=tuple(new_name(n, block.idx) for n in op.reads),
                       writes=tuple(new_name(n, block.idx) for n in op.writes))
               for op in block.ops]
        blocks.append(Block(block.idx, block.parent, ops, block.vars))
    return Graph(blocks=blocks, fetch_names=graph.fetch_names)


def with_releases(graph: Graph, after) -> Graph:
    """``graph`` with a release op right after block 0's op ``i`` for each
    ``after[i]`` (the ops keep their identities)."""
    ops = []
    for index, op in enumerate(graph.blocks[0].ops):
        ops.append(op)
        if after.get(index):
            ops.append(Op("share_buffer", (), (), facts=OpFacts(release=tuple(after[index]))))
    b0 = graph.blocks[0]
    return Graph(blocks=[Block(0, b0.parent, ops, b0.vars), *graph.blocks[1:]],
                 fetch_names=graph.fetch_names)


def release_and_check(program: GeneratedProgram, level=None) -> int:
    """Plan releases (after memory_optimize at ``level``, GC off; None: on the
    program as it is), check them, run them; returns how many."""
    graph, renames, planned = program.graph, {}, program.graph
    if level is not None:
        plan = plan_memory(graph, Options(program.skip_opt_set, program.skip_grads, level),
                           gc=False)
        renames, planned = plan.renames, planned_graph(graph, plan)
    subject = rewritten(planned, renames)
    before = copy.deepcopy(subject)
    releases = plan_releases(subject, program.skip_opt_set)
    assert subject == before, "plan_releases changed its input graph"
    verify_releases(subject, releases.after)
    diff = interpreter.compare(graph, {}, planned=with_releases(subject, releases.after))
    assert diff is None, f"level {level}: {diff}\nreleases: {releases.after}"
    return len(releases.released)
