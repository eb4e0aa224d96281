"""The demo: memopt for a Paddle user training an nn.Layer, then for a static program.

Part 1 (dygraph, how Paddle 3 users train): a Transformer-encoder classifier
(an ``nn.Layer``) and an Adam optimizer; ``memopt.analyze`` predicts the
peak of one training step before any step runs; the step is passed through
``paddle.jit.to_static`` and ``memopt.memory_optimize(step, level=2,
budget=..., batch_size=..., optimizer=opt)`` is installed on it, with a
budget at 80% of the predicted peak; a few steps of the same model with and
without memopt are trained and their measured step peaks, step times and
numbers (losses, every parameter: bit-identical) compared.

Part 2 (a static program): for each of Paddle's two runtime memory modes
(garbage collection on, the default, and off) the same ResNet-50 training
program is built twice, one copy rewritten by ``memopt.memory_optimize``;
both run a few steps, losses and parameters must be bit-identical, and the
allocator peaks are compared.  Finally the memory timeline (live bytes per
op, before and after, GC off, beside Paddle's default mode) goes to
``out/timeline.png`` and the interactive memory page (hover an op for who
holds the memory) to ``out/memory.html``.

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


# -- part 1: an nn.Layer trained through paddle.jit.to_static -----------------------

def encoder_classifier(paddle, width=128, layers=4, seq=64, vocab=2000):
    """A BERT-style classifier whose forward returns the loss."""
    nn = paddle.nn

    class Classifier(nn.Layer):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            block = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.1)
            self.encoder = nn.TransformerEncoder(block, layers)
            self.head = nn.Linear(width, 2)

        def forward(self, ids, label):
            h = self.encoder(self.embed(ids))
            return nn.functional.cross_entropy(self.head(h[:, 0]), label)

    return Classifier()


def train_layer(budget=None, batch=16, seq=64, steps=4):
    """Build the classifier and Adam (seeded), convert it with to_static,
    install memopt when ``budget`` is given, train ``2 + steps`` steps.
    Returns (memopt's handle or None, step peaks above the level before the
    model was built, step seconds, losses, parameters)."""
    import paddle
    from paddle.static import InputSpec

    import memopt
    from memopt.testing.dygraph_runs import allocated, peak, reset_peak

    base = allocated()
    paddle.seed(0)
    model = encoder_classifier(paddle, seq=seq)
    opt = paddle.optimizer.Adam(parameters=model.parameters())
    rng = np.random.default_rng(0)
    ids = paddle.to_tensor(rng.integers(0, 2000, (batch, seq)).astype("int64"))
    label = paddle.to_tensor(rng.integers(0, 2, (batch, 1)).astype("int64"))
    handle = None
    if budget == "analyze":   # predict before any step runs: nothing of the model changes
        spec = [InputSpec([None, seq], "int64", "ids"), InputSpec([None, 1], "int64", "label")]
        return memopt.analyze(model, input_spec=spec, optimizer=opt, mode="to_static")
    step = paddle.jit.to_static(model)
    if budget is not None:
        handle = memopt.memory_optimize(step, level=2, skip_grads=False, budget=budget,
                                        batch_size=batch, optimizer=opt)
    peaks, seconds, losses = [], [], []
    for k in range(2 + steps):
        reset_peak()
        t0 = time.perf_counter()
        loss = step(ids, label)
        loss.backward()
        opt.step()
        opt.clear_grad()
        if k >= 2:   # the first step makes the optimizer state; the second settles
            seconds.append(time.perf_counter() - t0)
            peaks.append(peak() - base)
        losses.append(float(loss))
    params = [p.numpy() for p in model.parameters()]
    if handle is not None:
        for record in handle.records:   # one per training program Paddle built
            r = record.report
            print(f"memopt rewrote to_static program {record.index} before its first run: "
                  f"{len(r.recomputed)} values recomputed in the backward part (+"
                  f"{r.added_compute_percent:.0f}% compute), {r.merged_count} ops in place; "
                  f"program peak predicted {mib(r.peak_before):.1f} -> {mib(r.peak_after):.1f} "
                  f"MiB")
        handle.remove()   # memopt off again: the next call builds Paddle's own program
    return handle, peaks, seconds, losses, params


def dygraph_part(steps: int) -> bool:
    from memopt.report import format_bytes

    batch = 16
    print(f"Part 1: a Transformer-encoder classifier (nn.Layer, 4 layers, width 128, "
          f"sequence 64), Adam, batch {batch}, trained through paddle.jit.to_static\n")
    analysis = train_layer("analyze", batch=batch)
    predicted = int(analysis.total_peak(batch))
    budget = int(0.8 * predicted)
    print(f"memopt.analyze(model, input_spec=..., optimizer=opt, mode='to_static'): one "
          f"training step peaks at {format_bytes(predicted)} (parameters, gradients, Adam "
          f"state, activations); memory_optimize gets a budget of 80% of that: "
          f"{format_bytes(budget)}\n")
    _, base_peaks, base_s, base_losses, base_params = train_layer(None, batch, steps=steps)
    _, peaks, secs, losses, params = train_layer(budget, batch, steps=steps)
    identical = base_losses == losses and same(base_params, params)
    print()
    table = Table(["step", "predicted", "measured peak (median, max)", "step time",
                   "bit-identical"])
    table.row("to_static", f"{mib(predicted):.1f} MiB",
              f"{mib(np.median(base_peaks)):.1f}, {mib(max(base_peaks)):.1f} MiB",
              f"{np.median(base_s):.2f} s", "")
    table.row(f"to_static + memopt (budget {mib(budget):.1f} MiB)", "",
              f"{mib(np.median(peaks)):.1f}, {mib(max(peaks)):.1f} MiB",
              f"{np.median(secs):.2f} s", "yes" if identical else "NO")
    print(f"\nmeasured step peak {mib(max(base_peaks)):.1f} -> {mib(max(peaks)):.1f} MiB "
          f"({max(peaks) / max(base_peaks):.2f}x); step times on a busy machine are noisy\n")
    return identical and max(peaks) <= budget


# -- part 2: a static program -------------------------------------------------------

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

    dygraph_ok = dygraph_part(args.steps + 2)
    paddle.enable_static()

    def resnet():
        return build("resnet50", "legacy", args.batch_size, image_size=args.image_size)

    print(f"Part 2: a static program: ResNet-50 training, batch {args.batch_size}, "
          f"{args.image_size}x{args.image_size} images, {args.steps} steps, level {args.level}\n")
    rows = []
    for gc_label, gc_flag in (("on", 0.0), ("off", -1.0)):
        with flags(eager_delete_tensor_gb=gc_flag):
            reference = resnet()
            ref_losses, ref_params, ref_peak = measured_run(reference, args.steps)

            def rewritten_row(label):
                """Build, rewrite, run: the table row and memory_optimize's report."""
                model = resnet()
                t0 = time.perf_counter()
                # where the program will run (a legacy program in a Paddle 3
                # process runs under OldIrGuard, which the model's guard holds)
                with model.guard():
                    report = memopt.memory_optimize(model.main, level=args.level,
                                                    print_log=(gc_label == "off"))
                seconds = time.perf_counter() - t0
                losses, params, peak = measured_run(model, args.steps)
                identical = same(ref_losses, losses) and same(ref_params, params)
                return (label, ref_peak, peak, report.merged_count, seconds, identical,
                        ref_losses[-1]), report

            row, report = rewritten_row(gc_label)
            rows.append(row)
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
    if not all(row[5] for row in rows) or not dygraph_ok:
        raise SystemExit("results differ after memory_optimize, or a step went over its budget: "
                         "this is a bug, please report it")


if __name__ == "__main__":
    main()
