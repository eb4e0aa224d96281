"""memopt.arena: heuristics, chooser and search, all checked independently."""
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from memopt.arena import (FOUND, HEURISTICS, INFEASIBLE, CanonicalSearch, choose,
                          plan_arena, run_heuristic)
from memopt.bounds import peak_live_bytes
from memopt.errors import PlanError
from memopt.graph import Size
from memopt.problems import Buffer, Problem, read_csv
from memopt.simulate import check_offsets
from conftest import need, need_file

#: tests/ (conftest, shared helpers)
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(os.path.dirname(__file__), "..", "data", "minimalloc")  # A and K, vendored


def bufs(*spec):
    return [Buffer(i, lo, hi, size) for i, (lo, hi, size) in enumerate(spec)]


def arrays(buffers):
    return (np.array([b.lower for b in buffers]), np.array([b.upper for b in buffers]),
            np.array([b.size for b in buffers]))


#: No arena reaches the peak of 10 bytes (live at steps 0 and 6).  C and G
#: each take one half of [0, 10) at their peaks; E (1 byte, steps 1-4) must
#: sit beside C at step 1 and beside G at step 4, with A (steps 1-3) beside C
#: and B (steps 3-4) beside G.  If C and G take the same half, A, B and E
#: (6 bytes, all live at step 3) share the other 5 bytes; if opposite halves,
#: E would have to be in both.  So 11 bytes are needed, and enough.
GAP = bufs((1, 4, 3), (3, 5, 2), (0, 2, 5), (0, 1, 5), (1, 5, 1), (6, 7, 5), (4, 7, 5))


def test_heuristics_by_hand():
    # a: [0,4) 4 B; b: [0,2) 2 B; c: [2,4) 3 B; d: [1,3) 1 B
    spec = bufs((0, 4, 4), (0, 2, 2), (2, 4, 3), (1, 3, 1))
    tflite = run_heuristic(spec, "tflite_size")
    # by size: a@0, c@4, b@4 (free before c starts), d: gap above b is [6,7)
    assert tflite.offsets == {0: 0, 2: 4, 1: 4, 3: 7}
    assert tflite.height == 8
    first = run_heuristic(spec, "first_fit")
    # by start (then end): b@0, a@2, d@6, c: b's bytes [0,2) are free again
    # but too small for 3 bytes -> c@7
    assert first.offsets == {1: 0, 0: 2, 3: 6, 2: 7}
    assert first.height == 10
    best = choose(spec)
    assert best.height == 8 and best.strategy == "tflite_size"
    assert [t[0] for t in best.trials] == list(HEURISTICS)
    assert peak_live_bytes(spec) == 8


def test_gap_is_real():
    assert peak_live_bytes(GAP) == 10
    search = CanonicalSearch(*arrays(GAP))
    assert search.solve(10, 10_000)[0] == INFEASIBLE
    status, offsets = search.solve(11, 10_000)
    assert status == FOUND
    assert check_offsets(GAP, dict(enumerate(offsets.tolist()))) <= 11
    for name in HEURISTICS:
        assert run_heuristic(GAP, name).height >= 11
    exact = plan_arena(GAP, mode="exact")
    assert exact.height == 11 and exact.lower_bound == 11 and exact.optimal


def brute_force_height(buffers, limit):
    """The optimum by trying every integer offset (tiny problems only)."""
    best = limit
    n = len(buffers)

    def place(i, offsets, height):
        nonlocal best
        if height >= best:
            return
        if i == n:
            best = height
            return
        b = buffers[i]
        for off in range(0, best - b.size + 1):
            if all(not (b.overlaps(buffers[j]) and off < offsets[j] + buffers[j].size
                        and offsets[j] < off + b.size) for j in range(i)):
                offsets.append(off)
                place(i + 1, offsets, max(height, off + b.size))
                offsets.pop()

    place(0, [], 0)
    return best


def test_exact_matches_brute_force_on_the_gap():
    assert brute_force_height(GAP, 20) == 11


def random_buffers(start, length, size, most):
    """Lists of buffers: start step, lifetime and size drawn from the ranges."""
    spec = st.tuples(st.integers(*start), st.integers(*length), st.integers(*size))
    return st.lists(spec, min_size=1, max_size=most).map(
        lambda rows: bufs(*[(lo, lo + n, b) for lo, n, b in rows]))


@settings(max_examples=40, deadline=None)
@given(random_buffers((0, 5), (1, 4), (1, 4), 6))
def test_exact_is_optimal_on_tiny_problems(buffers):
    plan = plan_arena(buffers, mode="exact", time_limit=20)
    check_offsets(buffers, plan.offsets)
    assert plan.optimal
    assert plan.height == brute_force_height(buffers, plan.height + 1)


@settings(max_examples=40, deadline=None)
@given(random_buffers((0, 40), (1, 12), (0, 300), 40))
def test_every_plan_passes_the_checker(buffers):
    bound = peak_live_bytes(buffers)
    heights = []
    for name in HEURISTICS:
        plan = run_heuristic(buffers, name)
        assert check_offsets(buffers, plan.offsets) == plan.height >= bound
        heights.append(plan.height)
    final = plan_arena(buffers, time_limit=5)
    assert check_offsets(buffers, final.offsets) == final.height
    assert bound <= final.lower_bound <= final.height <= min(heights)
    exact = plan_arena(buffers, mode="exact", time_limit=5, node_budget=20_000)
    assert check_offsets(buffers, exact.offsets) == exact.height <= final.height


def test_deterministic():
    buffers = bufs(*[(i % 7, i % 7 + 1 + i % 5, 1 + (i * 37) % 50) for i in range(60)])
    one, two = plan_arena(buffers), plan_arena(buffers)
    assert one.offsets == two.offsets and one.height == two.height


def test_capacity_and_arguments():
    with pytest.raises(PlanError, match="capacity of 10 bytes.*11 bytes high"):
        plan_arena(Problem(GAP, capacity=10), mode="heuristic")
    assert plan_arena(Problem(GAP, capacity=11)).height == 11
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        plan_arena(GAP, mode="fast")
    with pytest.raises(ValueError, match="unknown heuristic 'lifo'"):
        run_heuristic(GAP, "lifo")
    empty = plan_arena([])
    assert empty.height == 0 and empty.offsets == {} and empty.optimal


def test_zero_sizes_and_symbolic_sizes():
    buffers = [Buffer("x", 0, 3, Size(8, 1)), Buffer("y", 1, 4, 0), Buffer("z", 3, 5, 16)]
    plan = plan_arena(buffers, batch_size=4)
    assert check_offsets(buffers, plan.offsets, batch_size=4) == plan.height == 32
    assert plan.optimal


def test_a_minimalloc_problem_reaches_its_bound():
    path = need_file(os.path.join(DATA, "A.1048576.csv"),
                     "the MiniMalloc problems (tests/data/minimalloc)")
    problem = read_csv(path)
    plan = plan_arena(problem, mode="exact")  # stops as soon as it is on the bound
    assert check_offsets(problem.buffers, plan.offsets, capacity=1048576) == 1048576
    assert plan.optimal and plan.lower_bound == 1048576
    assert choose(problem.buffers).height > 1.15 * 1048576  # the greedy gap


#: Strategies covering the three branching rules of the search.
RULES = ("B0", "B0/s", "TWA/m")


@settings(max_examples=30, deadline=None)
@given(random_buffers((0, 5), (1, 4), (1, 4), 6))
def test_every_branching_rule_is_sound_and_complete(buffers):
    """Each rule alone finds a plan at the optimum and proves nothing fits
    one byte lower (the sizes' gcd may be 1)."""
    optimum = brute_force_height(buffers, sum(b.size for b in buffers) + 1)
    for rule in RULES:
        search = CanonicalSearch(*arrays(buffers))
        status, offsets = search.solve(optimum, 100_000, orders=(rule,) * 50)
        assert status == FOUND, rule
        assert check_offsets(buffers, dict(enumerate(offsets.tolist()))) <= optimum
        if optimum > peak_live_bytes(buffers):  # else the bound answers first
            assert search.solve(optimum - 1, 100_000, orders=(rule,) * 50)[0] == INFEASIBLE


def _kernel_runs(problems):
    """(status, offsets, nodes) of every rule on every (buffers, capacity)."""
    out = []
    for buffers, capacity in problems:
        for rule in RULES:
            search = CanonicalSearch(*arrays(buffers))
            status, offsets = search.solve(capacity, 3_000, orders=(rule,))
            out.append([status, None if offsets is None else offsets.tolist(), search.nodes])
    return out


def _kernel_problems():
    rng = np.random.default_rng(4)
    problems = []
    for n in (12, 25):
        lo = rng.integers(0, 20, n)
        spec = [(int(a), int(a + rng.integers(1, 8)), int(rng.integers(1, 9)) * 8) for a in lo]
        buffers = bufs(*spec)
        bound = peak_live_bytes(buffers)
        problems += [(buffers, bound), (buffers, bound + bound // 10)]
    return problems


def test_plain_python_kernel_gives_the_same_plans():
    """Without numba (import blocked in a child process) the kernel runs as
    plain Python and must find the same plans with the same node counts."""
    import json
    import subprocess
    import sys

    from memopt import _search_kernel

    code = (
        "import sys, json\n"
        "sys.modules['numba'] = None  # as if numba were not installed\n"
        f"sys.path[:0] = [{os.path.dirname(__file__)!r}, {TESTS!r}]\n"
        "import test_arena as t\n"
        "from memopt import _search_kernel\n"
        "assert not _search_kernel.JIT\n"
        "print(json.dumps(t._kernel_runs(t._kernel_problems())))\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=os.path.dirname(TESTS))
    assert child.returncode == 0, child.stderr
    plain = json.loads(child.stdout)
    here = _kernel_runs(_kernel_problems())
    assert plain == json.loads(json.dumps(here))
    assert {run[0] for run in here} >= {FOUND}
    if _search_kernel.JIT:
        assert _search_kernel.solve_range.signatures  # the comparison ran compiled code


def test_the_hardest_minimalloc_problem_in_a_few_thousand_nodes():
    """K (454 buffers) at its lower bound with MiniMalloc's placement order."""
    need("numba")  # plain Python is too slow for 454 buffers
    path = need_file(os.path.join(DATA, "K.1048576.csv"),
                     "the MiniMalloc problems (tests/data/minimalloc)")
    problem = read_csv(path)
    search = CanonicalSearch(*arrays(problem.buffers))
    status, offsets = search.solve(1048576, 20_000, orders=("TWA/m",))
    assert status == FOUND
    plan = {b.id: int(o) for b, o in zip(problem.buffers, offsets, strict=True)}
    assert check_offsets(problem.buffers, plan, capacity=1048576) == 1048576


def test_deep_searches_do_not_overflow_the_stack():
    """A descent recurses once per placement: 4,000 buffers went past the main
    thread's stack in compiled code before the search got its own thread."""
    need("numba")  # plain Python recursion does not use the C stack
    rng = np.random.default_rng(2)
    lower = rng.integers(0, 1000, 4000)
    buffers = bufs(*[(int(a), int(a + rng.integers(1, 40)), int(rng.integers(1, 64)))
                     for a in lower])
    search = CanonicalSearch(*arrays(buffers))
    for rule in RULES:
        offsets = search.dive(rule)
        assert check_offsets(buffers, dict(enumerate(offsets.tolist()))) >= \
            peak_live_bytes(buffers)
