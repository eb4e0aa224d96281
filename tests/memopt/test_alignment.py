"""memopt.alignment: a rewritten program drawn on the original's op positions.

Bare graphs (NumPy only): ops identified by ``attrs["pir_id"]`` /
``attrs["origin"]`` and, without one, by the sequence of their types; added
ops fold into the x of the op before them; the rewritten program's peak is
kept.  The Paddle test checks memory_optimize and release_memory on real
programs: the rewritten program's peak lands on the x of the same op.
"""

from test_analysis import chain_graph

from memopt import analyze
from memopt.alignment import align, match, run_ops
from memopt.analysis import RuntimeModel
from memopt.graph import Graph, Op, Var

PROGRAM_ORDER = RuntimeModel(inplace=False, schedule="program")


def _with_ids(g: Graph, key: str = "pir_id") -> Graph:
    for k, op in enumerate(g.global_block.ops):
        op.attrs = {**(op.attrs or {}), key: 100 + k}
    return g


def _bookkeeping(g: Graph, at: int, name: str = "rec") -> Graph:
    """``g`` with an op that writes a small record inserted at ``at`` (what
    memopt's record of a rewrite adds), no identity of its own."""
    g.global_block.add_var(Var(name, (2,)))
    g.global_block.ops.insert(at, Op("pd_op.full", (), (name,)))
    return g


def test_inserted_ops_keep_the_original_positions():
    before = analyze(_with_ids(chain_graph()), 2, runtime=PROGRAM_ORDER)
    after_graph = _bookkeeping(_bookkeeping(_with_ids(chain_graph()), 0, "r0"), 3, "r1")
    after = analyze(after_graph, 2, runtime=PROGRAM_ORDER)
    assert after.op_types == ["pd_op.full", "matmul", "relu", "pd_op.full", "reduce",
                              "scale", "sum"]
    assert match(before, after) == [None, 0, 1, None, 2, 3, 4]
    a = align(before, after, 2)
    # added ops: at the x of the op before them (the first: at the next op's x)
    assert a.xs == [0, 0, 1, 1, 2, 3, 4]
    assert a.added == [True, False, False, True, False, False, False]
    # the peak: same op, same x, though two positions later in the rewritten run
    assert before.peak_position(2) == 3 and after.peak_position(2) == 5
    assert a.xs[after.peak_position(2)] == before.peak_position(2)
    line = after.timeline(2)
    assert [line[j] for j in a.shown] == [max(line[0], line[1]), max(line[2], line[3]),
                                          line[4], line[5], line[6]]
    assert max(line[j] for j in a.shown) == after.peak(2)


def test_without_identities_types_are_aligned():
    """A bare graph (or a legacy translation's declarations) has no ids: the
    longest common sequence of op types pairs them."""
    before = analyze(chain_graph(), 1, runtime=PROGRAM_ORDER)
    after = analyze(_bookkeeping(chain_graph(), 2), 1, runtime=PROGRAM_ORDER)
    assert match(before, after) == [0, 1, None, 2, 3, 4]
    assert align(before, after).xs == [0, 1, 1, 2, 3, 4]


def test_in_place_variant_pairs_with_the_op_it_replaced():
    """memory_optimize turns ``relu`` into ``relu_``: a new op (new id) in
    its place; left over on both sides, the two pair by type."""
    before = analyze(_with_ids(chain_graph()), 1, runtime=PROGRAM_ORDER)
    g = _with_ids(chain_graph())
    relu = g.global_block.ops[1]
    relu.type, relu.attrs = "relu_", {"pir_id": 999}
    after = analyze(g, 1, runtime=PROGRAM_ORDER)
    assert match(before, after) == [0, 1, 2, 3, 4]
    assert not any(align(before, after).added)


def test_reordered_ops_follow_their_identity():
    """Level 2 moves ops: each is drawn at its own op's x (the live bytes
    while that op runs), whatever its new run position."""
    before = analyze(_with_ids(chain_graph(), "origin"), 1, runtime=PROGRAM_ORDER)
    g = _with_ids(chain_graph(), "origin")
    ops = g.global_block.ops
    ops[2], ops[3] = ops[3], ops[2]  # scale before reduce: both read b only
    after = analyze(g, 1, runtime=PROGRAM_ORDER)
    assert after.op_types == ["matmul", "relu", "scale", "reduce", "sum"]
    assert match(before, after) == [0, 1, 3, 2, 4]
    a = align(before, after)
    assert a.shown == [0, 1, 3, 2, 4]
    assert run_ops(after)[a.shown[2]].type == "reduce"


def test_one_origin_many_ops_are_matched_in_order():
    """A legacy op translated into several PIR ops: the k-th of an origin
    matches the k-th."""
    def two_of_one(extra: bool) -> Graph:
        g = chain_graph()
        for k, op in enumerate(g.global_block.ops):
            op.attrs = {"origin": "legacy op 7" if k in (1, 2) else f"legacy op {k}"}
        return _bookkeeping(g, 2) if extra else g

    before = analyze(two_of_one(False), 1, runtime=PROGRAM_ORDER)
    after = analyze(two_of_one(True), 1, runtime=PROGRAM_ORDER)
    assert match(before, after) == [0, 1, None, 2, 3, 4]


def test_paddle_rewrites_keep_the_peak_on_its_op(paddle):
    """PIR memory_optimize adds two bookkeeping ops (the peak was "op 83"
    before and "op 85" after, one curve); legacy release_memory adds a
    release op per freed variable (the curve ran to op 132 of 87): on the
    original positions the peak stays on its op and every x is drawn."""
    import memopt
    from memopt.testing.models import build, flags

    m = build("cnn", "pir", 32)
    with m.guard():
        before = analyze(m.main, 32, fetch_list=m.fetch_list[:1])
        memopt.memory_optimize(m.main, level=1, fetch_list=m.fetch_list[:1])
        after = analyze(m.main, 32, fetch_list=m.fetch_list[:1])
    assert len(after.op_types) > len(before.op_types)
    a = align(before, after, 32)
    assert len(a.shown) == len(before.op_types)
    assert a.xs[after.peak_position()] == before.peak_position()
    assert sum(a.added) == len(after.op_types) - len(before.op_types)
    with flags(eager_delete_tensor_gb=-1.0):
        m = build("cnn", "legacy", 32)
        with m.guard():
            before = analyze(m.main, 32, fetch_list=[m.loss])
            memopt.release_memory(m.main)
            freed = analyze(m.main, 32, fetch_list=[m.loss])
    a = align(before, freed, 32)
    assert len(freed.op_types) > len(before.op_types) + 20
    added = [t for t, is_added in zip(freed.op_types, a.added, strict=True) if is_added]
    # the release ops (and the empty variable they take their buffer from), nothing else
    assert added.count("pd_op.share_data_") == freed.op_types.count("pd_op.share_data_") > 20
    assert set(added) == {"pd_op.share_data_", "pd_op.data"} and added.count("pd_op.data") == 1
    line = freed.timeline(32)
    assert max(line[j] for j in a.shown) == freed.peak(32) < before.peak(32)


def test_reports_keep_the_analyses_of_before_and_after(paddle):
    """Report.to_html draws report.analyses: the program before the whole
    rewrite and after it, whose peaks are the report's own (here legacy
    budget=, whose inner level-1 rewrite must not leave its own before;
    this budget needs no recomputation: the small legacy models refuse the
    budgets that would, issue 34)."""
    import memopt
    from memopt.testing.models import build

    m = build("lstm", "legacy", 64)
    with m.guard():
        unchanged = analyze(m.main, 64, fetch_list=[m.loss])
        limit = int(unchanged.step_peak(64) * 1.2)
        report = memopt.memory_optimize(m.main, level=1, budget=limit, batch_size=64,
                                        fetch_list=[m.loss])
    before, after = report.analyses
    assert before.step_peak(64) == report.peak_before == unchanged.step_peak(64)
    assert after.step_peak(64) == report.peak_after
    assert len(before.op_types) == len(unchanged.op_types)
