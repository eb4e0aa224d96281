"""A long fuzzing run of memory_optimize on random legacy Paddle programs.

The CI runs a few dozen random programs (tests/memopt/paddle/test_fuzz_paddle.py); this
script runs many more with the same generator and property (tests/fuzz_recipes.py;
the graph-level checks: tests/graph_checks.py) -- every level,
both garbage-collector modes, results bit-identical over two steps -- and,
with ``--graphs``, the graph-level property (tests/memopt/test_fuzz_graph.py) too.

    python scripts/fuzz_paddle.py [--examples 300] [--graphs 2000] [--seed 0]
                                  [--no-shrink]

A failure is shrunk to a small recipe and printed with its traceback; the
script exits 1.  Otherwise it prints a markdown table of what was run.
"""
import argparse
import collections
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the shared generators, no test module

from hypothesis import given, seed as hypothesis_seed, strategies as st  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # the shared bench harness
from _bench import Table  # noqa: E402


def fuzz_paddle(examples: int, seed: int, shrink: bool, stats) -> None:
    import paddle

    import fuzz_recipes as fp

    paddle.enable_static()
    configs = ((0, False), (1, False), (0, True), (1, True))

    @hypothesis_seed(seed)
    @fp.fuzz_settings(examples, shrink=shrink)
    @given(fp.recipes(max_ops=20), st.booleans())
    def run(recipe, skip_grads):
        reports = fp.check_recipe(paddle, recipe, configs, skip_grads=skip_grads)
        stats["programs"] += 1
        stats["with control flow"] += fp.has_control_flow(recipe)
        stats["training"] += recipe["train"]
        for (level, gc), report in zip(configs, reports):
            key = f"level {level}, GC {'on' if gc else 'off'}"
            stats[f"{key}: runs"] += 1
            stats[f"{key}: variables merged"] += report.merged_count

    run()


def fuzz_graphs(examples: int, seed: int, stats) -> None:
    from hypothesis import HealthCheck, settings

    import graph_checks as fg
    from strategies import programs

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(programs(max_ops=40, max_depth=3))
    def run(program):
        for level in (0, 1):
            for gc in (False, True):
                plan = fg.plan_and_check(program, level, gc)
                stats[f"graph level {level}, GC {'on' if gc else 'off'}: renames"] += \
                    sum(len(m) for m in plan.renames.values())
        stats["graphs"] += 1

    run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300, help="random Paddle programs")
    parser.add_argument("--graphs", type=int, default=0, help="random neutral graphs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-shrink", action="store_true")
    args = parser.parse_args()
    stats = collections.Counter()
    start = time.perf_counter()
    try:
        if args.graphs:
            fuzz_graphs(args.graphs, args.seed, stats)
        if args.examples:
            fuzz_paddle(args.examples, args.seed, not args.no_shrink, stats)
    except Exception:  # the property failed: show the shrunk example
        traceback.print_exc()
        print(f"\nFAILED after {time.perf_counter() - start:.0f} s; counts so far: {dict(stats)}")
        return 1
    table = Table(["what", "count"], "lr")
    for key in sorted(stats):
        table.row(key, stats[key])
    print(f"\nall passed in {time.perf_counter() - start:.0f} s (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
