"""``memory_optimize(budget=..., batch_size=...)`` on legacy training programs
(``FLAGS_enable_pir_api=0``, Paddle's legacy executor, CPU, GC on).

For each model a fresh process measures the unchanged program's peak ``P``
(``host_memory_stat_peak_value('Allocated', 0)``, the largest of ``--steps``
steps, parameters and optimizer state included)
and its lowest per-step peak (the peak is reset before each step,
``--pause`` seconds after the last); then, each in a fresh process,
``memory_optimize(budget=f * P)`` for each fraction ``f``: planned or
BudgetError (then: the program byte-identical, and the smallest budget it
names), the measured peak over the steps and the lowest step's as ratios to
the budget, the added compute the report gives, and whether every fetch of
every step and every persistable tensor afterwards (parameters, optimizer
state, running statistics) equal the unchanged run's bit for bit.

The cells are tests of ``test_sweep_legacy_budget.py`` (``--worker MODEL
BUDGET STEPS PAUSE LAG`` prints one JSON object; LAG >= 0 checks plans with
frees that many ops late instead of memopt's ``LEGACY_GC_LAG_OPS``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys

import cells

#: name -> memopt.testing.models.build arguments
MODELS = {
    "cnn": dict(name="cnn", batch_size=32, image_size=64),
    "ffn_dropout": dict(name="ffn_dropout", batch_size=1024, width=256),
    "vgg": dict(name="vgg", batch_size=32, image_size=64),
}
FRACTIONS = (1.0, 0.8, 0.6)


def worker(model: str, budget: float, steps: int, pause: float, lag: int) -> dict:
    import time

    import numpy as np
    import paddle

    paddle.enable_static()
    from paddle.base import core

    import memopt
    from memopt.testing import models
    from memopt.paddle.legacy import recompute as legacy_recompute

    if lag >= 0:  # what-if: the frees' lateness plans are checked with
        legacy_recompute.LEGACY_GC_LAG_OPS = lag

    m = models.build(ir="legacy", **MODELS[model])
    out: dict = {"model": model, "batch": m.batch_size, "budget": budget}
    if budget:
        desc = m.main.desc.serialize_to_string()
        try:
            report = memopt.memory_optimize(m.main, budget=budget, batch_size=m.batch_size,
                                            fetch_list=m.fetch_list)
        except memopt.BudgetError as exc:
            out.update(error="BudgetError", smallest=exc.smallest_budget,
                       unchanged=m.main.desc.serialize_to_string() == desc)
            return out
        out.update(added=report.added_compute_percent, recomputed=len(report.recomputed),
                   predicted=report.peak_after)
    rng = np.random.default_rng(3)
    digest, peaks = hashlib.sha256(), []
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        m.initialize(exe)
        overall = 0
        for _ in range(steps):
            time.sleep(pause)  # the collector thread's queued frees land first
            core.host_memory_stat_reset_peak_value("Allocated", 0)
            for value in exe.run(m.main, feed=m.feed(rng), fetch_list=m.fetch_list):
                digest.update(np.asarray(value).tobytes())
            peaks.append(core.host_memory_stat_peak_value("Allocated", 0))
            overall = max(overall, peaks[-1])
        for var in sorted(m.main.list_vars(), key=lambda v: v.name):
            if var.persistable and var.name not in ("feed", "fetch") \
                    and scope.find_var(var.name) is not None:
                digest.update(np.array(scope.find_var(var.name).get_tensor()).tobytes())
    out.update(peak=overall, lowest=min(peaks), digest=digest.hexdigest())
    return out


def run(model: str, budget: float, steps: int, pause: float = 0.0, lag: int = -1) -> dict:
    """The worker's result, in a fresh process with FLAGS_enable_pir_api=0."""
    return cells.fresh_process(__file__, [model, repr(float(budget)), steps, pause, lag],
                               {"FLAGS_enable_pir_api": "0"})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", nargs=5, metavar=('MODEL', 'BUDGET', 'STEPS', 'PAUSE', 'LAG'), required=True)
    args = parser.parse_args(argv)
    model, budget, steps, pause, lag = args.worker
    print(json.dumps(worker(model, float(budget), int(steps), float(pause), int(lag))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
