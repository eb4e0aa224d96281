"""memopt.reuse.assign_groups: whole-buffer reuse, its orders and predicates."""
import pytest
from hypothesis import given, settings, strategies as st

from memopt.graph import Graph, Op, Size, Var
from memopt.problems import Buffer, problem_from_graph
from memopt.reuse import ORDERS, assign_groups
from memopt.bounds import whole_buffer_lower_bound
from memopt.simulate import check_groups

KIB = 1024


def xla_chain():
    """A parameter ``x`` and six convolutions; ``c6`` is live out.

    c1..c4 make 2 KiB outputs, c5 downsamples to 1 KiB, the same size as x
    and the result c6.  Intervals come from the real liveness core.
    """
    g = Graph(fetch_names=("c6",))
    block = g.global_block
    block.add_var(Var("x", (256,), "float32", is_data=True, is_feed=True))
    prev = "x"
    for k, elems in enumerate([512, 512, 512, 512, 256, 256], start=1):
        block.add_var(Var(f"c{k}", (elems,), "float32"))
        block.add_op(Op("conv2d", (prev,), (f"c{k}",)))
        prev = f"c{k}"
    return problem_from_graph(g).buffers


def live_out_exact(member, first):
    """Members fit the group's allocating member; the live-out result only goes
    to memory of exactly its size (as in XLA, an output buffer keeps its size)."""
    if "c6" in (member.id, first.id):
        return member.size == first.size
    return member.size <= first.size


def ids(plan):
    return [[b.id for b in group] for group in plan.groups]


def test_xla_reverse_order_example():
    buffers = xla_chain()
    forward = assign_groups(buffers, order="forward", fits=live_out_exact)
    reverse = assign_groups(buffers, order="reverse", fits=live_out_exact)
    for plan in (forward, reverse):
        check_groups(buffers, plan, fits=live_out_exact)
    # forward: c5 takes x's memory first, so the result finds no 1 KiB group
    assert ids(forward) == [["x", "c5"], ["c1", "c3"], ["c2", "c4"], ["c6"]]
    assert forward.cost == 6 * KIB
    # reverse: the result opens a group, x joins it; the chain needs two more
    assert len(reverse.groups) == 3
    assert sorted(ids(reverse)) == [["c1", "c3", "c5"], ["c2", "c4"], ["x", "c6"]]
    assert reverse.cost == 5 * KIB
    best = assign_groups(buffers, fits=live_out_exact)
    assert best.order == "reverse" and best.cost == 5 * KIB


def test_interval_graph_needs_max_overlap_groups():
    # equal sizes, no predicates: the forward greedy colours an interval graph
    # optimally: as many groups as buffers live at once (3 at step 2)
    buffers = [Buffer(i, lo, hi, 8) for i, (lo, hi) in
               enumerate([(0, 3), (1, 2), (2, 5), (3, 4), (1, 3), (4, 6)])]
    plan = assign_groups(buffers, order="forward")
    check_groups(buffers, plan)
    assert len(plan.groups) == 3 and plan.cost == 24
    assert plan.group_of == {b.id: k for k, g in enumerate(plan.groups) for b in g}


def test_compatible_keeps_kinds_apart():
    buffers = [Buffer("a", 0, 1, 8), Buffer("b", 1, 2, 8), Buffer("c", 2, 3, 4)]
    same_size = lambda p, q: p.size == q.size
    plan = assign_groups(buffers, order="forward", compatible=same_size)
    check_groups(buffers, plan, compatible=same_size)
    assert ids(plan) == [["a", "b"], ["c"]]
    free = assign_groups(buffers, order="forward")
    assert ids(free) == [["a", "b", "c"]] and free.cost == 8


def test_fits_never_grows_the_first_member():
    # a small early buffer cannot host a later large one under `fits`
    buffers = [Buffer("small", 0, 1, 4), Buffer("big", 1, 2, 16)]
    le = lambda m, f: m.size <= f.size
    assert len(assign_groups(buffers, fits=le).groups) == 2
    assert len(assign_groups(buffers).groups) == 1  # XLA rule: a group costs its max
    # the reverse order would make "small" join "big" as the earlier member: refused
    assert len(assign_groups(buffers, order="reverse", fits=le).groups) == 2


def test_symbolic_sizes():
    B = lambda c, k=1: Size(c, k)
    buffers = [Buffer("a", 0, 2, B(64)), Buffer("b", 2, 4, B(32)),
               Buffer("c", 1, 3, B(16, 0)), Buffer("d", 3, 5, B(8, 2))]
    le = lambda m, f: m.size.provably_le(f.size)
    plan = assign_groups(buffers, fits=le)
    check_groups(buffers, plan, fits=le)
    assert plan.cost is None
    assert plan.group_of["a"] == plan.group_of["b"]
    assert plan.group_of["d"] != plan.group_of["a"]  # B**2 is not <= 64 B
    assert plan.cost_at(2) == sum(max(b.size.at(2) for b in g) for g in plan.groups)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown order 'sideways'"):
        assign_groups([Buffer(0, 0, 1, 1)], order="sideways")
    with pytest.raises(ValueError, match="appears twice"):
        assign_groups([Buffer(0, 0, 1, 1), Buffer(0, 1, 2, 1)])
    assert assign_groups([]).groups == []


intervals = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 8),
                               st.integers(0, 64)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(intervals, st.sampled_from(ORDERS + ("best",)), st.booleans())
def test_random_plans_pass_the_checker(spec, order, with_fits):
    buffers = [Buffer(i, lo, lo + length, size) for i, (lo, length, size) in enumerate(spec)]
    fits = (lambda m, f: m.size <= f.size) if with_fits else None
    compatible = lambda a, b: (a.size % 3 == 0) == (b.size % 3 == 0)
    plan = assign_groups(buffers, order=order, fits=fits, compatible=compatible)
    check_groups(buffers, plan, fits=fits, compatible=compatible)
    assert plan.cost >= whole_buffer_lower_bound(buffers)
    if order == "best":
        assert plan.cost == min(assign_groups(buffers, order=o, fits=fits,
                                              compatible=compatible).cost
                                for o in ORDERS)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100), st.integers(1, 40), st.integers(1, 64),
                          st.integers(0, 3)), min_size=1, max_size=50),
       st.sampled_from(ORDERS + ("best",)), st.booleans())
def test_kind_is_compatible_as_an_equivalence(spec, order, with_fits):
    buffers = [Buffer(i, lo, lo + n, size) for i, (lo, n, size, _) in enumerate(spec)]
    kind_of = {i: k for i, (_, _, _, k) in enumerate(spec)}
    fits = (lambda m, f: m.size <= f.size) if with_fits else None
    by_kind = assign_groups(buffers, order=order, fits=fits, kind=lambda b: kind_of[b.id])
    by_pairs = assign_groups(buffers, order=order, fits=fits,
                             compatible=lambda a, b: kind_of[a.id] == kind_of[b.id])
    assert ids(by_kind) == ids(by_pairs) and by_kind.order == by_pairs.order
    assert all(len({kind_of[b.id] for b in group}) == 1 for group in by_kind.groups)


def plain_greedy(buffers, order, compatible, fits):
    """The rule of assign_groups written the plain way (every group tried, the
    least (cost added, bytes wasted, index) kept): the oracle for its search
    of the groups sorted by weight."""
    from memopt.reuse import _admits, _Group, _weight, order_buffers

    groups = []
    for i in order_buffers(buffers, order):
        buf, w = buffers[i], _weight(buffers[i].size)
        keys = [(max(0, w - g.weight), abs(g.weight - w), k) for k, g in enumerate(groups)
                if not any(m.lower < buf.upper and buf.lower < m.upper for m in g.members)
                and _admits(g, buf, compatible, fits)]
        if keys:
            groups[min(keys)[2]].add(buf)
        else:
            groups.append(_Group())
            groups[-1].add(buf)
    return [[b.id for b in g.members] for g in groups]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 20),
                          st.sampled_from([0, 8, 16, 24, 64, 96])), min_size=1, max_size=60),
       st.sampled_from(ORDERS), st.booleans(), st.booleans())
def test_same_groups_as_the_plain_greedy(spec, order, with_fits, with_compatible):
    """Few distinct sizes: many ties of weight, the case the sorted search
    must order by index."""
    buffers = [Buffer(i, lo, lo + n, size) for i, (lo, n, size) in enumerate(spec)]
    fits = (lambda m, f: m.size <= f.size) if with_fits else None
    compatible = ((lambda a, b: (a.size % 3 == 0) == (b.size % 3 == 0))
                  if with_compatible else None)
    plan = assign_groups(buffers, order=order, fits=fits, compatible=compatible)
    assert ids(plan) == plain_greedy(buffers, order, compatible, fits)
