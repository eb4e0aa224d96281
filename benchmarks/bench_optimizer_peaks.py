"""Measured step peaks of the optimizer zoo against memopt's analysis and
``budget=``.

An MLP 16-W-W-4 (W = 1024 by default: the parameters dominate, so what an
optimizer's update allocates shows) trained by each optimizer, batch 64.
For each, two fresh processes: the unchanged program (``memopt.analyze``'s
``total_peak`` and the allocator's step peaks) and the program rewritten
with ``budget=`` the smallest budget BudgetError names at 1 byte (the step
peaks then).  A step's peak is
``paddle.base.core.host_memory_stat_peak_value('Allocated', 0)`` reset
before each of 4 steps (parameters and optimizer state included).

    python benchmarks/bench_optimizer_peaks.py [--optimizers a,b] [--ir pir|legacy] [--width W]
                                            [--gc-off]

Prints a markdown table: optimizer | analysed | unchanged steps min/max |
smallest budget | steps at it min/max | max / budget (above 1: the budget
promise broken).
"""
import argparse
import contextlib
import io
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench  # noqa: E402

BATCH = 64
STEPS = 4


def _optimizer(paddle, name):
    opt, incubate = paddle.optimizer, paddle.incubate.optimizer
    return {
        "sgd": lambda: opt.SGD(0.01),
        "momentum": lambda: opt.Momentum(0.01, 0.9),
        "adam": lambda: opt.Adam(1e-3),
        "adamw": lambda: opt.AdamW(1e-3),
        "adamax": lambda: opt.Adamax(1e-3),
        "adagrad": lambda: opt.Adagrad(1e-3),
        "rmsprop_centered": lambda: opt.RMSProp(1e-3, centered=True),
        "adadelta": lambda: opt.Adadelta(1.0),
        "lamb": lambda: opt.Lamb(1e-3),
        "nadam": lambda: opt.NAdam(1e-3),
        "radam": lambda: opt.RAdam(1e-3),
        "asgd": lambda: opt.ASGD(1e-3, batch_num=2),
        "rprop": lambda: opt.Rprop(1e-3),
        "lars": lambda: incubate.LarsMomentumOptimizer(0.01, 0.9),
        "sgd_global_norm_clip": lambda: opt.SGD(0.01, grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0)),
        "adam_l2": lambda: opt.Adam(1e-3, weight_decay=paddle.regularizer.L2Decay(1e-3)),
        "lookahead_adam": lambda: incubate.LookAhead(opt.Adam(1e-3), k=2),
    }[name]()


OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adamax", "adagrad", "rmsprop_centered",
              "adadelta", "lamb", "nadam", "radam", "asgd", "rprop", "lars",
              "sgd_global_norm_clip", "adam_l2", "lookahead_adam")


def build(paddle, name, width):
    """``(main, startup, fetch)``: the MLP trained by optimizer ``name``."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    paddle.seed(7)
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 16], "float32")
        h = paddle.nn.functional.relu(paddle.nn.Linear(16, width)(x))
        h = paddle.nn.functional.relu(paddle.nn.Linear(width, width)(h))
        out = paddle.nn.Linear(width, 4)(h)
        loss = paddle.mean(out * out)
        _optimizer(paddle, name).minimize(loss)
    return main, startup, [loss]


def measure(name, config, width):
    """One process's figures: ``analysed`` (unchanged program), ``budget``
    (config ``smallest``), ``peaks`` of the steps."""
    import paddle
    from paddle.base import core

    import memopt

    paddle.enable_static()
    main, startup, fetch = build(paddle, name, width)
    out = {"analysed": memopt.analyze(main, BATCH, fetch_list=fetch).total_peak(BATCH)}
    if config == "smallest":
        try:
            memopt.memory_optimize(main, budget=1, batch_size=BATCH, fetch_list=fetch)
        except memopt.BudgetError as e:
            out["budget"] = e.smallest_budget
        with contextlib.redirect_stdout(io.StringIO()):
            memopt.memory_optimize(main, budget=out["budget"], batch_size=BATCH,
                                   fetch_list=fetch)
    rng = np.random.default_rng(0)
    with paddle.static.scope_guard(paddle.static.Scope()):
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        peaks = []
        for _ in range(STEPS):
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            exe.run(main, feed={"x": rng.standard_normal((BATCH, 16)).astype("float32")},
                    fetch_list=fetch)
            peaks.append(core.host_memory_stat_peak_value("Allocated", 0))
    out["peaks"] = peaks
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--ir", choices=["pir", "legacy"], default="pir")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--gc-off", action="store_true",
                        help="FLAGS_eager_delete_tensor_gb=-1 in every worker")
    parser.add_argument("--worker", nargs=3)
    args = parser.parse_args()
    if args.worker:
        name, config, width = args.worker
        print(json.dumps(measure(name, config, int(width))), flush=True)
        return 0
    env = {}
    if args.ir == "legacy":
        env["FLAGS_enable_pir_api"] = "0"
    if args.gc_off:
        env["FLAGS_eager_delete_tensor_gb"] = "-1"
    print(f"{args.ir}, MLP 16-{args.width}-{args.width}-4, batch {BATCH}, "
          f"GC {'off' if args.gc_off else 'on'}, {STEPS} steps\n")
    table = _bench.Table(["optimizer", "analysed", "unchanged steps min/max", "smallest budget",
                          "steps at it min/max", "max / budget"])
    worst = 0.0
    for name in args.optimizers.split(","):
        base = _bench.run_worker(__file__, [name, "none", args.width], env=env)
        fit = _bench.run_worker(__file__, [name, "smallest", args.width], env=env)
        if "error" in base or "error" in fit:
            table.row(name, f"{base.get('error', '')} {fit.get('error', '')}", "", "", "", "")
            continue
        ratio = max(fit["peaks"]) / fit["budget"]
        worst = max(worst, ratio)
        table.row(name, f"{base['analysed']:,}", f"{min(base['peaks']):,} / {max(base['peaks']):,}",
                  f"{fit['budget']:,}", f"{min(fit['peaks']):,} / {max(fit['peaks']):,}",
                  f"{ratio:.4f}")
        sys.stdout.flush()
    print(f"\nworst max / budget: {worst:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
