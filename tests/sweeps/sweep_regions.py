"""``budget=`` and ``level=2`` on PIR training programs whose top-level block
runs an ``if`` / ``while`` (``memopt.testing.models.REGION_MODEL_NAMES``), CPU.

Each configuration runs in a fresh process: ``default`` (the unchanged
program), ``level2`` and ``budget`` at a fraction ``f`` of the unchanged
program's guarded predicted peak (``pir_budget.guarded_peak`` with the
loops' trip counts, ``pir_loops.runtime_for``: what budgets are checked
against).  A process builds the model, applies memopt, runs the
startup program, resets the allocator's peak and runs ``--steps`` training
steps; ``peak`` is ``host_memory_stat_peak_value('Allocated', 0)`` over them
(parameters and optimizer state included).  A cell: whether losses, fetches
and parameters equal the unchanged run's bit for bit (the peak over the
budget reported beside); a BudgetError cell, whether the program was left
exactly as it was.

The cells are tests of ``test_sweep_regions.py`` (``--worker MODEL CONFIG
FRACTION STEPS`` prints one JSON object).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys

import cells

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


def run(name: str, config: str, fraction: float, steps: int) -> dict:
    """The worker's result, in a fresh process."""
    return cells.fresh_process(__file__, [name, config, repr(fraction), steps])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", nargs=4, metavar=('MODEL', 'CONFIG', 'FRACTION', 'STEPS'), required=True)
    args = parser.parse_args(argv)
    name, config, fraction, steps = args.worker
    print(json.dumps(worker(name, config, float(fraction), int(steps))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
