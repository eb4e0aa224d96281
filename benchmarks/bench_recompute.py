"""Benchmark memory_optimize's level 2 and budget= on PIR training programs (CPU).

Every configuration runs in a fresh Python process under Paddle's default
flags (PIR, GC on, the in-place pass, the multi-thread executor): build the
model, optionally rewrite it, run the startup program and ``--steps``
training steps, and report the allocator's peak
(``paddle.base.core.host_memory_stat_peak_value('Allocated', 0)``: the
step's peak, parameters and optimizer state included), the median step time
(steps 2..n) and a digest of the losses and parameters (bit-identity).

Columns (one markdown table):

- ``default``: the unchanged program's peak; ``L2``: ``level=2``'s peak
  over it (target <= 1.0; <= 0.91 on U-Net, DenseNet, BERT); with
  ``--l2-only`` also the steady and worst step peaks over ``--repeat``
  processes, level 2's predicted peak and the any-order bound
  (:func:`memopt.paddle.pir.schedule.any_order_bound`: no order of the
  ops level 2 leaves is predicted under it) over the default's floor;
- ``b=X%``: ``memory_optimize(budget=X% of the default peak,
  batch_size=B)``: measured peak / budget (target <= 1.0; the largest over
  ``--repeat`` fresh processes), then the (median) step
  time over the default's (target <= 1.25 at 50%), or ``err`` for a
  BudgetError; monotone: the peak never rises as the budget falls;
- ``batch in budget``: the largest batch ``memory_optimize`` plans into
  the default peak at batch B (``budget=`` at 4B, or
  ``BudgetError.largest_batch`` when 4B does not fit: a batch checked by
  planning there, as ``Analysis.max_batch_size(recompute=True)`` gives it),
  then run at that batch: its measured peak / budget, against B (target
  >= 2x);
- ``auto_recompute``: Paddle's ``paddle.decomposition.recompute.
  auto_recompute`` on the same program: peak over the default, or its error;
- ``bit-identical``: every rewritten run's losses and parameters equal the
  default run's.

Usage::

    python benchmarks/bench_recompute.py                      # all models
    python benchmarks/bench_recompute.py --models unet,bert --steps 4
    python benchmarks/bench_recompute.py --floors             # the leanest plans' floors (model)
    python benchmarks/bench_recompute.py --heldout --repeat 10 --steps 10   # budgets that hold

``--heldout``: the promise of ``budget=`` on programs the tests and the
model's calibration do not have (:mod:`memopt.testing.heldout`: BERT-,
GPT-, U-Net-, VGG-style and a small CNN, small and large batches).  For
each program and fraction ``f`` the budget is the parameters and optimizer
state plus ``f`` of the rest of the unchanged step's peak as
``memopt.analyze`` gives it (:meth:`memopt.analysis.Analysis.step_peak`;
at ``f = 1`` memopt must return the program unchanged); each of
``--repeat`` fresh processes plans it (``memory_optimize(budget=...)``,
deterministic: every process gets the same plan) and runs ``--steps``
training steps under Paddle's default flags (GC on: the collector frees on
its own thread, so step peaks vary with the load).  One row per program x
fraction: the plan (recomputed values, or ``refused`` with BudgetError's
smallest budget: the reason), the steps within the budget (target >= 95%),
the median, 95th percentile and largest step peak over the budget, the
load average while it ran, and whether every process gave bit-identical
losses and parameters to the unchanged program's.
    python benchmarks/bench_recompute.py --l2-only --repeat 3 --steps 6   # the L2 column alone
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time

import _bench

#: row -> (batch size, size options): small enough for 2 CPU cores.  A row
#: ``name-<label>`` builds model ``name`` (the rows after the first six).
BENCH_MODELS = {
    "resnet50": (8, {"image_size": 64}),
    "mobilenet_v2": (16, {"image_size": 64}),
    "bert": (16, {"seq_len": 64}),
    "gpt": (16, {"seq_len": 64}),
    "unet": (16, {}),
    "densenet": (16, {}),
    # 8 layers instead of 2: activations dominate the step, as in the deep
    # models that run out of memory; at 2 layers one layer's backward
    # working set plus the collector's late frees is already ~0.7 of the
    # step (so no budget of 50% or less can fit any plan there)
    "bert-8L": (16, {"seq_len": 64, "layers": 8}),
    "gpt-8L": (16, {"seq_len": 64, "layers": 8}),
    # the CNNs at the sizes where they run out of memory: larger batches and
    # images, activations >= 70% of the default step's peak
    "resnet50-b32": (32, {"image_size": 96}),
    "mobilenet_v2-b32": (32, {"image_size": 128}),
    "unet-256": (8, {"image_size": 256}),
    "densenet-128": (16, {"image_size": 128}),
}
FRACTIONS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3)


def model_of(row: str) -> str:
    """The :func:`memopt.testing.models.build` name of a bench row."""
    return row.split("-")[0]


def worker(model: str, config: str, batch: int, budget: int, steps: int) -> dict:
    import paddle

    paddle.enable_static()
    import memopt
    from memopt.testing import models

    opts = dict(BENCH_MODELS[model][1])
    m = models.build(model_of(model), "pir", batch_size=batch, **opts)
    out: dict = {"model": model, "config": config, "batch": batch, "budget": budget}
    t0 = time.perf_counter()
    try:
        if config in ("L1", "L2"):  # L1: level 1 alone (what level 2 started from)
            report = memopt.memory_optimize(m.main, level=int(config[1]), batch_size=batch)
            out["predicted"] = report.peak_after
            if config == "L2":  # no order of the ops level 2 leaves is predicted lower
                from memopt.paddle.pir.schedule import any_order_bound

                out["bound"] = any_order_bound(m.main, batch)[0]
        elif config == "budget":
            report = memopt.memory_optimize(m.main, budget=budget, batch_size=batch)
            out["predicted"] = report.peak_after
            out["added"] = report.added_compute_percent
            out["recomputed"] = len(report.recomputed)
        elif config == "auto":
            _auto_recompute(m)
    except memopt.BudgetError as exc:
        out.update(error="BudgetError", smallest=exc.smallest_budget, largest=exc.largest_batch)
        return out
    except Exception as exc:  # Paddle's auto_recompute: report what it says
        out["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:120]}"
        return out
    out["optimize_s"] = time.perf_counter() - t0
    startup_peak, step_peaks, times, digest = measured_steps(m, steps)
    # the run's peak (startup and every step), as one unreset reading gives
    out["peak"] = max([startup_peak, *step_peaks])
    out["step_peaks"] = step_peaks
    out["step_s"] = _bench.median(times[1:] or times)
    out["digest"] = digest
    return out


def _auto_recompute(m) -> None:
    """Paddle's own auto_recompute on the training program: forward = the
    ops up to the loss, backward from the first gradient op."""
    from paddle.decomposition.recompute import auto_recompute

    from memopt.paddle.pir.program import convert

    pg = convert(m.main)
    ops = m.main.global_block().ops
    roles = [op.role for op in pg.graph.blocks[0].ops]
    bwd = roles.index("backward")
    loss_op = m.loss.get_defining_op()
    fwd_end = next(i for i, op in enumerate(ops) if op.id() == loss_op.id())
    inputs = [op.result(0) for op in ops if op.name() == "pd_op.data"]
    seed = ops[bwd].result(0) if ops[bwd].name().startswith("pd_op.full") else None
    grads = [seed] if seed is not None else []
    auto_recompute(m.main, inputs, [m.loss], grads, fwd_end, bwd)


def run(model: str, config: str, batch: int, budget: int, steps: int) -> dict:
    out = _bench.run_worker(__file__, [model, config, batch, budget, steps])
    return out if "error" not in out else {"model": model, "config": config, **out}


def mib(n: float) -> str:
    return f"{_bench.mib(n):.1f} MiB"


def _repeated(model: str, batch: int, budget: int, steps: int, repeat: int) -> dict:
    """A budget run in ``repeat`` fresh processes: the largest peak (the
    promise is about the worst run), the median step time; ``digests`` all
    of them."""
    runs = [run(model, "budget", batch, budget, steps) for _ in range(max(repeat, 1))]
    ok = [r for r in runs if "peak" in r]
    if len(ok) < len(runs):
        return next(r for r in runs if "peak" not in r)
    out = dict(max(ok, key=lambda r: r["peak"]))
    out["step_s"] = _bench.median(r["step_s"] for r in ok)
    out["peaks"] = [r["peak"] for r in ok]
    out["digests"] = sorted({r["digest"] for r in ok})
    return out


def bench_model(model: str, steps: int, repeat: int = 1, fractions=FRACTIONS) -> dict:
    batch = BENCH_MODELS[model][0]
    base = run(model, "default", batch, 0, steps)
    row = {"model": model, "batch": batch, "base": base, "budgets": [], "same": True}
    if "peak" not in base:
        return row
    row["l2"] = run(model, "L2", batch, 0, steps)
    for f in fractions:
        r = _repeated(model, batch, int(base["peak"] * f), steps, repeat)
        row["budgets"].append((f, r))
    # the largest batch memory_optimize plans into the default peak at `batch`
    # (BudgetError.largest_batch: checked by planning at it), then run there
    budget = int(base["peak"])
    probe = run(model, "budget", 4 * batch, budget, 1)
    big = probe.get("largest") if probe.get("error") == "BudgetError" else 4 * batch
    fit = run(model, "budget", big, budget, steps) if big else {"error": "none"}
    row["big"] = (big, fit)
    row["auto"] = run(model, "auto", batch, 0, steps)
    for r in [row["l2"], *(r for _, r in row["budgets"])]:
        if any(d != base["digest"] for d in r.get("digests", [r.get("digest", base["digest"])])):
            row["same"] = False
    return row


def measured_steps(m, steps: int) -> tuple:
    """``(startup peak, [step peak], [step seconds], digest)`` of ``steps``
    training steps of built model ``m`` in a fresh scope, seeded feeds; the
    digest (hex) covers every loss and the parameters after the steps."""
    import numpy as np
    import paddle
    from paddle.base import core

    from memopt.testing import models

    rng = np.random.default_rng(1)
    scope = paddle.static.Scope()
    times, digest, step_peaks = [], hashlib.sha256(), []
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        m.initialize(exe)
        startup_peak = core.host_memory_stat_peak_value("Allocated", 0)
        for _ in range(steps):
            feed = m.feed(rng)
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            t = time.perf_counter()
            loss = exe.run(m.main, feed=feed, fetch_list=[m.loss])[0]
            times.append(time.perf_counter() - t)
            step_peaks.append(core.host_memory_stat_peak_value("Allocated", 0))
            digest.update(np.asarray(loss).tobytes())
        for name in models.parameter_names(m.main):
            digest.update(np.array(scope.find_var(name).get_tensor()).tobytes())
    return startup_peak, step_peaks, times, digest.hexdigest()


def budget_choices(row: str) -> tuple:
    """``(batch, model, runtime, pir graph, default peak, choices)`` of
    ``row`` built as a PIR training program at its batch: the model's
    default peak and the plans ``budget=`` may choose there
    (:func:`memopt.paddle.pir.budget.vouched`), in the model only."""
    import paddle

    paddle.enable_static()
    from memopt.testing import models
    from memopt.pipeline.pir import analysed
    from memopt.paddle import flags
    from memopt.paddle.pir import program as pir, budget as pir_budget

    batch, opts = BENCH_MODELS[row]
    m = models.build(model_of(row), "pir", batch_size=batch, **dict(opts))
    runtime = flags.runtime_model("pir")
    pg = pir.convert(m.main)
    default = analysed(pg, batch, runtime).total_peak(batch)
    _, grid = pir_budget.recompute_choices(pg, batch, runtime)
    return batch, m, runtime, pg, default, pir_budget.vouched(grid, runtime)


def floor_row(row: str) -> list:
    """One markdown row: what the leanest plan of ``row`` (the lowest
    checked peak: :func:`memopt.paddle.pir.budget.guarded_peak`) still
    holds at its steady peak, in the model at the row's batch (MiB)."""
    batch, _, _, _, default, choices = budget_choices(row)
    lean = min(choices, key=lambda c: (c.peak, c.plan.flops))
    held = lean.prediction.held_at(batch_size=batch)

    def held_mib(*categories) -> str:
        return f"{_bench.mib(sum(h.bytes(batch) for h in held if h.category in categories)):.2f}"

    steady = lean.prediction.total_peak(batch)
    return [row, f"{_bench.mib(default):.2f}", lean.label,
            f"{_bench.mib(lean.peak):.2f} ({lean.peak / default:.2f})",
            f"{_bench.mib(lean.prediction.persistable_bytes(batch)):.2f}", held_mib("input"),
            held_mib("activation"), held_mib("gradient", "optimizer"), held_mib("workspace"),
            f"{_bench.mib(lean.peak - steady):.2f}", f"+{lean.plan.added_percent:.0f}%"]


def floors(rows: list) -> str:
    """The table of :func:`floor_row` for ``rows`` (``--floors``)."""
    head = ["row", "default steady", "leanest plan", "its checked peak (of default)",
            "params + optimizer", "fed inputs", "kept activations",
            "backward values (grads, recomputed)", "conv workspace", "late-free allowance",
            "FLOPs"]
    lines: list = []
    table = _bench.Table(head, out=lines.append)
    for r in rows:
        table.row(*floor_row(r))
    return "\n".join(lines)
def bench_l2(model: str, steps: int, repeat: int) -> dict:
    """``level=2`` against the default, each in ``repeat`` fresh processes
    (alternating): the floor (median over processes of each process's
    least step peak, steps 2..n: the peak the plan decides, when Paddle's
    collector keeps up in some step), the steady step peak (the same with
    each process's median step peak) and the worst (the largest
    whole-run peak over the processes; Paddle's collector frees on its own
    thread, so a step's peak varies with the load)."""
    batch = BENCH_MODELS[model][0]
    runs: dict = {"default": [], "L2": []}
    for _ in range(max(repeat, 1)):
        for config in runs:
            runs[config].append(run(model, config, batch, 0, steps))
    row = {"model": model, "batch": batch}
    for config, rs in runs.items():
        ok = [r for r in rs if "peak" in r]
        if len(ok) < len(rs):
            row["error"] = next(r for r in rs if "peak" not in r).get("error", "?")
            return row
        row[config] = {
            "steady": _bench.median(_bench.median(r["step_peaks"][1:] or r["step_peaks"])
                                    for r in ok),
            "floor": _bench.median(min(r["step_peaks"][1:] or r["step_peaks"]) for r in ok),
            "worst": max(r["peak"] for r in ok), "digests": sorted({r["digest"] for r in ok}),
            "step_s": _bench.median(r["step_s"] for r in ok),
            "bound": ok[0].get("bound"), "predicted": ok[0].get("predicted")}
    row["same"] = row["default"]["digests"] == row["L2"]["digests"] \
        and len(row["default"]["digests"]) == 1
    return row


def l2_table(rows: list) -> str:
    head = ["model", "batch", "default steady", "default worst", "L2 steady", "L2 worst",
            "L2 / default, floor", "L2 / default, steady", "L2 / default, worst",
            "step time L2 / default",
            "L2 predicted", "any-order bound / default floor", "bit-identical"]
    out: list = []
    table = _bench.Table(head, out=out.append)
    for row in rows:
        if "error" in row:
            table.row(row["model"], row["batch"], row["error"], *[""] * (len(head) - 3))
            continue
        d, l2 = row["default"], row["L2"]
        table.row(row["model"], row["batch"], mib(d["steady"]), mib(d["worst"]),
                  mib(l2["steady"]), mib(l2["worst"]), f"{l2['floor'] / d['floor']:.3f}",
                  f"{l2['steady'] / d['steady']:.3f}",
                  f"{l2['worst'] / d['worst']:.3f}", f"{l2['step_s'] / d['step_s']:.2f}x",
                  mib(l2["predicted"]), f"{l2['bound'] / d['floor']:.3f}",
                  "yes" if row["same"] else "NO")
    return "\n".join(out)


def table(rows: list) -> str:
    fractions = [f for f, _ in rows[0]["budgets"]] if rows else FRACTIONS
    head = ["model", "batch", "default", "L2"] + [f"b={round(f * 100)}%" for f in fractions] \
        + ["monotone", "batch in budget", "auto_recompute", "bit-identical"]
    out: list = []
    table = _bench.Table(head, out=out.append)
    for row in rows:
        base = row["base"]
        if "peak" not in base:
            table.row(row["model"], row["batch"], base.get("error"), *[""] * (len(head) - 3))
            continue
        cells = [row["model"], str(row["batch"]), mib(base["peak"])]
        l2 = row["l2"]
        cells.append(f"{l2['peak'] / base['peak']:.3f}" if "peak" in l2 else l2.get("error", "?"))
        peaks = []
        for _, r in row["budgets"]:
            if "peak" in r:
                cells.append(f"{r['peak'] / r['budget']:.2f} / {r['step_s'] / base['step_s']:.2f}x"
                             f" (+{r.get('added', 0):.0f}%)")
                peaks.append(r["peak"])
            else:
                cells.append("err" if r.get("error") == "BudgetError" else r.get("error", "?"))
        mono = all(b <= a * 1.02 for a, b in zip(peaks, peaks[1:]))
        cells.append("yes" if mono else "no")
        big, fit = row["big"]
        if big and "peak" in fit:
            cells.append(f"{big} vs {row['batch']} ({big / row['batch']:.1f}x; "
                         f"{fit['peak'] / fit['budget']:.2f})")
        else:
            cells.append(f"{big} ({fit.get('error', '?')})")
        auto = row["auto"]
        cells.append(f"{auto['peak'] / base['peak']:.3f}"
                     + ("" if auto.get("digest") == base["digest"] else " (not bit-identical)")
                     if "peak" in auto else auto.get("error", "?")[:60])
        cells.append("yes" if row["same"] else "NO")
        table.row(*cells)
    return "\n".join(out)


HELDOUT_FRACTIONS = (1.0, 0.8, 0.6)


def heldout_worker(row: str, fraction: float, steps: int) -> dict:
    """One fresh process of ``--heldout``: plan ``row`` for its budget
    (``fraction``; 0 runs the unchanged program as a reference), run
    ``steps`` steps, return the step peaks and a digest."""
    import paddle

    paddle.enable_static()
    import memopt
    from memopt.testing import heldout

    kind, batch, opts = heldout.HELDOUT[row]
    m = heldout.build(kind, batch, **dict(opts))
    an = memopt.analyze(m.main, batch, fetch_list=[m.loss])
    params = an.persistable_bytes()
    budget = params + int(fraction * (an.step_peak() - params)) if fraction else 0
    out: dict = {"row": row, "batch": batch, "budget": budget, "model": an.step_peak(),
                 "steady": an.total_peak()}
    if fraction:
        try:
            report = memopt.memory_optimize(m.main, budget=budget, batch_size=batch,
                                            fetch_list=[m.loss])
        except memopt.BudgetError as exc:
            out.update(error="BudgetError", smallest=exc.smallest_budget,
                       largest=exc.largest_batch)
            return out
        out.update(recomputed=len(report.recomputed), added=report.added_compute_percent,
                   predicted=report.peak_after)
    _, step_peaks, times, digest = measured_steps(m, steps)
    out.update(step_peaks=step_peaks, digest=digest, step_s=statistics.median(times))
    return out


def _load() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def bench_heldout(rows: list, fractions, steps: int, repeat: int) -> list:
    """``--heldout``: per row, the unchanged program's digest, then each
    fraction in ``repeat`` fresh processes (see the module docstring)."""
    out = []
    for row in rows:
        ref = run(row, "heldout", 0, 0, steps)
        for f in fractions:
            runs, loads = [], []
            for _ in range(max(repeat, 1)):
                loads.append(_load())
                r = run(row, "heldout", 0, f, steps)
                runs.append(r)
                if "step_peaks" not in r:
                    break  # refused (deterministic) or crashed: no point repeating
            out.append({"row": row, "fraction": f, "runs": runs, "ref": ref.get("digest"),
                        "loads": loads})
            print(f"{row} {f}: {len(runs)} runs", file=sys.stderr)
    return out


def heldout_table(results: list) -> str:
    head = ["program", "budget (f of the step)", "plan", "steps within budget",
            "median / budget", "p95 / budget", "max / budget", "load", "bit-identical"]
    lines: list = []
    _bench.Table(head, out=lines.append)
    for res in results:
        runs, first = res["runs"], res["runs"][0]
        cell0 = f"{res['row']} (batch {first.get('batch', '?')})"
        budget = first.get("budget", 0)
        bcell = f"{mib(budget)} ({res['fraction']:.0%})" if budget else "?"
        if first.get("error") == "BudgetError":
            lines.append("| " + " | ".join([
                cell0, bcell, f"refused: smallest budget {mib(first['smallest'])}, largest "
                f"batch {first['largest']}", "-", "-", "-", "-", f"{res['loads'][0]:.1f}",
                "-"]) + " |")
            continue
        ok = [r for r in runs if "step_peaks" in r]
        if len(ok) < len(runs):
            lines.append(f"| {cell0} | {bcell} | {runs[-1].get('error', '?')[:80]} |")
            continue
        peaks = sorted(p for r in ok for p in r["step_peaks"])
        n = len(peaks)
        within = sum(p <= budget for p in peaks)
        plan = (f"{first['recomputed']} recomputed (+{first['added']:.0f}%)"
                if first.get("recomputed") else "unchanged")
        same = all(r["digest"] == res["ref"] for r in ok)
        lines.append("| " + " | ".join([
            cell0, bcell, plan, f"{within}/{n} ({within / n:.0%})",
            f"{statistics.median(peaks) / budget:.3f}",
            f"{peaks[min(n - 1, int(0.95 * n))] / budget:.3f}", f"{peaks[-1] / budget:.3f}",
            f"{min(res['loads']):.1f}-{max(res['loads']):.1f}", "yes" if same else "NO"]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(BENCH_MODELS))
    parser.add_argument("--fractions", default=",".join(str(f) for f in FRACTIONS),
                        help="budgets as shares of the default run's peak")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=1,
                        help="fresh processes per budget run (the table shows the largest peak)")
    parser.add_argument("--l2-only", action="store_true",
                        help="only level 2 against the default, each in --repeat processes")
    parser.add_argument("--worker", nargs=5, metavar=("MODEL", "CONFIG", "BATCH", "BUDGET",
                                                      "STEPS"))
    parser.add_argument("--heldout", action="store_true",
                        help="budgets on memopt.testing.heldout's programs: per-step "
                             "distribution over --repeat fresh processes")
    parser.add_argument("--floors", action="store_true",
                        help="print what each row's leanest plan holds at its peak (model only)")
    args = parser.parse_args(argv)
    if args.floors:
        print(floors(args.models.split(",")))
        return 0
    if args.worker:
        model, config, batch, budget, steps = args.worker
        if config == "heldout":
            print(json.dumps(heldout_worker(model, float(budget), int(steps))))
            return 0
        print(json.dumps(worker(model, config, int(batch), int(budget), int(steps))))
        return 0
    if args.heldout:
        from memopt.testing.heldout import HELDOUT

        rows = [r for r in args.models.split(",") if r in HELDOUT] or list(HELDOUT)
        fractions = tuple(float(f) for f in args.fractions.split(",")) \
            if args.fractions != ",".join(str(f) for f in FRACTIONS) else HELDOUT_FRACTIONS
        results = bench_heldout(rows, fractions, args.steps, args.repeat)
        print(json.dumps(results, default=str), file=sys.stderr)
        print(heldout_table(results))
        return 0
    fractions = tuple(float(f) for f in args.fractions.split(","))
    if args.l2_only:
        rows = [bench_l2(model, args.steps, args.repeat) for model in args.models.split(",")]
        print(json.dumps(rows, default=str), file=sys.stderr)
        print(l2_table(rows))
        return 0
    rows = []
    for model in args.models.split(","):
        t = time.time()
        rows.append(bench_model(model, args.steps, args.repeat, fractions))
        print(f"{model}: {time.time() - t:.0f} s", file=sys.stderr)
    print(json.dumps(rows, default=str), file=sys.stderr)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
