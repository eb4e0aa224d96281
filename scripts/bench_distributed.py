"""memopt on Paddle's distributed training programs: two real CPU ranks.

Each configuration is one ``paddle.distributed.spawn(nprocs=2,
backend="gloo")``: both ranks build their program with
``paddle.distributed.fleet`` (data parallel, sharding, gradient merge; see
``memopt/paddle/fleet_models.py`` for what Paddle 3.3.1 runs on a CPU and the
errors of what it does not), optionally rewrite it with
``memopt.memory_optimize`` (levels 0 and 1; ``release_memory`` too with the GC
off), train a few steps and record their losses, every persistable variable
and the allocator's peak (``host_memory_stat_peak_value('Allocated', 0)``).
``memopt.estimate`` predicts each rank's peak from the program and the
strategy alone (the one-device program for unoptimized rows, the rewritten
rank program for memopt rows).

Prints a markdown table: configuration x (bit-identical to the unoptimized run
on every rank, measured peak per rank, estimate, estimate / measured).  Exit
status 1 when any rewritten run is not bit-identical (or a rank fails).

    python scripts/bench_distributed.py --quick     # under 8 minutes
    python scripts/bench_distributed.py             # + GC-on and L0 rows everywhere
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from memopt.dist_runs import RunConfig, launch, same_results  # noqa: E402


def configurations(quick: bool) -> list:
    rows = []
    for gc in (True, False):
        rows.append(RunConfig(mode="single", gc=gc))
    # GC on: unoptimized only (see NOT_RUNNABLE: a legacy program memopt
    # rewrote in place does not run translated to PIR, which the collectives need)
    rows.append(RunConfig(mode="dp", gc=True))
    rows += [RunConfig(mode="dp", gc=False), RunConfig(mode="dp", level=0, gc=False),
             RunConfig(mode="dp", level=1, gc=False)]
    for mode in ("sharding1", "gm") + (() if quick else ("sharding2",)):
        rows += [RunConfig(mode=mode, gc=False), RunConfig(mode=mode, level=1, gc=False)]
        if not quick:
            rows += [RunConfig(mode=mode, gc=True), RunConfig(mode=mode, level=0, gc=False)]
    return rows


#: What Paddle 3.3.1 on this CPU machine cannot run, with the error (measured).
NOT_RUNNABLE = [
    ("fleet on a CPU build (any meta optimizer)", "ValueError: comm_id must be generated in "
     "paddlepaddle-xpu or paddlepaddle-xpu. (startup communicator set-up; skipped, the gloo "
     "group comes from init_parallel_env)"),
    ("collectives in the legacy executor", "NotFoundError: interface not found "
     "(device_manager.cc:293) for all_reduce/broadcast/reduce/all_gather/reduce_scatter; "
     "'Operator \"c_allreduce_sum\" has not been registered' (also c_broadcast, c_reduce_sum, "
     "c_allgather, c_reducescatter): run with FLAGS_enable_pir_in_executor=1"),
    ("fused data parallel (fuse_all_reduce_ops)", "SystemError: Op depend should have "
     "corresponding OpInfo pd_op.depend_"),
    ("sharding / gradient merge as built", "c_sync_calc_stream: PreconditionNotMet: op "
     "[pd_op.sync_calc_stream_] kernel output args (0) defs should equal op outputs (1); "
     "c_sync_comm_stream: The kernel `sync_comm_stream` is not registered (both stripped "
     "for the run, after memopt planned with them)"),
    ("sharding's ring 1", "UnavailableError: NCCLCommContext is nullptr, collective op should "
     "has ring_id attr (broadcast_kernel.cc:40); dist.new_group does not register it: the run "
     "moves sharding's collectives to ring 0, the same two ranks"),
    ("pipeline parallel (send_v2 / recv_v2)", "UnavailableError: Do not support send for cpu "
     "kernel now (send_v2_op.h:32)"),
    ("release_memory with the GC off, run with FLAGS_enable_pir_in_executor=1 (also without "
     "fleet)", "refused by memopt (UnsupportedProgramError, program unchanged): the translation "
     "makes each share_buffer release a pd_op.share_data_ whose result is the variable it "
     "reads. (memory_optimize with the GC on failed there with 'Tensor holds no memory' at "
     "pd_op.subtract_grad_ until it stopped redirecting dims-only reads under that flag)"),
]


def span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.3f}" if f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f}-{hi:.3f}"


def mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rows (under 8 minutes)")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    started = time.time()
    base: dict = {}
    lines = ["| configuration | bit-identical (every rank) | measured peak MiB (rank 0 / 1) "
             "| estimate MiB | estimate / measured | step 1: measured MiB, ratio |",
             "|---|---|---|---|---|---|"]
    failed = False
    for config in configurations(args.quick):
        config = RunConfig(**{**config.__dict__, "steps": args.steps})
        t0 = time.time()
        try:
            records = launch(config, tempfile.mkdtemp(prefix="memopt-dist-"))
        except Exception as exc:  # a rank failed: say which and go on
            message = " ".join(str(exc).split())[-300:]
            lines.append(f"| {config.label} | FAILED: {message} | | | | |")
            print(f"{config.label}: FAILED {message}", file=sys.stderr, flush=True)
            failed = True
            continue
        key = (config.mode, config.gc)
        if config.level is None:
            base[key] = records
            same = "reference"
        elif key not in base:
            same = "no reference"
            failed = True
        else:
            ok = all(same_results(a, b) for a, b in zip(base[key], records))
            same = "yes" if ok else "NO"
            failed |= not ok
        peaks = [r["peak"] for r in records]
        estimate = records[0]["estimate"]
        ratios = [estimate / p for p in peaks]
        first = [r["peak_step1"] for r in records]
        first_ratios = [estimate / p for p in first]
        lines.append(f"| {config.label} | {same} | {' / '.join(mib(p) for p in peaks)} | "
                     f"{mib(estimate)} | {span(ratios)} | "
                     f"{' / '.join(mib(p) for p in first)}, {span(first_ratios)} |")
        print(f"{config.label}: {same}, peaks {peaks}, estimate {estimate} "
              f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    print("\n".join(lines))
    print("\nNot runnable here (Paddle 3.3.1, CPU, gloo):\n")
    for what, error in NOT_RUNNABLE:
        print(f"- {what}: {error}")
    print(f"\n{time.time() - started:.0f} s; model: MLP 256-512-512-512-1, Momentum, "
          f"batch 64 per rank, {args.steps} steps (gradient merge: twice as many micro-steps)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
