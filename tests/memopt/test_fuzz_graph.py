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
import pytest
from hypothesis import HealthCheck, given, seed, settings

from memopt import interpreter
from memopt.errors import GraphError
from memopt.graph import Graph, Op, Var
from memopt.release import plan_releases

from graph_checks import plan_and_check, release_and_check, with_releases
from strategies import format_graph, programs

FUZZ = settings(max_examples=250, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])












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
    g.blocks[0].ops[2].facts.inplace = ("a", "c")
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
