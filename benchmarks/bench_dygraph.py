"""memopt on dygraph training: predicted vs measured step peaks, budgets, largest batch.

One markdown table per question, every cell measured in a fresh Python
process (:func:`memopt.testing.to_static_runs.train_fresh`): a step is
``loss = step(*inputs); loss.backward(); opt.step(); opt.clear_grad()`` with
Adam, the peak is Paddle's host allocator peak over the step above the
level before the model was built (parameters, gradients, optimizer state
and inputs included), over ``--steps`` steady steps after 2 warm-up steps.

1. **Prediction**: model x mode (eager; to_static SOT; to_static full
   graph): ``memopt.analyze(step, input_spec=..., optimizer=..., mode=...)``'s
   ``total_peak(batch)`` against the measured median / min / max.
2. **Budgets**: ``memory_optimize(step, level=2, skip_grads=False,
   budget=f * P, batch_size=b, optimizer=opt)`` on the to_static step, P the
   mode's measured default step peak (max), f = 100/70/50%: measured max /
   budget, median step time over the default's (two processes: noisy under
   load), losses, gradients and parameters bit-identical to the default.
   The same for ``memopt.suggest_recompute`` on the eager step.
3. **Largest batch at the default peak**: the budget P at batch b; without
   memopt b (P is measured there); with memopt the largest of
   ``--batch-factors`` x b whose ``memory_optimize(budget=P)`` plans and
   whose measured steps all stay within P (full graph).

``--quick`` runs smaller configurations of the same models (minutes on two
loaded cores); the default ones are the real sizes (ResNet-50 at 224x224,
batch 32; 8-layer BERT/GPT), which take hours there.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

import _bench

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: model -> (kind of memopt.testing.dygraph_models, batch, size keywords): real sizes
REAL = {
    "resnet50": ("resnet", 32, dict(depth=50, image=224, classes=1000)),
    "mobilenetv2": ("mobilenet", 32, dict(scale=1.0, image=224, classes=1000)),
    "bert-8L": ("bert", 16, dict(layers=8, width=256, heads=4, ffn=1024, seq=128, vocab=8000)),
    "gpt-8L": ("gpt", 8, dict(layers=8, width=256, heads=4, seq=128, vocab=8000)),
    "lstm": ("lstm", 32, dict(inputs=128, hidden=512, layers=2, seq=64)),
    "unet": ("unet", 8, dict(width=32, image=128)),
    "vit": ("vit", 32, dict(image=64, patch=8, width=192, heads=4, layers=6)),
}
#: the same models, smaller
QUICK = {
    "resnet50": ("resnet", 16, dict(depth=50, image=128, classes=100)),
    "mobilenetv2": ("mobilenet", 16, dict(scale=1.0, image=64, classes=100)),
    "bert-8L": ("bert", 16, dict(layers=8, width=128, heads=4, ffn=512, seq=64, vocab=2000)),
    "gpt-8L": ("gpt", 8, dict(layers=8, width=128, heads=4, seq=64, vocab=2000)),
    "lstm": ("lstm", 32, dict(inputs=64, hidden=256, layers=2, seq=32)),
    "unet": ("unet", 4, dict(width=16, image=64)),
    "vit": ("vit", 16, dict(image=32, patch=4, width=96, heads=4, layers=4)),
}
MODES = ("eager", "sot", "full_graph")
FRACTIONS = (1.0, 0.7, 0.5)


# -- one cell, in its own process ---------------------------------------------------------

def worker(spec: dict) -> dict:
    """Run one cell (``spec``: kind, batch, size, mode, steps and one of
    ``memopt`` / ``predict`` / ``recompute``) and return what it measured."""
    from memopt.testing.to_static_runs import train

    kind, batch, size, mode = spec["kind"], spec["batch"], spec["size"], spec["mode"]
    if spec.get("predict"):
        return {"predicted": _predict(kind, batch, size, mode)}
    try:
        run = train(kind, batch=batch, mode=mode, steps=spec["steps"], warmup=2,
                    memopt=spec.get("memopt"), recompute=spec.get("recompute"), **size)
    except Exception as exc:  # a refusal is a result: BudgetError names the smallest budget
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[-1][:300]}",
                "smallest": getattr(exc, "smallest_budget", 0)}
    if run.error:
        return {"error": run.error, "smallest": run.smallest_budget}
    out = {"peaks": run.peaks, "seconds": run.seconds, "losses": run.losses,
           "grads": run.grads, "params": run.params, "programs": run.programs}
    return out


def _predict(kind: str, batch: int, size: dict, mode: str) -> Optional[int]:
    """``memopt.analyze(step, ...)``'s total peak of the step at ``batch``."""
    import memopt
    from memopt.testing import dygraph_models

    step, _, opt = dygraph_models.build(kind, batch=batch, **size)
    analysis = memopt.analyze(step, input_spec=dygraph_models.spec(kind, **size),
                              optimizer=opt, mode="eager" if mode == "eager" else "to_static")
    return int(analysis.total_peak(batch))


def cell(spec: dict) -> dict:
    return _bench.run_worker(__file__, [json.dumps(spec)], timeout=7200,
                             env={"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})


# -- the tables ------------------------------------------------------------------------

def _mib(n) -> str:
    return f"{_bench.mib(n):.1f}"


def _same(a: dict, b: dict) -> str:
    if "error" in a or "error" in b:
        return "-"
    same = a["losses"] == b["losses"] and a["grads"] == b["grads"] and a["params"] == b["params"]
    return "yes" if same and a["params"] else "NO"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller configurations")
    parser.add_argument("--models", default=",".join(REAL), help="comma-separated")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    parser.add_argument("--steps", type=int, default=3, help="steady steps per cell")
    parser.add_argument("--fractions", default="1.0,0.7,0.5")
    parser.add_argument("--budget-modes", default=None,
                        help="modes of the budget table (default: --modes)")
    parser.add_argument("--batch-factors", default="1.5,2,3",
                        help="batch multiples tried for the largest batch")
    parser.add_argument("--no-predict", action="store_true",
                        help="leave the predicted column out")
    parser.add_argument("--tables", default="prediction,budgets,batch",
                        help="which tables (comma-separated); the defaults are measured "
                             "for any of them")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    table_of = QUICK if args.quick else REAL
    tables = set(args.tables.split(","))
    models = [m for m in args.models.split(",") if m]
    modes = [m for m in args.modes.split(",") if m]
    fractions = [float(f) for f in args.fractions.split(",") if f]
    print(f"bench_dygraph ({'quick' if args.quick else 'real'} sizes, {args.steps} steady "
          "steps per cell, a fresh process per cell; peaks in MiB)\n")
    defaults = {}
    print("### Prediction: memopt.analyze vs measured step peaks\n")
    t = _bench.Table(["model", "batch", "mode", "predicted", "median", "min", "max",
                      "predicted / median"], "llrrrrrr")
    for model in models:
        kind, batch, size = table_of[model]
        for mode in modes:
            spec = dict(kind=kind, batch=batch, size=size, mode=mode, steps=args.steps)
            got = cell(spec)
            defaults[(model, mode)] = got
            pred = None if args.no_predict or "prediction" not in tables else \
                cell(dict(spec, predict=True)).get("predicted")
            if "error" in got:
                t.row(model, batch, mode, "-", got["error"][:60], "", "", "")
                continue
            peaks = got["peaks"]
            med = _bench.median(peaks)
            t.row(model, batch, mode, _mib(pred) if pred else "-", _mib(med), _mib(min(peaks)),
                  _mib(max(peaks)), f"{pred / med:.3f}" if pred else "-")
    if "budgets" not in tables:
        fractions = []
    else:
        print("\n### Budgets: memory_optimize on the to_static step (and suggest_recompute, eager)\n")
        t = _bench.Table(["model", "mode", "budget", "budget MiB", "measured max / budget",
                          "step time / default", "bit-identical", "programs"], "llrrrrll")
    budget_modes = args.budget_modes.split(",") if args.budget_modes else modes
    for model in models:
        kind, batch, size = table_of[model]
        for mode in budget_modes:
            base = defaults.get((model, mode))
            if not base or "error" in base:
                continue
            for f in fractions:
                budget = int(f * max(base["peaks"]))
                spec = dict(kind=kind, batch=batch, size=size, mode=mode, steps=args.steps)
                if mode == "eager":
                    spec["recompute"] = {"budget": budget}
                    label = "eager (suggest_recompute)"
                else:
                    spec["memopt"] = {"level": 2, "skip_grads": False, "budget": budget}
                    label = mode
                got = cell(spec)
                if "error" in got:
                    smallest = got.get("smallest") or 0
                    why = (f"refused: smallest {_mib(smallest)} MiB "
                           f"({smallest / max(base['peaks']):.0%})" if smallest
                           else got["error"][:90])
                    t.row(model, label, f"{f:.0%}", _mib(budget), why, "", "", "")
                    continue
                ratio = max(got["peaks"]) / budget
                slow = _bench.median(got["seconds"]) / _bench.median(base["seconds"])
                t.row(model, label, f"{f:.0%}", _mib(budget), f"{ratio:.3f}", f"{slow:.2f}x",
                      _same(got, base), got.get("programs", "-"))
    if "batch" in tables:
        print("\n### Largest batch at the default step peak (to_static full graph)\n")
        t = _bench.Table(["model", "default batch", "default peak MiB", "without memopt",
                          "with memopt", "gain", "measured max / peak at that batch"],
                         "lrrrrrr")
        factors = [float(x) for x in args.batch_factors.split(",") if x]
        for model in models:
            kind, batch, size = table_of[model]
            base = defaults.get((model, "full_graph"))
            if not base or "error" in base:
                continue
            peak = max(base["peaks"])
            best, best_ratio = batch, max(base["peaks"]) / peak
            for factor in factors:
                b = int(round(batch * factor))
                got = cell(dict(kind=kind, batch=b, size=size, mode="full_graph",
                                steps=args.steps,
                                memopt={"level": 2, "skip_grads": False, "budget": peak}))
                if "error" in got or max(got["peaks"]) > peak:
                    break
                best, best_ratio = b, max(got["peaks"]) / peak
            t.row(model, batch, _mib(peak), batch, best, f"{best / batch:.2f}x",
                  f"{best_ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
