"""memopt.recompute on hand-built graphs (no Paddle): which values are saved,
which may be recomputed, where clones go, and the budget choice."""
from memopt.graph import Block, Graph, Op, OpFacts, Var
from memopt.recompute import (CLONE_SUFFIX, Choice, RecomputePlan, candidates, make_plan,
                              plan_for_budget, problem_from_graph, rewrite_graph,
                              saved_values)


class _Rules:
    @staticmethod
    def flops(graph, op, batch):
        return 10 if op.type == "matmul" else 1

    @staticmethod
    def reason(op):
        return "random" if op.type == "dropout" else None


def _graph() -> Graph:
    """x -> a = relu(x) -> d = dropout(a) -> m = matmul(d, w) -> loss;
    backward reads a (relu_grad), d (matmul_grad) and m (shape only)."""
    vs = {n: Var(n, (-1, 256), "float32") for n in ("x", "a", "d", "m", "loss", "g_m", "g_d",
                                                    "g_a", "g_w")}
    vs["w"] = Var("w", (256, 256), "float32", persistable=True)
    vs["x"].is_data = True
    ops = [
        Op("relu", ("x",), ("a",)),
        Op("dropout", ("a",), ("d",)),
        Op("matmul", ("d", "w"), ("m",)),
        Op("mean", ("m",), ("loss",)),
        Op("mean_grad", ("m",), ("g_m",), role="backward", facts=OpFacts(no_need_buffer=("m",))),
        Op("matmul_grad", ("d", "w", "g_m"), ("g_d", "g_w"), role="backward"),
        Op("dropout_grad", ("g_d",), ("g_a",), role="backward"),
        Op("relu_grad", ("a", "g_a"), ("g_x",), role="backward"),
    ]
    vs["g_x"] = Var("g_x", (-1, 256), "float32")
    return Graph(blocks=[Block(0, -1, ops, vs)], fetch_names=("loss",))


def test_saved_values_and_candidates():
    problem = problem_from_graph(_graph(), 4, _Rules())
    saved = saved_values(problem)
    assert set(saved) == {"a", "d"}          # m is read for its shape only
    assert saved["a"] == [7] and saved["d"] == [5]
    assert candidates(problem) == ["a"]      # d is made by a random op


def test_clone_placed_before_first_data_read_and_reads_redirected():
    problem = problem_from_graph(_graph(), 4, _Rules())
    plan = make_plan(problem, ["a"])
    assert [(c.op, c.before) for c in plan.clones] == [(0, 7)]
    assert plan.flops == 1 and plan.step_flops == 3 * (1 + 1 + 10 + 1)
    graph, names = rewrite_graph(problem, plan)
    assert names == ["a" + CLONE_SUFFIX]
    ops = graph.blocks[0].ops
    relu_grad = ops[-1]
    assert relu_grad.type == "relu_grad" and relu_grad.reads[0] == "a" + CLONE_SUFFIX
    clone = ops[-2]
    assert clone.type == "relu" and clone.writes == ("a" + CLONE_SUFFIX,)
    assert ops[1].reads == ("a",)            # the forward still reads the original


def test_budget_choice_is_cheapest_fitting_and_monotone():
    plans = [RecomputePlan(flops=f) for f in (0, 5, 9, 20)]
    peaks = [100, 80, 85, 60]
    choices = [Choice(str(i), p, peak) for i, (p, peak) in enumerate(zip(plans, peaks))]
    assert plan_for_budget(choices, 100).label == "0"
    assert plan_for_budget(choices, 90).label == "1"
    assert plan_for_budget(choices, 59) is None
    chosen = [plan_for_budget(choices, b).peak for b in range(100, 59, -1)]
    assert chosen == sorted(chosen, reverse=True)


def test_clones_per_reader_group():
    """per_reader: a reader far from the first gets clones of its own."""
    problem = problem_from_graph(_graph(), 4, _Rules())
    plan = make_plan(problem, ["a"], per_reader=0)
    assert plan.readers == {7: {"a": "#7"}}
    assert [(c.op, c.before, c.tag) for c in plan.clones] == [(0, 7, "#7")]
    graph, names = rewrite_graph(problem, plan)
    assert names == ["a" + CLONE_SUFFIX + "#7"]
    assert graph.blocks[0].ops[-1].reads[0] == "a" + CLONE_SUFFIX + "#7"


def _held_graph(overwritten: bool) -> Graph:
    """x -> r = dropout(x) -> s = relu(r) -> t = exp(s) -> loss; backward
    reads s and t only (r dies in the forward part).  ``overwritten``: an
    in-place op writes over r after relu read it."""
    names = ("x", "r", "s", "t", "loss", "g_t", "g_s", "g_x", "r2")
    vs = {n: Var(n, (-1, 256), "float32") for n in names}
    vs["x"].is_data = True
    ops = [Op("dropout", ("x",), ("r",)), Op("relu", ("r",), ("s",))]
    if overwritten:
        ops.append(Op("scale_", ("r",), ("r2",), facts=OpFacts(overwrites=(("r", "r2"),))))
    ops += [Op("exp", ("s",), ("t",)), Op("mean", ("t",), ("loss",)),
            Op("exp_grad", ("t", "g_t"), ("g_s",), role="backward"),
            Op("relu_grad", ("s", "g_s"), ("g_x",), role="backward")]
    return Graph(blocks=[Block(0, -1, ops, vs)], fetch_names=("loss",))


def test_a_value_that_cannot_be_made_again_is_held_for_the_clone():
    """s's op reads r, made by a random op: s is still a candidate, its
    clone reading r itself (held alive), unless something writes over r."""
    problem = problem_from_graph(_held_graph(False), 4, _Rules())
    assert "s" in candidates(problem)
    plan = make_plan(problem, ["s"])
    assert [problem.ops[c.op].type for c in plan.clones] == ["relu"]
    graph, _ = rewrite_graph(problem, plan)
    clone = next(op for op in graph.blocks[0].ops if op.attrs.get("recompute_of") == 1
                 and op.type == "relu")
    # the original random draw (through the ordering op that holds the
    # clone back to the backward part), not a new one
    order = next(op for op in graph.blocks[0].ops if op.writes == clone.reads)
    assert order.reads[0] == "r" and order.facts.overwrites == (("r", clone.reads[0]),)
    # the dropout itself is never cloned
    assert [op.type for op in graph.blocks[0].ops].count("dropout") == 1
    problem = problem_from_graph(_held_graph(True), 4, _Rules())
    assert "s" not in candidates(problem)
