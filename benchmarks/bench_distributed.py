"""memopt on Paddle's distributed training programs: two real CPU ranks.

Each configuration is one ``paddle.distributed.spawn(nprocs=2,
backend="gloo")``: both ranks build their program with
``paddle.distributed.fleet`` (data parallel, sharding, gradient merge; see
``memopt/testing/fleet_models.py`` for what Paddle 3.3.1 runs on a CPU and the
errors of what it does not), optionally rewrite it with
``memopt.memory_optimize`` (levels 0 and 1; ``release_memory`` too with the GC
off), train a few steps and record their losses, every persistable variable
and the allocator's peak (``host_memory_stat_peak_value('Allocated', 0)``).
``memopt.estimate`` predicts each rank's peak from the program and the
strategy alone (the one-device program for unoptimized rows, the rewritten
rank program for memopt rows).

Prints a markdown table: configuration x (bit-identical to the unoptimized run
on every rank, measured peak per rank, estimate per rank, estimate /
measured).  GC-on rows run in several fresh processes: the peak of one
configuration moves from step to step and process to process with the GC on
(Paddle's CPU garbage collector frees on a worker thread); the table gives the
median step over all runs (the ratio is taken on it) and the worst step.  Exit status 1 when any
rewritten run is not bit-identical, a rank fails, or an estimate is more
than 10% off the measured peak.

    python benchmarks/bench_distributed.py --quick     # under 8 minutes
    python benchmarks/bench_distributed.py             # + GC-on and L0 rows everywhere
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import _bench  # noqa: E402
from memopt.testing.dist_runs import (AutoParallelConfig, RunConfig, launch,  # noqa: E402
                              launch_auto_parallel, same_results)


#: A second model shape (the unoptimized rows only): other layer sizes, so
#: other owners under sharding and other buffer sizes everywhere.
SECOND = dict(features=512, hidden=1024, layers=2)


def configurations(quick: bool) -> list:
    rows = []
    for gc in (True, False):
        rows.append(RunConfig(mode="single", gc=gc))
    # GC on: memory_optimize plans for the PIR executor the collectives need
    # (no dims-only substitutions there); release_memory is refused there
    rows += [RunConfig(mode="dp", gc=True), RunConfig(mode="dp", level=0, gc=True),
             RunConfig(mode="dp", level=1, gc=True)]
    rows += [RunConfig(mode="dp", gc=False), RunConfig(mode="dp", level=0, gc=False),
             RunConfig(mode="dp", level=1, gc=False)]
    for mode in ("sharding1", "gm") + (() if quick else ("sharding2",)):
        rows += [RunConfig(mode=mode, gc=False), RunConfig(mode=mode, level=1, gc=False)]
        if not quick:
            rows += [RunConfig(mode=mode, gc=True), RunConfig(mode=mode, level=0, gc=False)]
    rows += [RunConfig(mode=mode, gc=False, **SECOND) for mode in ("dp", "sharding1", "gm")]
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
    ("auto-parallel (paddle.distributed.to_static) unpatched", "DistModel.train(): "
     "AssertionError: No CUDA device found (process_group.py:205); then the parameter "
     "initialisation's barrier: (Unavailable) NCCLCommContext is nullptr "
     "(barrier_kernel.cc:32); shard_dataloader under numpy 2: TypeError: only 0-dimensional "
     "arrays can be converted to Python scalars (all three patched for the auto-parallel "
     "rows: memopt/testing/auto_parallel_models.py)"),
    ("auto-parallel across meshes (pipeline cut: send_v2 / recv_v2)", "SIGSEGV in "
     "paddle.reshard while DistModel.train() initialises the parameters "
     "(phi::distributed::GetDefaultPlace -> DeviceManager::GetDeviceCount); the programs "
     "are built and checked with that step skipped, not run"),
    ("release_memory with the GC off, run with FLAGS_enable_pir_in_executor=1 (also without "
     "fleet)", "refused by memopt (UnsupportedProgramError, program unchanged): the translation "
     "makes each share_buffer release a pd_op.share_data_ whose result is the variable it "
     "reads. (memory_optimize with the GC on failed there with 'Tensor holds no memory' at "
     "pd_op.subtract_grad_ until it stopped redirecting dims-only reads under that flag)"),
]


def auto_parallel_configurations(quick: bool) -> list:
    """Auto-parallel (``mp``, ``dp``) and plain PIR data parallel (``pir_dp``)
    rows: memory_optimize on the rank's PIR program after Paddle's parallel
    passes, against the unoptimized run (bit-identity only: the peaks of
    these few-KiB programs are the allocator's noise)."""
    rows = []
    for mode in ("mp", "dp", "pir_dp"):
        for gc in (False, True):
            rows.append(AutoParallelConfig(mode=mode, gc=gc))
            levels = ((0,) if gc else (1,)) if quick else (0, 1)
            rows += [AutoParallelConfig(mode=mode, level=level, gc=gc) for level in levels]
    return rows


def auto_parallel_table(quick: bool, steps: int) -> tuple:
    """``(lines, failed)``: configuration x (bit-identical on every rank,
    communication ops, ops made in place, ops left alone for a
    communication buffer)."""
    lines: list = []
    table = _bench.Table(["configuration", "bit-identical (every rank)",
                          "communication ops (rank 0)", "made in place",
                          "left alone: communication buffer"], out=lines.append)
    failed = False
    base: dict = {}
    reason = "communication buffer (in flight until the end of the step)"
    for config in auto_parallel_configurations(quick):
        config = AutoParallelConfig(**{**config.__dict__, "steps": steps})
        try:
            records = launch_auto_parallel(config, tempfile.mkdtemp(prefix="memopt-ap-"))
        except Exception as exc:  # a rank failed: say which and go on
            message = " ".join(str(exc).split())[-300:]
            table.row(config.label, f"FAILED: {message}", "", "", "")
            failed = True
            continue
        comm = ", ".join(sorted(set(records[0]["comm_ops"])))
        if config.level is None:
            base[(config.mode, config.gc)] = records
            table.row(config.label, "reference", comm, "", "")
            continue
        ref = base.get((config.mode, config.gc))
        ok = ref is not None and all(same_results(a, b) for a, b in zip(ref, records, strict=True)) \
            and all(r["comm_ops_after"] == r["comm_ops"] and not r["inplace_on_communication"]
                    for r in records)
        failed |= not ok
        table.row(config.label, "yes" if ok else "NO", comm, records[0]["merged"],
                  records[0]["not_merged"].get(reason, 0))
        print(f"{config.label}: {'yes' if ok else 'NO'}", file=sys.stderr, flush=True)
    return lines, failed


def span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.3f}" if f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f}-{hi:.3f}"


def mib(n: int) -> str:
    return f"{_bench.mib(n):.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rows (under 8 minutes)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gc-runs", type=int, default=None,
                        help="fresh runs of each GC-on row (default 3, 5 without --quick)")
    parser.add_argument("--no-auto-parallel", action="store_true",
                        help="leave out the auto-parallel / plain PIR rows")
    args = parser.parse_args(argv)
    gc_runs = args.gc_runs or (3 if args.quick else 5)
    started = time.time()
    base: dict = {}
    lines: list = []
    table = _bench.Table(["configuration", "bit-identical (every rank)",
                          "measured peak MiB (rank 0 / 1)", "estimate MiB (rank 0 / 1)",
                          "estimate / measured", "step 1: measured MiB, ratio"],
                         out=lines.append)
    failed = False
    off: list = []
    for config in configurations(args.quick):
        config = RunConfig(**{**config.__dict__, "steps": args.steps})
        t0 = time.time()
        runs = []
        try:
            for _ in range(gc_runs if config.gc else 1):
                runs.append(launch(config, tempfile.mkdtemp(prefix="memopt-dist-")))
        except Exception as exc:  # a rank failed: say which and go on
            message = " ".join(str(exc).split())[-300:]
            table.row(config.label, f"FAILED: {message}", "", "", "", "")
            print(f"{config.label}: FAILED {message}", file=sys.stderr, flush=True)
            failed = True
            continue
        records = runs[0]
        key = (config.mode, config.gc, config.features, config.hidden, config.layers)
        if config.level is None:
            base[key] = records
            same = "reference"
            # fresh processes of one configuration: the same results
            if any(not same_results(a, b) for other in runs[1:]
                   for a, b in zip(records, other, strict=True)):
                same = "reference, NOT repeatable"
                failed = True
        elif key not in base:
            same = "no reference"
            failed = True
        else:
            ok = all(same_results(a, b) for other in runs
                     for a, b in zip(base[key], other, strict=True))
            same = "yes" if ok else "NO"
            failed |= not ok
        estimates = [r["estimate"] for r in records]
        if config.gc:
            # GC on: the typical step -- the median over every step of every
            # fresh run (gradient merge: the steps that update) -- and the
            # worst step (Paddle's CPU GC frees on a worker thread: a step
            # whose frees lag peaks higher)
            update = [k for k in range(len(records[0]["step_peaks"]))
                      if config.mode != "gm" or k % 2 == 1]
            peaks = [_bench.median([run[r]["step_peaks"][k] for run in runs
                                    for k in update]) for r in range(len(records))]
        else:
            peaks = [run0["peak"] for run0 in records]
        highs = [max(run[r]["peak"] for run in runs) for r in range(len(records))]
        lows = [min(run[r]["step_peaks"][k] for run in runs
                    for k in range(len(run[r]["step_peaks"]))
                    if config.mode != "gm" or k % 2 == 1) for r in range(len(records))]
        ratios = [e / p for e, p in zip(estimates, peaks, strict=True)]
        if any(abs(r - 1) > 0.10 for r in ratios):
            off.append(config.label)
        first = [_bench.median([run[k]["peak_step1"] for run in runs])
                 for k in range(len(records))]
        first_ratios = [e / p for e, p in zip(estimates, first, strict=True)]
        measured = " / ".join(mib(p) for p in peaks)
        if config.gc:
            measured += (f" (median step of {len(runs)} runs; lowest step "
                         + " / ".join(mib(x) for x in lows) + "; worst step "
                         + " / ".join(mib(h) for h in highs) + ")")
        table.row(config.label, same, measured, " / ".join(mib(e) for e in estimates),
                  span(ratios), f"{' / '.join(mib(p) for p in first)}, {span(first_ratios)}")
        built = [r.get("estimate_as_built") for r in records]
        print(f"{config.label}: {same}, peaks {[[r['peak'] for r in run] for run in runs]}, "
              f"estimate {estimates} (as fleet built it, with stream syncs: {built}) "
              f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    print("\n".join(lines))
    if not args.no_auto_parallel:
        ap_lines, ap_failed = auto_parallel_table(args.quick, args.steps)
        failed |= ap_failed
        print("\nAuto-parallel (paddle.distributed.to_static; MLP 16-32-1, SGD, batch 8) and "
              "plain PIR data parallel (pd_op.all_reduce_), memory_optimize on the rank's PIR "
              "program:\n")
        print("\n".join(ap_lines))
    print("\nNot runnable here (Paddle 3.3.1, CPU, gloo):\n")
    for what, error in NOT_RUNNABLE:
        print(f"- {what}: {error}")
    print(f"\nEstimate outside 10% of the measured peak: {', '.join(off) or 'none'}")
    print(f"\n{time.time() - started:.0f} s; model: MLP 256-512-512-512-1 (and "
          f"{SECOND['features']}-{SECOND['hidden']}x{SECOND['layers']}-1 where marked), "
          f"Momentum, batch 64 per rank, {args.steps} steps (gradient merge: twice as many "
          f"micro-steps); GC-on rows: {gc_runs} fresh runs each")
    return 1 if failed or off else 0


if __name__ == "__main__":
    sys.exit(main())
