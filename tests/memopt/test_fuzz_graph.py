"""Fuzzing the planner on random graphs: a plan never changes what a program computes.

For every program :func:`strategies.programs` draws, at both levels and in
both runtime modes (garbage collection on: in place only; off: renaming too),
:func:`memopt.planner.plan_memory` must give a plan that

- passes the planner's own checks (:func:`memopt.verify.check_plan`);
- passes an independent check written here on top of
  :func:`memopt.simulate.check_groups`: no two members of a group live at
  the same op position (an in-place source hands over at the op that kills
  it), groups share a dtype (level 0: and a shape), level 1 members provably
  fit the memory the group's earliest member allocates, and nothing that
  must keep its own memory (feeds, data, parameters, fetched, skipped,
  gradients with ``skip_grads``, non-dense, names used in two blocks or by
  control ops, values live at the entry) is renamed or renamed to;
- computes exactly what the original computes when executed by the
  reference interpreter (:mod:`memopt.interpreter`) with the plan's
  renames as the storage assignment: every value every op reads, the
  fetched values and the final parameters agree, for three input seeds;
- leaves the graph it was given unchanged.

And :func:`memopt.release.plan_releases`, on the program as memory_optimize
rewrites it (GC off, both levels) and on the program as it is: its points
pass :func:`memopt.release.verify_releases`, and the program with a release
at each point (the released variables' memory emptied there) computes
exactly what the original computes.
"""
import copy

import pytest
from hypothesis import HealthCheck, given, seed, settings

from memopt import interpreter
from memopt.errors import GraphError
from dataclasses import replace

from memopt.graph import Block, Graph, Op, Var
from memopt.liveness import analyze_graph
from memopt.plan import Options
from memopt.planner import plan_memory
from memopt.verify import check_plan
from memopt.problems import Buffer
from memopt.release import RELEASE_ATTR, plan_releases, verify_releases
from memopt.simulate import check_groups

from strategies import GeneratedProgram, format_graph, programs

FUZZ = settings(max_examples=250, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


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
    loss = {n for b in graph.blocks for op in b.ops if op.attrs.get("loss") for n in op.writes}
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


@FUZZ
@given(programs())
def test_every_plan_computes_what_the_original_computes(program):
    for level in (0, 1):
        for gc in (False, True):
            plan_and_check(program, level, gc)


@seed(20261121)
@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(unmarked_inputs=True))
def test_inputs_not_marked_as_data(program):
    """Inputs declared as plain variables (a legacy program read back from a
    file) hold values from outside: never merged (once a PlanError)."""
    for level in (0, 1):
        for gc in (False, True):
            plan_and_check(program, level, gc)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(max_ops=60, max_depth=3))
def test_bigger_nested_programs(program):
    for level in (0, 1):
        plan_and_check(program, level, gc=False)


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
            ops.append(Op("share_buffer", (), (), attrs={RELEASE_ATTR: tuple(after[index])}))
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


@FUZZ
@given(programs())
def test_releases_never_change_what_a_program_computes(program):
    for level in (None, 0, 1):
        release_and_check(program, level)


def test_the_fuzzer_finds_releases_and_the_interpreter_sees_an_early_one():
    """Over a fixed sample releases happen (with and without renames), and a
    release moved one op too early is caught by the run."""
    seen = {"plain": 0, "renamed": 0, "caught": 0}

    @seed(4242)
    @settings(max_examples=80, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs())
    def collect(program):
        seen["plain"] += release_and_check(program)
        seen["renamed"] += release_and_check(program, level=1)
        graph = program.graph
        releases = plan_releases(graph, program.skip_opt_set)
        for index, names in releases.after.items():
            last_reader = graph.blocks[0].ops[index]
            read = [n for n in names if n in last_reader.reads]
            if read:  # freed before the op that reads it last
                early = with_releases(graph, {index - 1: (read[0],)}) if index else None
                if early is not None and interpreter.compare(graph, {}, planned=early):
                    seen["caught"] += 1
                break

    collect()
    assert all(seen.values()), seen


def test_the_fuzzer_finds_reuse():
    """The generator is not so timid that plans are empty: over a fixed
    sample, renaming (both levels), in-place reuse, reuse inside sub-blocks
    and moved optimizer ops all happen."""
    seen = {"rename0": 0, "rename1": 0, "inplace": 0, "loop_local": 0, "reordered": 0}

    @seed(12345)
    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs())
    def collect(program):
        for level in (0, 1):
            plan = plan_and_check(program, level, gc=False)
            if any(r.how == "rename" for r in plan.reuses):
                seen[f"rename{level}"] += 1
            if plan.inplace:
                seen["inplace"] += 1
            if any(b for b in plan.renames if b != 0):
                seen["loop_local"] += 1
            if getattr(plan, "order", None) is not None:
                seen["reordered"] += 1

    collect()
    assert all(count >= 3 for count in seen.values()), seen


# -- the interpreter itself: it must see a clobbered value --------------------------

def _chain_graph():
    g = Graph()
    b = g.global_block
    for name in ("x", "a", "b", "c", "out"):
        b.add_var(Var(name, (4,), "float32", is_feed=name == "x", is_fetch=name == "out"))
    b.add_op(Op("relu", ("x",), ("a",)))
    b.add_op(Op("scale", ("x",), ("b",)))
    b.add_op(Op("elementwise_add", ("a", "b"), ("c",)))
    b.add_op(Op("relu", ("c",), ("out",)))
    g.fetch_names = ("out",)
    return g


def test_interpreter_detects_a_clobbered_value():
    g = _chain_graph()
    assert interpreter.compare(g, {}) is None
    # b overwrites a while a is still needed by the add
    diff = interpreter.compare(g, {0: {"b": "a"}})
    assert diff is not None and "'a'" in str(diff) and "elementwise_add" in str(diff)


def test_interpreter_poisons_an_output_sharing_a_non_inplace_input():
    g = _chain_graph()
    # c takes a's memory at the add, which also reads b: a kernel that is not
    # declared in place may write c before reading a
    diff = interpreter.compare(g, {0: {"c": "a"}})
    assert diff is not None
    g.blocks[0].ops[2].attrs["inplace"] = ("a", "c")
    assert interpreter.compare(g, {0: {"c": "a"}}) is None


def test_interpreter_runs_loops_by_their_counter():
    g = Graph()
    b0 = g.global_block
    for name in ("i", "n", "c"):
        b0.add_var(Var(name, (1,), "int64"))
    b0.add_var(Var("s", (2,), "float32", is_fetch=True))
    body = g.new_block(0)
    b0.add_op(Op("fill_constant", (), ("i",), attrs={"value": 0}))
    b0.add_op(Op("fill_constant", (), ("n",), attrs={"value": 5}))
    b0.add_op(Op("fill_constant", (), ("s",), attrs={"value": 7}))
    b0.add_op(Op("less_than", ("i", "n"), ("c",)))
    b0.add_op(Op("while", ("c", "s", "i", "n"), ("s", "i", "c"), sub_blocks=(1,), loop=True,
                 attrs={"cond": "c", "max_trips": 10}))
    body.add_op(Op("mix", ("s",), ("s",)))
    body.add_op(Op("increment", ("i",), ("i",)))
    body.add_op(Op("less_than", ("i", "n"), ("c",)))
    g.fetch_names = ("s",)
    result = interpreter.run(g)
    assert [t[:2] for t in result.trace].count((1, 0)) == 5  # the body ran 5 times
    s = 7
    for _ in range(5):
        s = interpreter.mix(interpreter.mix(1, 0, interpreter._text_value("mix")), 0, s)
    assert result.fetched == {"s": s}


def test_interpreter_rejects_an_undeclared_name():
    g = _chain_graph()
    g.blocks[0].ops.append(Op("relu", ("ghost",), ("out",)))
    with pytest.raises(GraphError, match="ghost"):
        interpreter.run(g)


def test_format_graph_shows_blocks():
    text = format_graph(_chain_graph())
    assert "c = elementwise_add(a, b)" in text and "fetch: ['out']" in text
