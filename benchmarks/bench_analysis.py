"""How close memopt.analyze's predicted peak is to what Paddle really allocates.

For each benchmark model, IR and batch size, in a fresh process: build the
training program, predict the peak of non-persistable memory of one step
(``memopt.analyze``), then run the startup program and 5 training steps on
Paddle's executor (CPU, default flags: GC on, PIR in-place pass on,
multi-thread executor) and read the allocator's peak
(``paddle.base.core.host_memory_stat_peak_value('Allocated', 0)``, reset
before each step) minus what is allocated after the startup program
(parameters, optimizer state).  The measured figure is the median over
steps 2-5: the multi-thread executor's schedule makes single steps vary.
PIR programs are also measured with the garbage collector off
(``FLAGS_eager_delete_tensor_gb=-1``, the executor's in-place pass on): the
``GC`` column.  The recurrent models (``lstm``, ``gru`` with per-row
``sequence_length``) run ``paddle.nn.LSTM`` / ``GRU``, whose kernels keep
memory PIR's types do not show (:mod:`memopt.paddle.kernel_memory`).

Target: predicted within 10% of measured at every row.

With ``--optimize`` it measures instead what ``memopt.memory_optimize``
does to PIR programs (ops turned into in-place variants), before and after,
under Paddle's default flags and with GC and the executor's own in-place
pass off (``FLAGS_eager_delete_tensor_gb=-1``,
``FLAGS_pir_apply_inplace_pass=0``).

With ``--legacy-gc-off`` it checks the prediction for legacy programs that
memopt rewrote, with the garbage collector off: unoptimized, after
``memory_optimize(level=1)`` and after that plus ``release_memory`` (the
renamed variables are one buffer each, released ones end at their release).

Usage::

    python benchmarks/bench_analysis.py            # every model, both IRs
    python benchmarks/bench_analysis.py --quick    # MLP and CNN only
    python benchmarks/bench_analysis.py --models resnet50 --irs pir
    python benchmarks/bench_analysis.py --models lstm gru --gc off
    python benchmarks/bench_analysis.py --optimize
    python benchmarks/bench_analysis.py --legacy-gc-off

Prints a markdown table.
"""
import argparse
import dataclasses
import json
import os
import sys
import time

import _bench

#: model -> (build options, three batch sizes)
CONFIGS = {
    "mlp": ({"hidden": 1024, "in_features": 1024}, (256, 1024, 4096)),
    "cnn": ({"image_size": 32}, (64, 128, 256)),
    "resnet50": ({"image_size": 64}, (8, 16, 32)),
    "mobilenet_v2": ({"image_size": 64}, (8, 16, 32)),
    "transformer": ({"seq_len": 64, "d_model": 128, "d_ff": 512}, (16, 32, 64)),
    "lstm": ({"seq_len": 32, "features": 64, "hidden": 256}, (64, 128, 256)),
    "gru": ({"seq_len": 32, "features": 64, "hidden": 256}, (64, 128, 256)),
}
STEPS = 5
#: --optimize: model -> (build options, batch size)
OPTIMIZE = {
    "mlp": ({"hidden": 1024, "in_features": 1024}, 1024),
    "cnn": ({"image_size": 32}, 128),
    "transformer": ({"seq_len": 64, "d_model": 128, "d_ff": 512}, 32),
    "while_loop": ({"hidden": 1024}, 1024),
    "nested_cond": ({"hidden": 1024}, 1024),
}
FLAG_SETS = {
    "default (GC on, pass on)": {},
    "GC off, pass off": {"FLAGS_eager_delete_tensor_gb": "-1",
                         "FLAGS_pir_apply_inplace_pass": "0"},
}


def _run_steps(model):
    """Median allocator peak over steps 2.. minus memory after startup."""
    from memopt.testing import models

    peaks, base = models.step_peaks(model, STEPS)
    return float(_bench.median(peaks[1:])), min(peaks[1:]), max(peaks[1:]), base


def measure_optimize(name: str, optimize: bool) -> dict:
    """PIR model ``name``, optimized or not, run under the process's flags."""
    import memopt
    from memopt import api
    from memopt.testing import models
    from memopt.paddle.flags import runtime_model
    from memopt.paddle.pir.program import value_name

    options, batch = OPTIMIZE[name]
    model = models.build(name, ir="pir", batch_size=batch, **options)
    rewritten = 0
    if optimize:
        report = memopt.memory_optimize(model.main, level=1, skip_grads=False,
                                        skip_opt_set=[value_name(v) for v in model.fetch_list])
        rewritten = report.merged_count
    # a while loop's trip count is known only at run time: tell the analysis
    runtime = runtime_model("pir")
    runtime = dataclasses.replace(runtime, loop_iterations=model.options.get("steps", 1))
    predicted = api.analyze(model.main, batch, runtime=runtime).peak()
    measured, low, high, _ = _run_steps(model)
    return {"model": name, "batch": batch, "optimized": optimize, "rewritten": rewritten,
            "predicted": predicted, "measured": measured, "min": low, "max": high}


#: --legacy-gc-off: what is done to the legacy program before it is analysed and run
LEGACY_MODES = ("none", "L1", "L1+release")
#: --legacy-gc-off models (of OPTIMIZE): legacy while/conditional training
#: programs do not translate to PIR, so analyze() refuses them
LEGACY_MODELS = ("mlp", "cnn", "transformer")


def measure_legacy(name: str, mode: str) -> dict:
    """Legacy model ``name`` with GC off (set by the parent), rewritten per
    ``mode`` (see :data:`LEGACY_MODES`): predicted and measured peak."""
    import memopt
    from memopt import api
    from memopt.testing import models
    from memopt.paddle.flags import runtime_model

    options, batch = OPTIMIZE[name]
    model = models.build(name, ir="legacy", batch_size=batch, **options)
    keep = [model.fetch_list[1]]
    with models.ir_guard("legacy"):
        if mode != "none":
            memopt.memory_optimize(model.main, level=1, skip_grads=False, skip_opt_set=keep)
        if mode == "L1+release":
            memopt.release_memory(model.main, skip_opt_set=keep)
        runtime = runtime_model("legacy")
        runtime = dataclasses.replace(runtime, loop_iterations=model.options.get("steps", 1))
        predicted = api.analyze(model.main, batch, fetch_list=model.fetch_list,
                                     runtime=runtime).peak()
    measured, low, high, _ = _run_steps(model)
    return {"model": name, "batch": batch, "mode": mode, "predicted": predicted,
            "measured": measured, "min": low, "max": high}


def legacy_table(names) -> None:
    table = _bench.Table(["model", "batch", "rewrite", "predicted MiB", "measured MiB",
                          "predicted/measured"], "lrlrrr")
    for name in names:
        for mode in LEGACY_MODES:
            row = run_child(["--one-legacy", name, mode], {"FLAGS_eager_delete_tensor_gb": "-1"})
            if "error" in row:
                table.row(name, "-", mode, "-", "-", f"error: {row['error'][:60]}")
                continue
            table.row(name, row["batch"], mode, f"{_bench.mib(row['predicted']):.1f}",
                      f"{_bench.mib(row['measured']):.1f}",
                      f"{row['predicted'] / row['measured']:.3f}")
            sys.stdout.flush()


def measure(name: str, ir: str, batch: int) -> dict:
    """One configuration, in this process (run by the parent in a fresh one)."""
    from memopt import api
    from memopt.testing import models

    options, _ = CONFIGS[name]
    model = models.build(name, ir=ir, batch_size=batch, **options)
    start = time.perf_counter()
    with models.ir_guard(ir):
        result = api.analyze(model.main, batch, fetch_list=model.fetch_list)
    seconds = time.perf_counter() - start
    measured, low, high, base = _run_steps(model)
    return {"model": name, "ir": ir, "batch": batch, "predicted": result.peak(),
            "measured": measured, "min": low, "max": high,
            "persistable_predicted": result.persistable_bytes(), "persistable_measured": base,
            "ops": len(result.op_types), "analyze_s": seconds}


def run_child(args: list, flags: dict = None) -> dict:
    """Run this script's worker mode ``args[0]`` (``--one``, ``--one-opt``,
    ``--one-legacy``) with ``args[1:]`` in a fresh process (with Paddle
    ``flags`` in its environment) and return the JSON it prints."""
    return _bench.run_worker(__file__, args[1:], {"PYTHONWARNINGS": "ignore", **(flags or {})},
                             flag=args[0])


def optimize_table(names) -> None:
    table = _bench.Table(["model", "flags", "batch", "ops made in place", "measured before MiB",
                          "measured after MiB", "after/before", "predicted before -> after MiB"],
                         "llrrrrrr")
    for name in names:
        for label, flags in FLAG_SETS.items():
            before = run_child(["--one-opt", name, "0"], flags)
            after = run_child(["--one-opt", name, "1"], flags)
            if "error" in before or "error" in after:
                err = before.get("error") or after.get("error")
                table.row(name, label, "-", "-", "-", "-", "error", err[:60])
                continue
            table.row(name, label, before["batch"], after["rewritten"],
                      f"{_bench.mib(before['measured']):.1f}",
                      f"{_bench.mib(after['measured']):.1f}",
                      f"{after['measured'] / before['measured']:.3f}",
                      f"{_bench.mib(before['predicted']):.1f} -> "
                      f"{_bench.mib(after['predicted']):.1f}")
            sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=None,
                        choices=sorted(set(CONFIGS) | set(OPTIMIZE)))
    parser.add_argument("--irs", nargs="+", default=["pir", "legacy"], choices=["pir", "legacy"])
    parser.add_argument("--quick", action="store_true", help="MLP and CNN only")
    parser.add_argument("--gc", nargs="+", default=["on", "off"], choices=["on", "off"],
                        help="garbage collector on and/or off (off: PIR programs only)")
    parser.add_argument("--optimize", action="store_true",
                        help="measure memory_optimize on PIR programs instead")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "IR", "BATCH"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--one-opt", nargs=2, metavar=("MODEL", "OPTIMIZE"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--legacy-gc-off", action="store_true",
                        help="check predictions for legacy programs memopt rewrote, GC off")
    parser.add_argument("--one-legacy", nargs=2, metavar=("MODEL", "MODE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        name, ir, batch = args.one
        print(json.dumps(measure(name, ir, int(batch))))
        return
    if args.one_opt:
        name, flag = args.one_opt
        print(json.dumps(measure_optimize(name, flag == "1")))
        return
    if args.one_legacy:
        print(json.dumps(measure_legacy(*args.one_legacy)))
        return
    if args.legacy_gc_off:
        print(f"Paddle {_paddle_version()}, CPU, {os.cpu_count()} cores; legacy programs, GC "
              f"off; measured = median allocator peak over steps 2-{STEPS}, minus memory "
              "held after startup\n")
        legacy_table([m for m in LEGACY_MODELS if args.models is None or m in args.models])
        return
    if args.optimize:
        print(f"Paddle {_paddle_version()}, CPU, {os.cpu_count()} cores; PIR programs, "
              "memopt.memory_optimize(level=1, skip_grads=False); measured = median allocator "
              f"peak over steps 2-{STEPS}\n")
        optimize_table([m for m in OPTIMIZE if args.models is None or m in args.models])
        return
    names = ["mlp", "cnn"] if args.quick else [m for m in CONFIGS if args.models is None
                                               or m in args.models]
    print(f"Paddle {_paddle_version()}, CPU, {os.cpu_count()} cores; measured = median "
          f"allocator peak over steps 2-{STEPS}, minus memory held after startup\n")
    table = _bench.Table(["model", "IR", "GC", "batch", "ops", "predicted MiB",
                          "measured MiB (min-max)", "predicted/measured", "within 10%",
                          "params pred/meas", "analyze s"], "lllrrrrrcrr")
    worst = 0.0
    for name in names:
        for ir in args.irs:
            for gc in args.gc:
                if gc == "off" and ir != "pir":
                    continue  # legacy with GC off: --legacy-gc-off
                flags = {"FLAGS_eager_delete_tensor_gb": "-1"} if gc == "off" else {}
                for batch in CONFIGS[name][1]:
                    row = run_child(["--one", name, ir, batch], flags)
                    if "error" in row:
                        table.row(name, ir, gc, batch, "-", "-", "-", "-", "error", "-",
                                  row["error"][:60])
                        continue
                    ratio = row["predicted"] / row["measured"]
                    worst = max(worst, abs(ratio - 1))
                    table.row(name, ir, gc, batch, row["ops"],
                              f"{_bench.mib(row['predicted']):.1f}",
                              f"{_bench.mib(row['measured']):.1f} ({_bench.mib(row['min']):.1f}-"
                              f"{_bench.mib(row['max']):.1f})", f"{ratio:.3f}",
                              "yes" if abs(ratio - 1) <= 0.10 else "NO",
                              f"{row['persistable_predicted'] / max(row['persistable_measured'], 1):.3f}",
                              f"{row['analyze_s']:.2f}")
    print(f"\nlargest deviation: {worst * 100:.1f}%")


def _paddle_version() -> str:
    try:
        from importlib.metadata import version

        return version("paddlepaddle")
    except Exception:  # pragma: no cover
        return "?"


if __name__ == "__main__":
    main()
