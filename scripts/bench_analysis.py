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

Target: predicted within 10% of measured at every row.

Usage::

    python scripts/bench_analysis.py            # every model, both IRs
    python scripts/bench_analysis.py --quick    # MLP and CNN only
    python scripts/bench_analysis.py --models resnet50 --irs pir

Prints a markdown table.
"""
import argparse
import json
import os
import subprocess
import sys
import time

#: model -> (build options, three batch sizes)
CONFIGS = {
    "mlp": ({"hidden": 1024, "in_features": 1024}, (256, 1024, 4096)),
    "cnn": ({"image_size": 32}, (64, 128, 256)),
    "resnet50": ({"image_size": 64}, (8, 16, 32)),
    "mobilenet_v2": ({"image_size": 64}, (8, 16, 32)),
    "transformer": ({"seq_len": 64, "d_model": 128, "d_ff": 512}, (16, 32, 64)),
}
STEPS = 5
MIB = float(1 << 20)


def measure(name: str, ir: str, batch: int) -> dict:
    """One configuration, in this process (run by the parent in a fresh one)."""
    import numpy as np
    import paddle
    from paddle.base import core

    from memopt import analysis, models

    options, _ = CONFIGS[name]
    model = models.build(name, ir=ir, batch_size=batch, **options)
    start = time.perf_counter()
    with models.ir_guard(ir):
        result = analysis.analyze(model.main, batch, fetch_list=model.fetch_list)
    seconds = time.perf_counter() - start
    scope = paddle.static.Scope()
    rng = np.random.default_rng(0)
    peaks = []
    with paddle.static.scope_guard(scope), models.ir_guard(ir):
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        base = core.host_memory_stat_current_value("Allocated", 0)
        for _ in range(STEPS):
            feed = model.feed(rng)
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            exe.run(model.main, feed=feed, fetch_list=model.fetch_list)
            peaks.append(core.host_memory_stat_peak_value("Allocated", 0) - base)
    measured = float(np.median(peaks[1:]))
    return {"model": name, "ir": ir, "batch": batch, "predicted": result.peak(),
            "measured": measured, "min": min(peaks[1:]), "max": max(peaks[1:]),
            "persistable_predicted": result.persistable_bytes(), "persistable_measured": base,
            "ops": len(result.op_types), "analyze_s": seconds}


def run_child(name: str, ir: str, batch: int) -> dict:
    env = dict(os.environ, GLOG_minloglevel="2", PYTHONWARNINGS="ignore")
    out = subprocess.run([sys.executable, __file__, "--one", name, ir, str(batch)],
                         capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["?"]
        return {"model": name, "ir": ir, "batch": batch, "error": tail[0]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--irs", nargs="+", default=["pir", "legacy"], choices=["pir", "legacy"])
    parser.add_argument("--quick", action="store_true", help="MLP and CNN only")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "IR", "BATCH"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        name, ir, batch = args.one
        print(json.dumps(measure(name, ir, int(batch))))
        return
    names = ["mlp", "cnn"] if args.quick else args.models
    print(f"Paddle {_paddle_version()}, CPU, {os.cpu_count()} cores; measured = median "
          f"allocator peak over steps 2-{STEPS}, minus memory held after startup\n")
    print("| model | IR | batch | ops | predicted MiB | measured MiB (min-max) | "
          "predicted/measured | within 10% | params pred/meas | analyze s |")
    print("|---|---|---:|---:|---:|---:|---:|:---:|---:|---:|")
    worst = 0.0
    for name in names:
        for ir in args.irs:
            for batch in CONFIGS[name][1]:
                row = run_child(name, ir, batch)
                if "error" in row:
                    print(f"| {name} | {ir} | {batch} | - | - | - | - | error | - | "
                          f"{row['error'][:60]} |")
                    continue
                ratio = row["predicted"] / row["measured"]
                worst = max(worst, abs(ratio - 1))
                print(f"| {name} | {ir} | {batch} | {row['ops']} | "
                      f"{row['predicted'] / MIB:.1f} | {row['measured'] / MIB:.1f} "
                      f"({row['min'] / MIB:.1f}-{row['max'] / MIB:.1f}) | {ratio:.3f} | "
                      f"{'yes' if abs(ratio - 1) <= 0.10 else 'NO'} | "
                      f"{row['persistable_predicted'] / max(row['persistable_measured'], 1):.3f}"
                      f" | {row['analyze_s']:.2f} |", flush=True)
    print(f"\nlargest deviation: {worst * 100:.1f}%")


def _paddle_version() -> str:
    try:
        from importlib.metadata import version

        return version("paddlepaddle")
    except Exception:  # pragma: no cover
        return "?"


if __name__ == "__main__":
    main()
