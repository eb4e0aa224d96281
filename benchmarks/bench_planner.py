"""Benchmark the buffer and arena planner; print markdown tables.

Problems: the eleven MiniMalloc "challenging" problems (A-K, capacity
1,048,576) and the live intervals of real Paddle programs (ResNet-50 and
MobileNetV2, training and inference, and a Transformer encoder in training;
legacy IR, batch 32, sizes in bytes at that batch).

For every problem:

- arena: the height of each heuristic and of the final plan (default mode)
  over the peak-live lower bound, the final plan over the best known height
  (the bound, except D and J: 1,048,576), and the planning time (median of
  ``--repeat`` runs);
  ``--exact`` adds the exact mode (one run, ``--time-limit`` seconds each);
  ``--fit`` adds the time the search takes to fit a problem in its capacity
  (MiniMalloc's question; one run, the search alone, first run in the
  process not counted: it loads the compiled kernel);
- whole-buffer reuse: the cost of each order of :func:`memopt.reuse.assign_groups`
  (no compatibility rule: any sizes share, a group costs its largest member)
  over the sum-of-positional-maxima lower bound, and the time of ``"best"``.

Usage::

    python benchmarks/bench_planner.py                      # default mode
    python benchmarks/bench_planner.py --exact --time-limit 60
    python benchmarks/bench_planner.py --problems A,B --no-models --fit
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import _bench  # noqa: E402
from memopt.arena import (FOUND, HEURISTICS, CanonicalSearch, _load_kernels,  # noqa: E402
                          choose, plan_arena)
from memopt.bounds import peak_live_bytes, whole_buffer_lower_bound  # noqa: E402
from memopt.errors import PlanError  # noqa: E402
from memopt.problems import Problem, problem_from_graph, read_csv  # noqa: E402
from memopt.reuse import ORDERS, assign_groups  # noqa: E402
from memopt.simulate import check_groups, check_offsets  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "benchmarks" / "minimalloc"

#: Best known heights where they are not the peak-live bound (the data's
#: README: MiniMalloc fits D and J in their capacity).  The exact mode fits
#: D in 986,112 bytes, its peak-live bound (so that is its optimum), and J
#: in 1,026,048.
BEST_KNOWN = {"D": 1048576, "J": 1048576}

#: (label, model name, train, build options)
MODELS = [
    ("ResNet-50 train", "resnet50", True, {"image_size": 224}),
    ("ResNet-50 infer", "resnet50", False, {"image_size": 224}),
    ("MobileNetV2 train", "mobilenet_v2", True, {"image_size": 224}),
    ("MobileNetV2 infer", "mobilenet_v2", False, {"image_size": 224}),
    ("Transformer train", "transformer", True,
     {"layers": 6, "d_model": 512, "heads": 8, "d_ff": 2048, "seq_len": 128,
      "vocab": 1000}),
]


def minimalloc_problems(data: Path, names):
    problems = []
    for path in sorted(data.glob("*.csv")):
        problem = read_csv(path)
        if names is None or problem.name in names:
            problems.append(problem)
    if not problems:
        raise SystemExit(f"no problem files found in {data} (use --data)")
    return problems


def model_problems(batch_size: int):
    """Live intervals of real Paddle programs (needs paddle)."""
    from memopt.testing.models import build
    from memopt.paddle.legacy.program import program_to_graph

    problems = []
    for label, name, train, options in MODELS:
        model = build(name, ir="legacy", batch_size=batch_size, train=train, **options)
        graph = program_to_graph(model.main)
        problem = problem_from_graph(graph, batch_size=batch_size)
        problem.name = label
        problems.append(problem)
    return problems


def timed(fn, repeat: int):
    """(result of the last run, median seconds)."""
    results = []
    seconds = _bench.median_seconds(lambda: results.append(fn()), repeat)
    return results[-1], seconds


def ratio(value: int, bound: int) -> str:
    return f"{value / bound:.4f}" if bound else "-"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def arena_row(problem: Problem, repeat: int, exact: bool, time_limit: float,
              fit: bool) -> list:
    buffers = problem.buffers
    bound = peak_live_bytes(buffers)
    heur = choose(buffers)
    heights = {name: h for name, h, _ in heur.trials}
    plan, seconds = timed(lambda: plan_arena(buffers), repeat)
    check_offsets(buffers, plan.offsets)
    cells = [problem.name, str(len(buffers)), f"{bound:,}"]
    cells += [ratio(heights[name], bound) for name in HEURISTICS]
    known = BEST_KNOWN.get(problem.name, bound) if problem.capacity else bound
    cells += [ratio(plan.height, bound), ratio(plan.height, known), ms(seconds),
              f"{seconds * 1000 / max(len(buffers), 1) * 1000:.0f} ms"]
    if exact:
        t0 = time.perf_counter()
        try:  # given the capacity, as MiniMalloc is
            best = plan_arena(problem, mode="exact", time_limit=time_limit)
        except PlanError:
            best = None
        spent = time.perf_counter() - t0
        if best is None:
            cells += ["-", "-", "no", "no", ms(spent)]
        else:
            check_offsets(buffers, best.offsets)
            fits = ("yes" if best.height <= problem.capacity else "no") \
                if problem.capacity else "-"
            cells += [ratio(best.height, bound), f"{best.height:,}", fits,
                      "yes" if best.optimal else "no", ms(spent)]
    if fit:
        cells += fit_cells(problem, time_limit)
    return cells


def fit_cells(problem: Problem, time_limit: float) -> list:
    """Seconds and nodes of the search fitting ``problem`` in its capacity."""
    if not problem.capacity:
        return ["-", "-"]
    buffers = problem.buffers
    search = CanonicalSearch(*(np.array([getattr(b, k) for b in buffers])
                               for k in ("lower", "upper", "size")))
    t0 = time.perf_counter()
    status, offsets = search.solve(problem.capacity, 10**9, t0 + time_limit)
    spent = time.perf_counter() - t0
    if status != FOUND:
        return [f"no ({status})", f"{search.nodes:,}"]
    check_offsets(buffers, dict(zip((b.id for b in buffers), offsets.tolist())),
                  capacity=problem.capacity)
    return [ms(spent), f"{search.nodes:,}"]


def reuse_row(problem: Problem, repeat: int) -> list:
    buffers = problem.buffers
    bound = whole_buffer_lower_bound(buffers)
    peak = peak_live_bytes(buffers)
    costs = {}
    for order in ORDERS:
        plan = assign_groups(buffers, order=order)
        check_groups(buffers, plan)
        costs[order] = plan.cost
    best, seconds = timed(lambda: assign_groups(buffers), repeat)
    cells = [problem.name, f"{bound:,}", ratio(bound, peak)]
    cells += [ratio(costs[o], bound) for o in ORDERS]
    cells += [ratio(best.cost, bound), best.order, ms(seconds)]
    return cells


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="folder of the MiniMalloc CSV problems")
    parser.add_argument("--problems", help="comma-separated names (default: all)")
    parser.add_argument("--no-models", action="store_true",
                        help="skip the Paddle programs")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per timing (the median is shown)")
    parser.add_argument("--exact", action="store_true", help="also run the exact mode")
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="seconds per problem in the exact mode and --fit")
    parser.add_argument("--fit", action="store_true",
                        help="also time the search fitting each problem in its capacity")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    names = set(args.problems.split(",")) if args.problems else None
    problems = minimalloc_problems(args.data, names)
    if not args.no_models:
        problems += model_problems(args.batch_size)

    print(f"# Planner benchmark ({os.cpu_count()} CPUs; times: median of {args.repeat})")
    print()
    print("## Arena offsets: height / peak-live lower bound")
    print()
    head = ["problem", "buffers", "lower bound (B)"] + list(HEURISTICS) + [
        "final (default)", "final / best known", "time", "per 1000 buffers"]
    if args.exact:
        head += [f"exact ({args.time_limit:g} s)", "exact height", "fits capacity",
                 "proven optimal", "exact time"]
    if args.fit:
        head += ["fit in capacity", "fit nodes"]
        _load_kernels()  # not counted: the first search in a process loads the kernel
    table = _bench.Table(head)
    for problem in problems:
        table.row(*arena_row(problem, args.repeat, args.exact, args.time_limit, args.fit))
        sys.stdout.flush()
    print()
    print("## Whole-buffer reuse: cost / sum-of-positional-maxima lower bound")
    print()
    head = ["problem", "lower bound (B)", "bound / peak live"] + list(ORDERS) + [
        "best", "best order", "time (best)"]
    table = _bench.Table(head)
    for problem in problems:
        table.row(*reuse_row(problem, args.repeat))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
