"""memopt.simulate (checker, timelines) and memopt.bounds on hand-checked cases."""
import pytest

from memopt.bounds import peak_live_bytes, positional_maxima, whole_buffer_lower_bound
from memopt.errors import PlanError
from memopt.graph import Size
from memopt.problems import Buffer
from memopt.reuse import GroupPlan
from memopt.simulate import (check_groups, check_offsets, group_timeline, live_bytes,
                             peak_live)

# a: [0,4) 10 B; b: [1,3) 6 B; c: [3,6) 8 B; d: [4,5) 2 B
BUFS = [Buffer("a", 0, 4, 10), Buffer("b", 1, 3, 6), Buffer("c", 3, 6, 8),
        Buffer("d", 4, 5, 2)]


def test_timeline_by_hand():
    tl = live_bytes(BUFS)
    assert list(tl.starts) == [0, 1, 3, 4, 5] and tl.end == 6
    assert list(tl.bytes) == [10, 16, 18, 10, 8]
    assert tl.peak == 18 and tl.peak_step == 3
    assert [tl.at(t) for t in range(-1, 7)] == [0, 10, 16, 16, 18, 10, 8, 0]
    assert peak_live(BUFS) == 18 == peak_live_bytes(BUFS)
    assert peak_live([]) == 0 and live_bytes([]).peak_step is None


def test_positional_maxima_by_hand():
    # step 0: [10]; 1: [10, 6]; 3: [10, 8]; 4: [8, 2]
    assert list(positional_maxima(BUFS)) == [10, 8]
    assert whole_buffer_lower_bound(BUFS) == 18
    # two disjoint pairs: the bound counts the largest second buffer, not the sum
    pairs = [Buffer(0, 0, 2, 4), Buffer(1, 0, 2, 1), Buffer(2, 2, 4, 3), Buffer(3, 2, 4, 3)]
    assert peak_live_bytes(pairs) == 6
    assert whole_buffer_lower_bound(pairs) == 4 + 3


def test_symbolic_sizes_need_a_batch():
    bufs = [Buffer("x", 0, 2, Size(4, 1)), Buffer("y", 1, 3, 3)]
    assert peak_live(bufs, batch_size=5) == 23
    with pytest.raises(ValueError, match="batch_size"):
        peak_live(bufs)


def test_check_offsets_accepts_a_valid_plan():
    plan = {"a": 0, "b": 10, "c": 10, "d": 0}
    assert check_offsets(BUFS, plan) == 18
    assert check_offsets(BUFS, plan, capacity=18) == 18


@pytest.mark.parametrize("plan, message", [
    ({"a": 0, "b": 9, "c": 10, "d": 0}, "'a' .* and 'b' .* overlap in memory"),
    ({"a": 0, "b": 10, "c": 9, "d": 0}, "'a' .* and 'c' .* overlap in memory"),
    ({"a": 0, "b": 10, "c": 10, "d": 16}, "'c' .* and 'd' .* overlap"),
    ({"a": 0, "b": 10, "c": 10}, "'d' has no offset"),
    ({"a": 0, "b": 10, "c": 10, "d": -2}, "'d' has the offset -2"),
    ({"a": 0, "b": 10, "c": 10, "d": 1.5}, "'d' has the offset 1.5"),
    ({"a": 0, "b": 10, "c": 10, "d": 0, "z": 0}, "'z', which is not a buffer"),
])
def test_check_offsets_rejects(plan, message):
    with pytest.raises(PlanError, match=message):
        check_offsets(BUFS, plan)


def test_check_offsets_capacity_and_touching():
    with pytest.raises(PlanError, match="18 bytes high, above the capacity 17 .*'c'"):
        check_offsets(BUFS, {"a": 0, "b": 10, "c": 10, "d": 0}, capacity=17)
    # buffers that only touch in time ([0,3) and [3,5)) may share bytes
    touching = [Buffer(0, 0, 3, 8), Buffer(1, 3, 5, 8)]
    assert check_offsets(touching, {0: 0, 1: 0}) == 8
    # zero-size buffers never collide
    assert check_offsets([Buffer(0, 0, 3, 8), Buffer(1, 0, 3, 0)], {0: 0, 1: 4}) == 8


def plan_of(groups):
    groups = [list(g) for g in groups]
    return GroupPlan(groups, {b.id: k for k, g in enumerate(groups) for b in g})


def test_check_groups():
    a, b, c, d = BUFS
    check_groups(BUFS, plan_of([[a, d], [b, c]]))
    with pytest.raises(PlanError, match="'a' .* and 'c' .* share group 0 but are live"):
        check_groups(BUFS, plan_of([[a, c], [b], [d]]))
    with pytest.raises(PlanError, match="'d' is in no group"):
        check_groups(BUFS, plan_of([[a], [b, c]]))
    with pytest.raises(PlanError, match="'a' is in groups 0 and 1"):
        check_groups(BUFS, plan_of([[a, d], [a, b, c]]))
    bad = plan_of([[a, d], [b, c]])
    bad.group_of["d"] = 1
    with pytest.raises(PlanError, match="group_of\\['d'\\]"):
        check_groups(BUFS, bad)
    with pytest.raises(PlanError, match="'c' shares group 1 but does not fit .*'b'"):
        check_groups(BUFS, plan_of([[a, d], [b, c]]), fits=lambda m, f: m.size <= f.size)
    with pytest.raises(PlanError, match="'b' and 'c' share group 1 but are not compatible"):
        check_groups(BUFS, plan_of([[a, d], [b, c]]),
                     compatible=lambda x, y: x.size == y.size or {x.id, y.id} == {"a", "d"})


def test_group_timeline_gc_on_and_off():
    a, b, c, d = BUFS
    plan = plan_of([[a, d], [b, c]])  # groups of 10 B over [0,5) and 8 B over [1,6)
    on = group_timeline(plan, gc=True)
    assert list(on.starts) == [0, 1, 5] and list(on.bytes) == [10, 18, 8]
    off = group_timeline(plan, gc=False)
    assert list(off.bytes) == [18] and off.end == 6


def test_huge_sizes_are_exact():
    """Sizes past np.int64 (a 2**71-byte buffer; four 2**61-byte ones whose
    sum wraps in int64) are summed exactly, with no OverflowError."""
    big = [Buffer("a", 0, 2, 2 ** 71), Buffer("b", 1, 3, 2 ** 61),
           Buffer("c", 1, 4, 2 ** 61), Buffer("d", 2, 4, Size(3, 1))]
    timeline = live_bytes(big, batch_size=1)
    assert timeline.peak == 2 ** 71 + 2 ** 62 and timeline.peak_step == 1
    assert timeline.at(2) == 2 ** 62 + 3
    assert whole_buffer_lower_bound(big, 1) == 2 ** 71 + 2 ** 62
    assert check_offsets(big, {"a": 0, "b": 2 ** 71, "c": 2 ** 71 + 2 ** 61,
                               "d": 2 ** 71 + 2 ** 62}, batch_size=1) == 2 ** 71 + 2 ** 62 + 3
    with pytest.raises(PlanError, match="'a'.*'b'"):
        check_offsets(big, {"a": 0, "b": 2 ** 70, "c": 2 ** 71 + 2 ** 61,
                            "d": 2 ** 71 + 2 ** 62}, batch_size=1)
    four = [Buffer(k, 0, 1, 2 ** 61) for k in "wxyz"]
    assert peak_live_bytes(four) == 2 ** 63
    assert group_timeline(plan_of([[b] for b in four]), gc=False).peak == 2 ** 63


def test_check_groups_equivalence_compares_with_the_earliest_only():
    """With equivalence=True compatible() runs once per member but the
    earliest (linear in a group's size), and still rejects a misfit."""
    chain_of = [Buffer(f"b{i}", i, i + 1, 4 if i != 7 else 8) for i in range(50)]
    calls = []

    def same_size(x, y):
        calls.append((x.id, y.id))
        return x.size == y.size

    good = [b for b in chain_of if b.id != "b7"]
    check_groups(good, plan_of([good]), compatible=same_size, equivalence=True)
    assert len(calls) == len(good) - 1
    with pytest.raises(PlanError, match="'b0' and 'b7' share group 0 but are not compatible"):
        check_groups(chain_of, plan_of([chain_of]), compatible=same_size, equivalence=True)
