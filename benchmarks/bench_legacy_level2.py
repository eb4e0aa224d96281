"""Measure memory_optimize(level=2) on legacy training programs (CPU).

Every configuration runs in a fresh Python process with
``FLAGS_enable_pir_api=0`` (Paddle 3's legacy ProgramInterpreter) under the
garbage collector on (``FLAGS_eager_delete_tensor_gb=0``) or off (``-1``):
build the model, apply level 1 or level 2 (or nothing), run the startup
program and ``--steps`` training steps, and read the allocator
(``paddle.base.core.host_memory_stat_peak_value('Allocated', 0)``, reset
before each step).

Columns (one markdown table row per model and GC mode):

- ``L1`` / ``L2``: the median and the largest step peak of steps 2..n
  (the first step runs in program order while Paddle builds its
  instruction list), parameters and optimizer state included, in MiB;
- ``pred L1`` / ``pred L2``: ``memopt.analyze``'s predicted peak of the
  rewritten program (MiB);
- ``order``: what level 2 did (its report's note, shortened);
- ``bit-identical``: level 2's fetches and parameters after 3 steps equal
  the unchanged program's.

Usage::

    python benchmarks/bench_legacy_level2.py                      # the default models
    python benchmarks/bench_legacy_level2.py --models branches:256,densenet:8 --steps 7
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys

import _bench

DEFAULT = "branches:256,densenet:8,cnn:16,transformer:8,resnet50:4"


def _build(name, batch):
    import paddle

    from memopt.testing import models

    if name not in models.PIR_ONLY:
        return models.build(name, "legacy", batch_size=batch, optimizer="sgd")
    # U-Net / DenseNet are built in PIR by memopt.testing.models; their layers build in legacy too
    from paddle.pir_utils import OldIrGuard
    with OldIrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            feed, fetch = getattr(models, "_" + name)("legacy", batch, {})
            models._optimizer("sgd").minimize(fetch[0])
    return models.BuiltModel(name=name, ir="legacy", main=main, startup=startup, feed=feed,
                             fetch_list=list(fetch), batch_size=batch)


def worker(name: str, batch: int, gc: str, level: int, steps: int) -> dict:
    """One configuration in this process (started with
    ``FLAGS_enable_pir_api=0``): the predicted peak, the step peaks, level
    2's notes and a digest of 3 steps' fetches and parameters."""
    import numpy as np
    import paddle

    paddle.enable_static()
    import memopt
    from memopt.testing import models

    paddle.set_flags({"FLAGS_eager_delete_tensor_gb": 0.0 if gc == "on" else -1.0})
    model = _build(name, batch)
    notes = []
    with models.ir_guard("legacy"):
        if level:
            report = memopt.memory_optimize(model.main, level=level, batch_size=batch,
                                            fetch_list=model.fetch_list)
            notes = [n for n in report.notes if n.startswith("level 2")]
        pred = memopt.analyze(model.main, batch, fetch_list=model.fetch_list).total_peak(batch)
    peaks, base = models.step_peaks(model, steps)
    run = models.run_steps(model, 3)
    raw = b"".join(np.ascontiguousarray(a).tobytes() for f in run.fetches for a in f)
    raw += b"".join(np.ascontiguousarray(p).tobytes() for p in run.params)
    return {"pred": pred, "peaks": [p + base for p in peaks], "notes": notes,
            "digest": hashlib.sha256(raw).hexdigest()}


def run(name, batch, gc, level, steps):
    return _bench.run_worker(__file__, [name, batch, gc, level, steps],
                             {"FLAGS_enable_pir_api": "0"})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT, help="name:batch,...")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--worker", nargs=5, metavar=("MODEL", "BATCH", "GC", "LEVEL", "STEPS"))
    args = ap.parse_args()
    if args.worker:
        name, batch, gc, level, steps = args.worker
        print(json.dumps(worker(name, int(batch), gc, int(level), int(steps))))
        return
    table = _bench.Table(["model (batch)", "GC", "L1 median / max MiB", "L2 median / max MiB",
                          "pred L1 MiB", "pred L2 MiB", "order", "bit-identical"])
    for spec in args.models.split(","):
        name, batch = spec.split(":")
        for gc in ("on", "off"):
            plain, one, two = (run(name, int(batch), gc, lv, args.steps) for lv in (0, 1, 2))
            failed = next((r for r in (plain, one, two) if "error" in r), None)
            if failed:
                table.row(f"{name} ({batch})", gc, failed["error"], "", "", "", "", "")
                continue
            cells = [f"{_bench.mib(_bench.median(r['peaks'][1:])):.2f} / "
                     f"{_bench.mib(max(r['peaks'][1:])):.2f}" for r in (one, two)]
            note = (two["notes"] or ["-"])[0].replace("level 2: ", "")
            note = note.split(":")[0][:60]
            table.row(f"{name} ({batch})", gc, *cells, f"{_bench.mib(one['pred']):.2f}",
                      f"{_bench.mib(two['pred']):.2f}", note,
                      "yes" if two["digest"] == plain["digest"] else "NO")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
