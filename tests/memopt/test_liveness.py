"""The liveness core on hand-built graphs whose answers are worked out by hand,
and against a naive set-based fixed point on random graphs."""
import pytest
from hypothesis import given, settings, strategies as st

from memopt.graph import Graph, Op, Var
from memopt.liveness import FlowNode, Interval, analyze, analyze_graph


def N(reads=(), writes=(), succ=()):
    return FlowNode(tuple(reads), tuple(writes), tuple(succ))


def test_straight_line():
    nodes = [N(writes="a", succ=[1]),
             N(reads="a", writes="b", succ=[2]),
             N(reads="ab", writes="c", succ=[3]),
             N(reads="c", writes="d")]
    live = analyze(nodes, live_at_exit=["d"])
    assert [set(live.live_in(i)) for i in range(4)] == [set(), {"a"}, {"a", "b"}, {"c"}]
    assert [set(live.live_out(i)) for i in range(4)] == [{"a"}, {"a", "b"}, {"c"}, {"d"}]
    assert live.intervals() == {"a": Interval(0, 2), "b": Interval(1, 2),
                                "c": Interval(2, 3), "d": Interval(3, 3)}


def test_diamond():
    nodes = [N(writes="xc", succ=[1, 2]),
             N(reads="x", writes="y", succ=[3]),
             N(reads="c", writes="y", succ=[3]),
             N(reads="y", writes="r")]
    live = analyze(nodes, live_at_exit=["r"])
    assert set(live.live_out(0)) == {"x", "c"}
    assert set(live.live_in(1)) == {"x"}
    assert set(live.live_in(2)) == {"c"}
    assert set(live.live_in(3)) == {"y"}
    assert set(live.live_in(0)) == set()
    # c is live out of node 0 and read at node 2: its hull covers node 1 too
    assert live.intervals() == {"x": Interval(0, 1), "c": Interval(0, 2),
                                "y": Interval(1, 3), "r": Interval(3, 3)}


def test_loop_with_loop_carried_variable():
    nodes = [N(writes="is", succ=[1]),                  # i = 0; s = 0
             N(reads="in", writes="k", succ=[2]),      # k = i < n
             N(reads="k", succ=[3, 6]),                # branch k
             N(reads="si", writes="t", succ=[4]),      # t = s + i
             N(reads="t", writes="s", succ=[5]),       # s = t
             N(reads="i", writes="i", succ=[1]),       # i = i + 1 (back edge)
             N(reads="s", writes="o")]                 # o = s
    live = analyze(nodes, live_at_exit=["o"])
    assert set(live.live_out(5)) == {"i", "s", "n"}
    assert set(live.live_in(3)) == {"s", "i", "n"}
    assert set(live.live_in(4)) == {"t", "i", "n"}
    assert set(live.live_in(0)) == {"n"}
    assert live.intervals() == {
        "i": Interval(0, 5), "s": Interval(0, 6), "n": Interval(0, 5),
        "k": Interval(1, 2), "t": Interval(3, 4), "o": Interval(6, 6)}


def _nested_loops_graph():
    g = Graph(fetch_names=("out",))
    b0 = g.global_block
    for name in ("j", "acc", "scale", "tmp", "out"):
        b0.add_var(Var(name, (4,)))
    b0.add_op(Op("fill", writes=("j", "acc", "scale")))                   # 0
    outer = g.new_block(0)
    b0.add_op(Op("while", reads=("j", "acc"), writes=("acc",),
                 sub_blocks=(outer.idx,), loop=True))                       # 1
    outer.add_op(Op("f", reads=("j",), writes=("tmp",)))                  # 2
    inner = g.new_block(outer.idx)
    outer.add_op(Op("while", reads=("acc", "tmp"), writes=("acc",),
                    sub_blocks=(inner.idx,), loop=True))                    # 3
    inner.add_op(Op("add", reads=("acc", "tmp", "scale"), writes=("acc",)))  # 4
    outer.add_op(Op("increment", reads=("j",), writes=("j",)))            # 5
    b0.add_op(Op("g", reads=("acc",), writes=("out",)))                   # 6
    return g


def test_nested_loops_and_variable_read_only_in_sub_block():
    g = _nested_loops_graph()
    g.validate()
    gl = analyze_graph(g)
    assert [op.type for _, _, op in gl.positions] == [
        "fill", "while", "f", "while", "add", "increment", "g"]
    # tmp lives across the inner loop but not across the outer back edge
    assert set(gl.live_out(4)) == {"j", "acc", "tmp", "scale"}
    assert set(gl.live_in(5)) == {"j", "acc", "scale"}
    assert gl.intervals() == {
        "j": Interval(0, 5), "acc": Interval(0, 6),
        # read only inside the inner body: live through the whole outer loop
        "scale": Interval(0, 5),
        "tmp": Interval(2, 4), "out": Interval(6, 6)}


def test_variable_written_and_never_read():
    nodes = [N(writes="a", succ=[1]), N(reads="a", writes=["dead"], succ=[2]),
             N(reads="a", writes="r")]
    live = analyze(nodes, live_at_exit=["r"])
    assert "dead" not in live.live_out(1)
    assert live.intervals()["dead"] == Interval(1, 1)
    assert live.intervals()["a"] == Interval(0, 2)


def test_conditional_sub_block_outputs_keep_old_value():
    # a branch may not be taken: its output's earlier value stays live through it
    g = Graph(fetch_names=("x",))
    b0 = g.global_block
    for name in ("x", "c", "y"):
        b0.add_var(Var(name, (2,)))
    b0.add_op(Op("fill", writes=("x", "c")))
    sub = g.new_block(0)
    b0.add_op(Op("conditional_block", reads=("c",), writes=("x",), sub_blocks=(sub.idx,)))
    sub.add_op(Op("scale", reads=("c",), writes=("y",)))
    sub.add_op(Op("assign", reads=("y",), writes=("x",)))
    b0.add_op(Op("noop"))
    gl = analyze_graph(g)
    assert "x" in gl.live_out(0) and "x" in gl.live_in(4)
    assert gl.intervals()["x"] == Interval(0, 4)
    assert gl.intervals()["y"] == Interval(2, 3)


def test_interval_overlap_and_half_open():
    assert Interval(0, 2).overlaps(Interval(2, 5))
    assert not Interval(0, 1).overlaps(Interval(2, 5))
    assert Interval(3, 4).half_open == (3, 5)


def test_bad_successor_and_empty_graph():
    with pytest.raises(ValueError, match="successor 7"):
        analyze([N(succ=[7])])
    assert analyze([]).intervals() == {}


# -- property: agrees with a naive set-based fixed point ---------------------

def naive(nodes, exit_live):
    n = len(nodes)
    live_in = [set() for _ in range(n)]
    live_out = [set() for _ in range(n)]
    changed = True
    while changed:
        changed = False
        for i in reversed(range(n)):
            out = set(exit_live) if not nodes[i].successors else set()
            for s in nodes[i].successors:
                out |= live_in[s]
            inn = set(nodes[i].reads) | (out - set(nodes[i].writes))
            if out != live_out[i] or inn != live_in[i]:
                live_out[i], live_in[i], changed = out, inn, True
    return live_in, live_out


@st.composite
def random_cfg(draw):
    n = draw(st.integers(1, 12))
    names = "abcdef"
    nodes = []
    for i in range(n):
        reads = draw(st.lists(st.sampled_from(names), max_size=3))
        writes = draw(st.lists(st.sampled_from(names), max_size=2))
        if i + 1 < n and draw(st.booleans()):
            succ = [i + 1]
        else:
            succ = draw(st.lists(st.integers(0, n - 1), max_size=2, unique=True))
        nodes.append(N(reads, writes, succ))
    return nodes, draw(st.lists(st.sampled_from(names), max_size=2))


@settings(max_examples=300, deadline=None)
@given(random_cfg())
def test_matches_naive_fixed_point(case):
    nodes, exit_live = case
    live = analyze(nodes, live_at_exit=exit_live)
    want_in, want_out = naive(nodes, exit_live)
    for i in range(len(nodes)):
        assert set(live.live_in(i)) == want_in[i], i
        assert set(live.live_out(i)) == want_out[i], i
    # every interval covers every node where its key is live, read or written
    iv = live.intervals()
    for i, node in enumerate(nodes):
        for key in want_in[i] | want_out[i] | set(node.reads) | set(node.writes):
            assert iv[key].start <= i <= iv[key].end
