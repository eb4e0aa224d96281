"""Liveness speed on a straight-line program of 100,000 ops, 200,000 variables,
and on a loop-heavy one.  Target: the straight-line case under 5 s.

    python benchmarks/bench_liveness.py [--ops 100000] [--repeat 3]

Prints a markdown table: median seconds over ``--repeat`` runs.
"""
import argparse
import random

from _bench import Table, median_seconds
from memopt.liveness import FlowNode, analyze


def straight_line(num_ops: int, seed: int = 0):
    """Each op reads two earlier values (mostly recent ones) and writes two."""
    rng = random.Random(seed)
    nodes = []
    for i in range(num_ops):
        reads = tuple(f"v{max(0, 2 * i - 1 - int(rng.expovariate(0.05)))}"
                      for _ in range(2)) if i else ()
        writes = (f"v{2 * i}", f"v{2 * i + 1}")
        succ = (i + 1,) if i + 1 < num_ops else ()
        nodes.append(FlowNode(reads, writes, succ))
    return nodes, (f"v{2 * num_ops - 1}",)


def loops(num_ops: int, body: int = 50, seed: int = 1):
    """Straight-line code cut into loops of ``body`` ops with a carried value."""
    nodes, exit_live = straight_line(num_ops, seed)
    out = []
    for i, node in enumerate(nodes):
        succ = node.successors
        if i % body == body - 1 and i + 1 < num_ops:
            succ = (i - body + 1, i + 1)           # back edge to the loop start
        out.append(FlowNode(node.reads, node.writes, succ))
    return out, exit_live


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    table = Table(["graph", "ops", "variables", "analyze + intervals (s)",
                   "live_out of 1,000 nodes (s)"])
    for name, build in (("straight line", straight_line), ("loops of 50", loops)):
        nodes, exit_live = build(args.ops)
        nvars = 2 * args.ops

        def run():
            live = analyze(nodes, exit_live)
            live.intervals()
            return live

        t = median_seconds(run, args.repeat)
        live = run()
        probe = median_seconds(
            lambda: [live.live_out(i) for i in range(0, args.ops, args.ops // 1000)], 1)
        table.row(name, f"{args.ops:,}", f"{nvars:,}", f"{t:.2f}", f"{probe:.2f}")


if __name__ == "__main__":
    main()
