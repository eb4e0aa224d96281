"""``budget=`` and ``level=2`` on PIR training programs whose top-level block
runs an ``if`` / ``while`` (``memopt.testing.models.REGION_MODEL_NAMES``), CPU.

Each configuration runs in a fresh process: ``default`` (the unchanged
program), ``level2`` and ``budget`` at a fraction ``f`` of the unchanged
program's guarded predicted peak (``pir_budget.guarded_peak`` with the
loops' trip counts, ``pir_loops.runtime_for``: what budgets are checked
against).  A process builds the model, applies memopt, runs the
startup program, resets the allocator's peak and runs ``--steps`` training
steps; ``peak`` is ``host_memory_stat_peak_value('Allocated', 0)`` over them
(parameters and optimizer state included).  Reported per row: the peak, the
peak over the budget, the added FLOPs the report gives, whether losses,
fetches and parameters equal the unchanged run's bit for bit; a BudgetError
row says whether the program was left exactly as it was.

Usage::

    python scripts/sweep_regions.py                      # both models
    python scripts/sweep_regions.py --fractions 0.95,0.9 --steps 4
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys

import _bench

FRACTIONS = (0.95, 0.9, 0.85)


def worker(name: str, config: str, fraction: float, steps: int) -> dict:
    import numpy as np
    import paddle
    from paddle.base import core

    import memopt
    from memopt.testing import models
    from memopt.paddle.flags import runtime_model
    from memopt.paddle.pir.budget import guarded_peak
    from memopt.paddle.pir.loops import runtime_for

    model = models.build(name, "pir")
    batch = model.batch_size
    out: dict = {"model": name, "config": config, "fraction": fraction, "batch": batch}
    if config == "budget":
        # as budget= checks it: the loops' trip counts read from the program
        runtime = runtime_for(model.main, runtime_model("pir"), budget=True)
        default = guarded_peak(memopt.analyze(model.main, batch, runtime=runtime), batch)
        budget = int(default * fraction)
        out["budget"] = budget
        before = str(model.main)
        try:
            report = memopt.memory_optimize(model.main, budget=budget, batch_size=batch,
                                            fetch_list=model.fetch_list)
        except memopt.BudgetError as exc:
            out.update(error="BudgetError", smallest=exc.smallest_budget,
                       unchanged=str(model.main) == before)
            return out
        out.update(added=report.added_compute_percent, recomputed=len(report.recomputed))
    elif config == "level2":
        report = memopt.memory_optimize(model.main, level=2, batch_size=batch,
                                        fetch_list=model.fetch_list)
        out["notes"] = [n for n in report.notes if n.startswith("level 2")]
    rng = np.random.default_rng(3)
    digest = hashlib.sha256()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), models.ir_guard("pir"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        for _ in range(steps):
            for value in exe.run(model.main, feed=model.feed(rng),
                                 fetch_list=model.fetch_list):
                digest.update(np.asarray(value).tobytes())
        out["peak"] = core.host_memory_stat_peak_value("Allocated", 0)
        for pname in models.parameter_names(model.main):
            digest.update(np.array(scope.find_var(pname).get_tensor()).tobytes())
    out["digest"] = digest.hexdigest()
    return out


def run(name: str, config: str, fraction: float, steps: int, repeat: int = 1) -> dict:
    """The worker's result in ``repeat`` fresh processes, the highest peak
    kept (``peaks``: all of them); an error or a digest that differs
    between the runs is returned as it is."""
    runs = [_run_once(name, config, fraction, steps) for _ in range(repeat)]
    if any("peak" not in r for r in runs) or len({r["digest"] for r in runs}) > 1:
        return next((r for r in runs if "peak" not in r), runs[0])
    out = max(runs, key=lambda r: r["peak"])
    out["peaks"] = [r["peak"] for r in runs]
    return out


def _run_once(name: str, config: str, fraction: float, steps: int) -> dict:
    return _bench.run_worker(__file__, [name, config, repr(fraction), steps])


def table(name: str, steps: int, fractions, repeat: int) -> str:
    base = run(name, "default", 0.0, steps, repeat)
    if "peak" not in base:
        return f"| {name} | {base.get('error')} |"
    l2 = run(name, "level2", 0.0, steps, repeat)
    low = min(base["peaks"])
    cells = [name, str(base["batch"]), f"{low / 2 ** 20:.2f}-{base['peak'] / 2 ** 20:.2f} MiB",
             f"{min(l2['peaks']) / low:.3f}" + ("" if l2["digest"] == base["digest"]
                                               else " NOT-IDENTICAL")]
    for f in fractions:
        r = run(name, "budget", f, steps, repeat)
        if "peak" in r:
            same = "same" if r["digest"] == base["digest"] else "NOT-IDENTICAL"
            cells.append(f"{r['peak'] / r['budget']:.3f} (+{r['added']:.1f}% FLOPs, "
                         f"{r['recomputed']} rec, {same})")
        elif r.get("error") == "BudgetError":
            cells.append(f"BudgetError (smallest {r['smallest'] / 2 ** 20:.2f} MiB, "
                         + ("unchanged)" if r["unchanged"] else "CHANGED)"))
        else:
            cells.append(r.get("error", "?")[:80])
    return "| " + " | ".join(cells) + " |"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", nargs=4, metavar=("MODEL", "CONFIG", "FRACTION", "STEPS"))
    parser.add_argument("--models", default="cond_mlp,while_mlp,dense_cond")
    parser.add_argument("--fractions", default=",".join(map(str, FRACTIONS)))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2,
                        help="fresh processes per configuration (the highest peak is kept)")
    args = parser.parse_args(argv)
    if args.worker:
        name, config, fraction, steps = args.worker
        print(json.dumps(worker(name, config, float(fraction), int(steps))))
        return 0
    fractions = [float(f) for f in args.fractions.split(",")]
    head = ["model", "batch", "default peak (min-max)", "L2 / default (min/min)"] + [
        f"budget {f:g} x predicted: max measured / budget" for f in fractions]
    _bench.Table(head)
    for name in args.models.split(","):
        print(table(name, args.steps, fractions, args.repeat), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
