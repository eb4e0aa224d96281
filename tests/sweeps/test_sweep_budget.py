"""Sweep: ``memory_optimize(budget=..., batch_size=...)`` on PIR training
programs ``memopt.testing.models`` does not build (paddle.vision CNNs,
TransformerEncoder, LSTM/GRU, embedding + global-norm clipping + AdamW;
``sweep_budget.py`` runs each configuration in a fresh process).  A cell is
model x budget (a fraction of the unchanged program's measured peak):
losses, fetches and parameters bit-identical to the unchanged run's (where
they differ, both again with one executor thread: Paddle's multi-thread
executor draws the random numbers of independent dropouts in whichever
order its threads reach them), or a BudgetError that left the program as
it was and whose smallest budget and largest batch plan."""
import functools

import pytest

import cells
import sweep_budget as sw

pytestmark = pytest.mark.sweep

STEPS = 3
SERIAL = (("FLAGS_new_executor_serial_run", "1"),)


@functools.lru_cache(maxsize=None)
def _run(name, config, batch, budget, env=()):
    return sw.run(name, config, batch, budget, STEPS, dict(env) or None)


def outcome(name: str, fraction: float) -> cells.Outcome:
    batch = sw.MODELS[name][0]
    base = _run(name, "default", batch, 0)
    failed = cells.unchanged_run(base)
    if failed is not None:
        return failed
    budget = fraction * base["peak"]
    r = _run(name, "budget", batch, budget)
    if r.get("error") == "BudgetError":
        largest = r.get("largest")
        return cells.budget_error_followups(
            base, r, _run(name, "budget", batch, r["smallest"]),
            _run(name, "budget", largest, budget) if largest else None)
    result = cells.digest_outcome(base, r)
    if result.kind is cells.Kind.BUG and "digest" in r:
        a = _run(name, "default", batch, 0, SERIAL)
        b = _run(name, "budget", batch, budget, SERIAL)
        if "digest" in a and a.get("digest") == b.get("digest"):
            return cells.ok("identical with one executor thread")
    return result


@pytest.mark.parametrize("name, fraction", cells.cell_ids(list(sw.MODELS), sw.FRACTIONS))
def test_cell(request, name, fraction):
    cells.expect(request, outcome(name, fraction))
