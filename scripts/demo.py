"""The demo: memory_optimize on a ResNet-50 training program, end to end.

For each of Paddle's two runtime memory modes (garbage collection on, the
default, and off), it builds the same ResNet-50 training program twice,
rewrites one copy with ``memopt.memory_optimize(main, print_log=...)``, runs
a few training steps of both, checks that losses and every parameter are
bit-identical, and prints the peak of Paddle's allocator before and after;
with GC off also for a copy rewritten by ``memory_optimize`` and then
``memopt.release_memory`` (each temporary freed after its last use).
Finally it writes the memory timeline (live bytes per op, before and after,
GC off, beside Paddle's default mode) to ``out/timeline.png`` and the
interactive memory page (hover an op for who holds the memory) to
``out/memory.html``.

    python scripts/demo.py [--batch-size 8] [--image-size 96] [--steps 2]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))  # the shared bench harness
from _bench import Table, mib  # noqa: E402


def measured_run(model, steps: int):
    """Initialize and run ``steps`` training steps; return (losses,
    parameters, peak bytes), the peak being how far Paddle's host allocator
    rose above what was allocated before (memory still held by earlier
    programs in this process is not counted)."""
    import paddle
    from paddle.base import core

    from memopt.testing.models import parameter_names

    scope = paddle.static.Scope()
    rng = np.random.default_rng(1)
    with paddle.static.scope_guard(scope), model.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        base = core.host_memory_stat_current_value("Allocated", 0)
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        model.initialize(exe)
        losses = [np.array(exe.run(model.main, feed=model.feed(rng),
                                   fetch_list=[model.loss])[0]) for _ in range(steps)]
        peak = core.host_memory_stat_peak_value("Allocated", 0) - base
        params = [np.array(scope.find_var(n).get_tensor()) for n in parameter_names(model.main)]
    return losses, params, peak


def same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=96)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--level", type=int, default=1, choices=(0, 1))
    ap.add_argument("--out", default="out")
    args = ap.parse_args()

    import paddle

    import memopt
    from memopt.testing.models import build, flags
    from memopt.report import format_bytes

    paddle.enable_static()

    def resnet():
        return build("resnet50", "legacy", args.batch_size, image_size=args.image_size)

    print(f"memopt demo: ResNet-50 training, batch {args.batch_size}, "
          f"{args.image_size}x{args.image_size} images, {args.steps} steps, level {args.level}\n")
    rows = []
    for gc_label, gc_flag in (("on", 0.0), ("off", -1.0)):
        with flags(eager_delete_tensor_gb=gc_flag):
            reference = resnet()
            ref_losses, ref_params, ref_peak = measured_run(reference, args.steps)

            def rewritten_row(label, release):
                """Build, rewrite (memory_optimize, then release_memory if
                ``release``), run: the table row and memory_optimize's report."""
                model = resnet()
                t0 = time.perf_counter()
                # where the program will run (a legacy program in a Paddle 3
                # process runs under OldIrGuard, which the model's guard holds)
                with model.guard():
                    report = memopt.memory_optimize(
                        model.main, level=args.level,
                        print_log=(gc_label == "off" and not release))
                    if release:
                        freed = memopt.release_memory(model.main)
                        print(f"\nGC off, then release_memory: {len(freed.released)} "
                              "temporaries freed right after their last use")
                seconds = time.perf_counter() - t0
                losses, params, peak = measured_run(model, args.steps)
                identical = same(ref_losses, losses) and same(ref_params, params)
                return (label, ref_peak, peak, report.merged_count, seconds, identical,
                        ref_losses[-1]), report

            row, report = rewritten_row(gc_label, release=False)
            rows.append(row)
            if gc_label == "off":
                # GC off: release_memory frees each temporary after its last use
                rows.append(rewritten_row("off + release_memory", release=True)[0])
        if gc_label == "on":
            print(f"GC on: {report.merged_count} variables share memory "
                  f"({len(report.reuses)} reuses); memory released by: {report.release}\n")

    print()
    table = Table(["GC", "peak before", "peak after", "after/before", "merged", "optimize (s)",
                   "bit-identical", "last loss"])
    for gc_label, before, after, merged, seconds, identical, loss in rows:
        table.row(gc_label, f"{mib(before):.1f} MiB", f"{mib(after):.1f} MiB",
                  f"{after / before:.3f}", merged, f"{seconds:.3f}",
                  "yes" if identical else "NO", f"{float(loss):.6f}")

    from memopt.api import analyze
    from memopt.pages.writer import write_lanes
    from memopt.plot import plot_timeline

    os.makedirs(args.out, exist_ok=True)
    path, page = os.path.join(args.out, "timeline.png"), os.path.join(args.out, "memory.html")
    with flags(eager_delete_tensor_gb=0.0):  # Paddle's default: the collector frees early
        model = resnet()
        with model.guard():
            default = analyze(model.main, args.batch_size, fetch_list=[model.loss])
            memopt.memory_optimize(model.main, level=args.level)
            default_after = analyze(model.main, args.batch_size, fetch_list=[model.loss])
    with flags(eager_delete_tensor_gb=-1.0):
        model = resnet()
        with model.guard():
            before = analyze(model.main, args.batch_size, fetch_list=[model.loss])
            memopt.memory_optimize(model.main, level=args.level)
            after = analyze(model.main, args.batch_size, fetch_list=[model.loss])
            memopt.release_memory(model.main)
            freed = analyze(model.main, args.batch_size, fetch_list=[model.loss])
    done = f"after memory_optimize (level {args.level})"
    plot_timeline([before, after, freed, default], path, batch_size=args.batch_size,
                  labels=["GC off: before", f"GC off: {done}", "GC off: and release_memory",
                          "Paddle's default (GC on), unchanged"],
                  title=f"ResNet-50 training step, batch {args.batch_size}")
    write_lanes(page, [("Paddle's default: garbage collector on", [default, default_after],
                        ["before", done]),
                       ("garbage collector off (FLAGS_eager_delete_tensor_gb=-1)",
                        [before, after, freed], ["before", done, "and release_memory"])],
                batch_size=args.batch_size,
                title=f"ResNet-50 training step, batch {args.batch_size}: where the memory goes")
    print(f"\npredicted peak (GC off, step + parameters and optimizer state, as measured "
          f"above): {format_bytes(before.total_peak(args.batch_size))} before, "
          f"{format_bytes(after.total_peak(args.batch_size))} after memory_optimize, "
          f"{format_bytes(freed.total_peak(args.batch_size))} with release_memory too; "
          f"Paddle's default (GC on): {format_bytes(default.total_peak(args.batch_size))}; "
          f"timeline written to {path}, the interactive page to {page}")
    if not all(row[5] for row in rows):
        raise SystemExit("results differ after memory_optimize: this is a bug, please report it")


if __name__ == "__main__":
    main()
