"""The memory_optimize planner on hand-made graphs (no Paddle needed).

Small programs whose right answer is known: what is a candidate, what runs
in place, what a loop keeps alive, and that the checks reject broken plans.
"""
import pytest
from hypothesis import given, settings, strategies as st

from memopt.errors import PlanError
from memopt.graph import Graph, Op, OpFacts, Var
from memopt.api import resolve_options
from memopt.plan import Options
from memopt.planner import plan_memory
from memopt.reuse import best_fit_groups
from memopt.schedule import schedule_optimizer_ops
from memopt.verify import check_plan, verify_order, verify_renaming
from memopt.problems import Buffer

ALL = Options(skip_grads=False, level=1)


def chain(n=4, shape=(-1, 8), inplace=False):
    """x -> t0 -> t1 -> ... -> t{n-1} -> loss, each op reading the last."""
    g = Graph(fetch_names=())
    b = g.global_block
    b.add_var(Var("x", shape, is_data=True))
    names = [f"t{i}" for i in range(n)]
    for name in names:
        b.add_var(Var(name, shape))
    b.add_var(Var("loss", ()))
    prev = "x"
    for name in names:
        facts = OpFacts(inplace=(prev, name) if inplace else None)
        b.add_op(Op("relu", (prev,), (name,), facts=facts))
        prev = name
    b.add_op(Op("mean", (prev,), ("loss",), facts=OpFacts(loss=True)))
    return g


def test_chain_gc_off_alternates_two_buffers():
    plan = plan_memory(chain(6), ALL, gc=False)
    check_plan(chain(6), plan)
    assert plan.renames[0] == {"t2": "t0", "t4": "t0", "t3": "t1", "t5": "t1"}
    assert all(r.how == "rename" for r in plan.reuses)


def test_chain_gc_on_plans_nothing_without_inplace():
    plan = plan_memory(chain(6), ALL, gc=True)
    assert plan.renames == {} and plan.reuses == []


def test_inplace_chain():
    g = chain(4, inplace=True)
    plan = plan_memory(g, ALL, gc=True)
    check_plan(g, plan)
    # x is data (never merged); t0 -> t1 -> t2 -> t3 in place
    assert plan.renames[0] == {"t1": "t0", "t2": "t0", "t3": "t0"}
    assert [r.how for r in plan.reuses] == ["in-place"] * 3
    assert [(s, d) for s, d, _ in plan.inplace] == [("t0", "t1"), ("t1", "t2"), ("t2", "t3")]


def test_candidates_and_reasons():
    g = chain(3)
    b = g.global_block
    b.add_var(Var("w", (8, 8), persistable=True))
    b.add_var(Var("t0@GRAD", (-1, 8)))
    b.add_var(Var("unread", (-1, 8)))
    b.add_op(Op("fill", (), ("t0@GRAD",), role="backward"))
    b.add_op(Op("scale", ("t0@GRAD", "w"), ("unread",), role="backward"))
    plan = plan_memory(g, Options(skip_opt_set=frozenset({"t1"}), skip_grads=True), gc=False)
    assert plan.reasons == {
        "feed/fetch/data": 1,
        "persistable": 1,
        "skip_opt_set": 1,
        "gradient (skip_grads=True)": 2,  # t0@GRAD by name, unread written by backward
        "likely fetched (loss, never read, or fetch op input)": 1,
    }
    merged = {n for grp in plan.groups for n in grp}
    assert merged <= {"t0", "t2"}


def test_level0_needs_equal_shapes_level1_needs_provable_fit():
    g = Graph()
    b = g.global_block
    b.add_var(Var("x", (-1, 8), is_data=True))
    b.add_var(Var("big", (-1, 16)))
    b.add_var(Var("small", (-1, 4)))
    b.add_var(Var("fixed", (1000,)))
    b.add_var(Var("out", ()))
    b.add_op(Op("a", ("x",), ("big",)))
    b.add_op(Op("b", ("big",), ("small",)))      # big dies here
    b.add_op(Op("c", ("small",), ("fixed",)))    # small dies here
    b.add_op(Op("d", ("fixed",), ("out",), facts=OpFacts(loss=True)))
    assert plan_memory(g, Options(skip_grads=False, level=0), gc=False).groups == []
    plan = plan_memory(g, ALL, gc=False)
    # small (16 B * B) fits in big (64 B * B); fixed 4000 B does not fit
    # 64 B * B for every B >= 1, nor does anything fit in fixed
    assert plan.groups == []  # big and small overlap at op b
    g.global_block.ops.insert(2, Op("e", ("small",), ("small2",)))
    g.global_block.add_var(Var("small2", (-1, 2)))
    g.global_block.ops[3] = Op("c", ("small2",), ("fixed",))
    plan = plan_memory(g, ALL, gc=False)
    check_plan(g, plan)
    assert plan.groups == [["big", "small2"]]


@pytest.mark.parametrize("small_problem", [200, 0])
def test_level1_never_shares_across_dtypes(monkeypatch, small_problem):
    """Paddle's executor reads declared dtypes: an int64 [-1] that provably
    fits a dead float32 [-1, 4] still may not take its name, in either
    grouping (the exact one and the O(n log n) sweep)."""
    g = Graph()
    b = g.global_block
    b.add_var(Var("x", (-1, 4), is_data=True))
    b.add_var(Var("big", (-1, 4), "float32"))
    b.add_var(Var("mid", (-1, 4), "float32"))
    b.add_var(Var("idx", (-1,), "int64"))
    b.add_var(Var("out", ()))
    b.add_op(Op("relu", ("x",), ("big",)))
    b.add_op(Op("relu", ("big",), ("mid",)))     # big dies here
    b.add_op(Op("argmax", ("mid",), ("idx",)))   # mid dies here
    b.add_op(Op("mean", ("idx",), ("out",), facts=OpFacts(loss=True)))
    monkeypatch.setattr("memopt.reuse.SMALL_PROBLEM", small_problem)
    plan = plan_memory(g, ALL, gc=False)
    check_plan(g, plan)
    assert plan.groups == []
    g.global_block.vars["idx"] = Var("idx", (-1,), "float32")
    assert plan_memory(g, ALL, gc=False).groups == [["big", "idx"]]


def loop_graph(carried_local: bool):
    """A while loop whose body writes h and, optionally, reads a local c
    before writing it (c is carried to the next iteration)."""
    g = Graph()
    b0 = g.global_block
    for name in ("x", "h", "cond"):
        b0.add_var(Var(name, (-1, 8), is_data=(name == "x")))
    b0.add_var(Var("out", ()))
    body = g.new_block(0)
    for name in ("a", "c", "d"):
        body.add_var(Var(name, (-1, 8)))
    b0.add_op(Op("assign", ("x",), ("h",)))
    b0.add_op(Op("while", ("h", "cond"), ("h",), sub_blocks=(body.idx,), loop=True))
    if carried_local:
        body.add_op(Op("relu", ("c",), ("a",)))      # reads last iteration's c
    else:
        body.add_op(Op("relu", ("h",), ("a",)))
    body.add_op(Op("scale", ("a",), ("d",)))
    body.add_op(Op("relu", ("d",), ("c",)))
    body.add_op(Op("add", ("c", "h"), ("h",)))
    b0.add_op(Op("mean", ("h",), ("out",), facts=OpFacts(loss=True)))
    return g


def test_loop_locals_share_within_an_iteration():
    g = loop_graph(carried_local=False)
    plan = plan_memory(g, ALL, gc=False)
    check_plan(g, plan)
    assert plan.renames == {1: {"c": "a"}}
    assert "h" not in {n for grp in plan.groups for n in grp}, "shared with the loop op"


def test_value_read_in_next_iteration_is_live_across_the_loop():
    g = loop_graph(carried_local=True)
    plan = plan_memory(g, ALL, gc=False)
    check_plan(g, plan)
    assert "c" not in {n for grp in plan.groups for n in grp}


def test_verify_renaming_rejects_a_carried_value():
    g = loop_graph(carried_local=True)
    with pytest.raises(PlanError, match="reads 'c'"):
        verify_renaming(g, {1: {"c": "d"}})


def test_verify_renaming_rejects_overlap_and_bad_inplace():
    g = chain(4)
    with pytest.raises(PlanError, match="may not run in place"):
        verify_renaming(g, {0: {"t1": "t0"}})          # relu(t0) -> t0, not declared
    verify_renaming(g, {0: {"t1": "t0"}}, [("t0", "t1", 1)])  # declared in place: fine
    verify_renaming(g, {0: {"t2": "t0"}})  # t0 dies at op 1, t2 born at op 2: fine
    g.global_block.add_var(Var("late", (-1, 8)))
    g.global_block.add_op(Op("add", ("t0", "t3"), ("late",)))  # t0 now lives to the end
    with pytest.raises(PlanError, match="reads 't0', but after renaming 't0' holds 't2'"):
        verify_renaming(g, {0: {"t2": "t0"}})
    with pytest.raises(PlanError, match="holds 't3'"):
        verify_renaming(g, {0: {"t3": "t0"}})


def test_skip_opt_set_validation():
    assert resolve_options(["a", "b"]).skip_opt_set == frozenset({"a", "b"})
    assert resolve_options(("a",), level=1).level == 1
    with pytest.raises(TypeError, match="not a tuple"):
        resolve_options("fc")


@st.composite
def interval_buffers(draw):
    n = draw(st.integers(1, 40))
    out = []
    for i in range(n):
        lower = draw(st.integers(0, 30))
        upper = lower + draw(st.integers(1, 10))
        power = draw(st.integers(0, 1))
        coef = draw(st.integers(1, 64)) * 4
        from memopt.graph import Size

        out.append(Buffer(f"b{i}", lower, upper, Size(coef, power)))
    return out


@settings(max_examples=150, deadline=None)
@given(interval_buffers(), st.integers(1, 3))
def test_best_fit_groups_are_valid(buffers, classes):
    from memopt.graph import Size
    from memopt.simulate import check_groups

    klass = {b.id: hash(b.id) % classes for b in buffers}
    groups = best_fit_groups(buffers, lambda b: klass[b.id])

    class Plan:
        pass

    plan = Plan()
    plan.groups = groups
    plan.group_of = {b.id: k for k, grp in enumerate(groups) for b in grp}

    def as_size(s):
        return s if isinstance(s, Size) else Size(s, 0)

    check_groups(buffers, plan,
                 compatible=lambda a, b: klass[a.id] == klass[b.id],
                 fits=lambda m, f: as_size(m.size).provably_le(as_size(f.size)))


def training_graph():
    """fwd: h = x*w1; y = h*w2; loss.  bwd: dy, dw2 (reads h), dh, dw1.
    opt: sgd(w1), sgd(w2) at the end."""
    g = Graph()
    b = g.global_block
    for name in ("x", "h", "y", "loss", "dy", "dh", "dw1", "dw2"):
        b.add_var(Var(name, (-1, 4) if name not in ("dw1", "dw2", "loss") else (4, 4),
                      is_data=(name == "x")))
    for name in ("w1", "w2", "lr"):
        b.add_var(Var(name, (4, 4), persistable=True))
    b.add_op(Op("mul", ("x", "w1"), ("h",)))
    b.add_op(Op("mul", ("h", "w2"), ("y",)))
    b.add_op(Op("mean", ("y",), ("loss",), facts=OpFacts(loss=True)))
    b.add_op(Op("fill", (), ("dy",), role="backward"))
    b.add_op(Op("mul_grad", ("dy", "h", "w2"), ("dh", "dw2"), role="backward"))
    b.add_op(Op("mul_grad", ("dh", "x", "w1"), ("dw1",), role="backward"))
    b.add_op(Op("sgd", ("w1", "dw1", "lr"), ("w1",), role="optimize"))
    b.add_op(Op("sgd", ("w2", "dw2", "lr"), ("w2",), role="optimize"))
    return g


def test_optimizer_ops_move_up_to_their_gradient():
    g = training_graph()
    order = schedule_optimizer_ops(g)
    types = [g.global_block.ops[i].type + ":" + ",".join(g.global_block.ops[i].reads[:2])
             for i in order]
    # sgd(w2) right after the op that writes dw2 (and last reads w2)
    assert order == [0, 1, 2, 3, 4, 7, 5, 6], types
    verify_order(g, order)
    plan = plan_memory(g, ALL, gc=False)
    assert plan.order == order and plan.moved == 1
    # with GC on the multi-thread executor picks its own order: ops stay put
    assert plan_memory(g, ALL, gc=True).order is None


def test_verify_order_rejects_broken_dependencies():
    g = training_graph()
    with pytest.raises(PlanError, match="reads 'dw2'"):
        verify_order(g, [0, 1, 2, 3, 7, 4, 5, 6])     # sgd(w2) before dw2 exists
    war = Graph()
    war.global_block.add_var(Var("w", (4,), persistable=True))
    war.global_block.add_var(Var("t", (4,)))
    war.global_block.add_op(Op("scale", ("w",), ("t",)))
    war.global_block.add_op(Op("sgd", ("w",), ("w",), role="optimize"))
    with pytest.raises(PlanError, match="writes 'w' and would move above op 0"):
        verify_order(war, [1, 0])
    with pytest.raises(PlanError, match="permutation"):
        verify_order(g, [0, 1, 2])


def test_no_optimizer_no_reorder():
    assert schedule_optimizer_ops(chain(3)) is None


def test_straight_line_liveness_matches_the_core():
    from memopt.liveness import analyze_graph
    from memopt.liveness import StraightLine

    for g in (chain(5), training_graph()):
        g.fetch_names = ("t1",) if "t1" in g.global_block.vars else ("h",)
        fast, core = StraightLine(g).intervals(), analyze_graph(g).intervals()
        assert {n: (i.start, i.end) for n, i in fast.items()} == \
            {n: (i.start, i.end) for n, i in core.items()}
        assert all(fast[n].half_open == core[n].half_open for n in core)


def test_gc_on_never_moves_ops():
    """An optimizer op writing a big temporary, hoisted to the top, would keep
    it alive through the peak; with GC on ops never move (memopt.any_order),
    so the plan cannot raise the estimate."""
    g = chain(4)
    b = g.global_block
    b.add_var(Var("big", (-1, 1024)))
    b.add_var(Var("w", (8,), persistable=True))
    b.ops.insert(len(b.ops) - 1, Op("make_big", (), ("big",), role="optimize"))
    b.ops.insert(len(b.ops) - 1, Op("sgd", ("w", "big"), ("w",), role="optimize"))
    b.ops[-1] = Op("mean", ("t3", "big"), ("loss",), facts=OpFacts(loss=True))
    assert schedule_optimizer_ops(g) is not None
    plan = plan_memory(g, ALL, gc=True)
    assert plan.order is None and plan.renames == {} and plan.moved == 0
    assert plan.estimates[1] == plan.estimates[0]


def test_substitutions_are_checked():
    from memopt.verify import verify_substitutions

    g = training_graph()
    verify_substitutions(g, [(0, 4, "X", "h", "dy")])    # both read by op 4, same shape
    with pytest.raises(PlanError, match="does not read both"):
        verify_substitutions(g, [(0, 4, "X", "x", "dy")])
    with pytest.raises(PlanError, match="different shape"):
        verify_substitutions(g, [(0, 4, "X", "h", "w2")])


@pytest.mark.parametrize("gc", [False, True])
def test_inplace_pair_skipped_when_the_op_also_writes_its_input_or_reads_its_output(gc):
    """A declared in-place pair (t0, t1) on an op that also writes t0, or
    also reads t1, does not run in place (renaming would make the op write,
    or read, one name twice); the plan still passes its checks."""
    for reads, writes in ((("t0",), ("t0", "t1")), (("t0", "t1"), ("t1",))):
        g = chain(4, inplace=True)
        ops = g.global_block.ops
        ops[1] = Op("my_op", reads, writes, facts=OpFacts(inplace=("t0", "t1")))
        plan = plan_memory(g, ALL, gc=gc)
        check_plan(g, plan)
        assert ("t0", "t1") not in {(s, d) for s, d, _ in plan.inplace}
        assert ("t2", "t3") in {(s, d) for s, d, _ in plan.inplace}


@pytest.mark.parametrize("gc", [False, True])
def test_a_variable_read_before_written_is_left_alone(gc):
    """An input that lost its is_data flag (read back from bytes) is live at
    the entry: never merged nor taken over in place."""
    g = chain(4, inplace=True)
    g.global_block.vars["x"] = Var("x", (-1, 8))
    plan = plan_memory(g, ALL, gc=gc)
    check_plan(g, plan)
    assert "x" not in {n for grp in plan.groups for n in grp}
    assert plan.reasons.get("live at entry (read before written: an input or a "
                            "loop-carried value)") == 1


def test_a_declaration_copy_in_a_block_that_no_longer_uses_it_shares_nothing():
    """The adapter copies a forward body's variable into the while_grad body
    that borrows it; once no op of that body uses it (a dims-only read was
    substituted), it is a local of the forward body like any other -- so a
    second memory_optimize pass finds nothing new."""
    def graph(copy: bool):
        g = loop_graph(carried_local=False)
        grad_body = g.new_block(0)
        grad_body.add_var(Var("g", (-1, 8)))
        if copy:
            grad_body.add_var(Var("c", (-1, 8)))  # the borrowed declaration, now unused
        grad_body.add_op(Op("relu", ("h",), ("g",)))
        g.global_block.ops.insert(2, Op("while_grad", ("h",), (), sub_blocks=(grad_body.idx,),
                                        loop=True))
        return g

    plans = [plan_memory(graph(copy), ALL, gc=False) for copy in (True, False)]
    check_plan(graph(True), plans[0])
    assert plans[0].renames == plans[1].renames == {1: {"c": "a"}}


# -- control flow: outputs of a conditional_block_grad, shadowing locals ------------

def cond_grad_graph():
    """Block 0: ``a`` dies before a ``conditional_block_grad``-like op that
    writes ``gx`` whole (``full_writes``) from its body's local ``gx`` (the
    body declares its own ``gx``: Paddle creates it in the body's scope) and
    reads ``gy`` back from the body (``sub_outputs``); ``use`` reads ``gx``
    after the op.  The body's ``t`` is a plain local."""
    g = Graph(fetch_names=("loss",))
    b0 = g.global_block
    for name in ("x", "a", "gx", "out", "loss"):
        b0.add_var(Var(name, (-1, 8), is_data=name == "x"))
    body = g.new_block(0)
    for name in ("t", "gx", "gy", "u"):
        body.add_var(Var(name, (-1, 8)))
    body.add_op(Op("relu", ("x",), ("t",)))
    body.add_op(Op("scale", ("t",), ("gx",)))
    body.add_op(Op("relu", ("x",), ("u",)))
    body.add_op(Op("scale", ("u",), ("gy",)))
    b0.add_op(Op("relu", ("x",), ("a",)))
    b0.add_op(Op("mean", ("a",), ("loss",), facts=OpFacts(loss=True)))
    b0.add_op(Op("conditional_block_grad", ("x",), ("gx",), sub_blocks=(body.idx,),
                 facts=OpFacts(full_writes=("gx",), sub_outputs=("gx", "gy"))))
    b0.add_op(Op("relu", ("gx",), ("out",)))
    b0.add_op(Op("mean", ("out",), ("loss",)))
    return g


def test_a_full_write_of_a_control_op_takes_memory_in_its_block():
    """``gx`` of block 0 is written whole by the op after its body ran: it
    may take the memory of ``a``, dead before the op (the body's own ``gx``
    is another variable); the body's plain locals share as usual."""
    g = cond_grad_graph()
    plan = plan_memory(g, ALL, gc=False)
    check_plan(g, plan)
    assert plan.groups == [["a", "gx"], ["t", "u"]]
    assert plan.renames == {0: {"gx": "a"}, 1: {"u": "t"}}


@pytest.mark.parametrize("gc", [False, True])
def test_a_body_gradient_read_back_by_its_op_is_never_merged(gc):
    """The body's ``gx`` and ``gy`` are read by the op after the body ran
    (its local gradients): neither is renamed nor given away, though no op
    of the body reads them."""
    g = cond_grad_graph()
    plan = plan_memory(g, ALL, gc=gc)
    check_plan(g, plan)
    body = plan.renames.get(1, {})
    assert {"gx", "gy"}.isdisjoint(set(body) | set(body.values()))
    assert not [grp for grp in plan.groups if "gy" in grp]


def test_a_control_output_read_by_the_op_or_written_twice_stays_alone():
    for mutate in ("read", "twice"):
        g = cond_grad_graph()
        ops = g.global_block.ops
        if mutate == "read":
            ops[2] = Op("conditional_block_grad", ("x", "gx"), ("gx",), sub_blocks=(1,),
                        facts=OpFacts(full_writes=("gx",), sub_outputs=("gx", "gy")))
        else:
            ops.insert(1, Op("relu", ("x",), ("gx",)))
        plan = plan_memory(g, ALL, gc=False)
        check_plan(g, plan)
        assert "gx" not in plan.renames.get(0, {}) and "gx" not in plan.renames.get(0, {}).values()


def test_without_full_writes_a_control_output_stays_alone():
    g = cond_grad_graph()
    g.global_block.ops[2].facts.full_writes = ()
    plan = plan_memory(g, ALL, gc=False)
    check_plan(g, plan)
    assert all("gx" not in grp for grp in plan.groups)


def test_a_rename_that_would_reach_into_a_sub_block_is_rejected():
    """The rewrite renames uses in one block only: a sub-block reading the
    renamed variable of its parent would read the wrong memory."""
    g = cond_grad_graph()
    plan = plan_memory(g, ALL, gc=False)
    with pytest.raises(PlanError, match="rename would not reach it"):
        verify_renaming(g, {0: {"x": "a"}})
    # a local of the body with the same name as the parent's is its own variable
    verify_renaming(g, {0: {"gx": "a"}})
    check_plan(g, plan)


def nested_loop_graph():
    """Depth 2: block 0 runs a branch (block 1) that runs a loop (block 2).
    In the loop body ``h`` is carried (read, then written from ``n``); ``p``
    and ``q`` are plain locals; in the branch ``b1``/``b2`` are locals."""
    g = Graph(fetch_names=("loss",))
    b0 = g.global_block
    for name in ("x", "c", "h", "loss"):
        b0.add_var(Var(name, (-1, 8), is_data=name == "x"))
    branch = g.new_block(0)
    for name in ("b1", "b2"):
        branch.add_var(Var(name, (-1, 8)))
    body = g.new_block(1)
    for name in ("p", "q", "n"):
        body.add_var(Var(name, (-1, 8)))
    b0.add_op(Op("relu", ("x",), ("h",)))
    b0.add_op(Op("fill_constant", (), ("c",), attrs={"value": 1}))
    b0.add_op(Op("conditional_block", ("c", "h"), ("h",), sub_blocks=(1,)))
    b0.add_op(Op("mean", ("h",), ("loss",), facts=OpFacts(loss=True)))
    branch.add_op(Op("relu", ("h",), ("b1",)))
    branch.add_op(Op("scale", ("b1",), ("b2",)))
    branch.add_op(Op("while", ("c", "h", "b2"), ("h",), sub_blocks=(2,), loop=True,
                     attrs={"max_trips": 3}))
    body.add_op(Op("relu", ("h",), ("p",)))
    body.add_op(Op("scale", ("p",), ("q",)))
    body.add_op(Op("elementwise_add", ("q", "b2"), ("n",)))
    body.add_op(Op("assign", ("n",), ("h",)))
    return g


@pytest.mark.parametrize("gc", [False, True])
def test_nested_loop_locals_merge_and_the_carried_value_does_not(gc):
    from memopt import interpreter

    g = nested_loop_graph()
    plan = plan_memory(g, ALL, gc=gc)
    check_plan(g, plan)
    merged = {n for grp in plan.groups for n in grp}
    assert "h" not in merged, "a value read in the next iteration is live across the loop"
    if not gc:
        assert {"p", "n"} <= merged and plan.renames.get(2), plan.groups
        assert {"b1", "b2"}.isdisjoint(merged)  # b2 is read in the loop: live through it
    assert interpreter.compare(g, plan.renames) is None
