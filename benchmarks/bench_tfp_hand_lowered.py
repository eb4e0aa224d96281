"""TFP's hand-lowered programs on TFP 0.25 and on autobatch, side by side.

Usage::

    python benchmarks/bench_tfp_hand_lowered.py [--tfp-python .tfp-venv/bin/python]
        [--batch 1000] [--repeat 3]

Builds the programs of ``tests/autobatch/tfp_programs.py`` (written against
``instructions``' TFP names; one also through ``stack_optimization.fuse_pop_push``)
once with ``autobatch.instructions`` and once,
in TFP's own venv (``make tfp``), with
``tensorflow_probability.python.experimental.auto_batching.instructions``,
runs each on both NumPy backends (``virtual_machine.execute(program, args,
max_stack_depth, backend)``, TFP's order), and prints a markdown table:
whether the results are identical, and the steady time of each (median of
``--repeat`` runs, both measured in this run).  A program without a TFP
venv prints autobatch's column only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types

import _bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _workloads(batch: int, fuse):
    """``(name, build, args, max_stack_depth)`` per workload, from the
    program builders of ``tfp_programs`` (whatever ``instructions`` it got);
    ``fuse`` is that side's ``stack_optimization.fuse_pop_push``."""
    import numpy as np
    import tfp_programs as tp
    rng = np.random.default_rng(0)
    n = rng.integers(0, 13, size=batch)
    state = rng.normal(size=(batch, 8)).astype(np.float32)
    counts = rng.integers(0, 4, size=batch)

    def halve(s):
        return s * np.float32(0.5)
    return [
        ("fibonacci_by_hand n<13", tp.fibonacci_by_hand, [n], 16),
        ("fibonacci_by_hand fused", lambda: fuse(tp.fibonacci_by_hand()), [n], 16),
        ("pea_nuts_by_hand depth 3", lambda: tp.pea_nuts_by_hand((8,), lambda c: 3, halve),
         [counts, state], 12),
        ("single_if", tp.single_if_program, [n], 3),
    ]


def run_side(side: str, batch: int, repeat: int) -> dict:
    """Run every workload with ``side``'s modules ("autobatch" or "tfp")."""
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "tests", "autobatch"))
    if side == "tfp":
        from tensorflow_probability.python.experimental.auto_batching import (
            instructions, numpy_backend, stack_optimization, virtual_machine)
        package = types.ModuleType("autobatch")
        package.instructions = instructions
        sys.modules["autobatch"] = package
        sys.modules["autobatch.instructions"] = instructions
        backend = numpy_backend.NumpyBackend()
    else:
        sys.path.insert(0, ROOT)
        from autobatch import stack_optimization, virtual_machine
        from autobatch.backends.numpy import NumpyBackend
        backend = NumpyBackend()
    out = {}
    for name, build, args, depth in _workloads(batch, stack_optimization.fuse_pop_push):
        times, result = [], None
        for _ in range(repeat):
            program = build()
            start = time.perf_counter()
            result = virtual_machine.execute(program, args, depth, backend)
            times.append(time.perf_counter() - start)
        out[name] = {"seconds": _bench.median(times),
                     "result": np.asarray(result).tolist()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tfp-python", default=os.path.join(ROOT, ".tfp-venv", "bin", "python"))
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--side", choices=("autobatch", "tfp"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(run_side(args.side, args.batch, args.repeat)))
        return
    ours = run_side("autobatch", args.batch, args.repeat)
    tfp = None
    if os.path.exists(args.tfp_python):
        tfp = _bench.run_worker(__file__, ["tfp", "--batch", args.batch, "--repeat",
                                           args.repeat], flag="--side", python=args.tfp_python)
        if "error" in tfp:
            sys.exit(f"TFP's side failed: {tfp['error']}")
    load = os.getloadavg()[0]
    print(f"batch {args.batch}, median of {args.repeat}, load {load:.2f}; "
          f"TFP 0.25: {args.tfp_python if tfp else 'not run'}\n")
    table = _bench.Table(["program", "autobatch s", "TFP 0.25 s", "TFP / autobatch",
                          "same results"], "lrrrl")
    for name, mine in ours.items():
        if tfp is None:
            table.row(name, f"{mine['seconds']:.3f}", "-", "-", "-")
            continue
        theirs = tfp[name]
        same = "yes" if theirs["result"] == mine["result"] else "NO"
        table.row(name, f"{mine['seconds']:.3f}", f"{theirs['seconds']:.3f}",
                  f"{theirs['seconds'] / mine['seconds']:.2f}", same)


if __name__ == "__main__":
    main()
