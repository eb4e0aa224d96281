"""Sweep: ``level=2`` and ``budget=`` on eight more PIR training programs
(ViT, Mixer, Conv1D audio, seq2seq GRU, tied LSTM LM, EfficientNet-like,
Wide&Deep, GPT-6) as a user runs them (GC on, the in-place pass, the
multi-thread executor; ``sweep_budget_unknown.py`` runs each configuration
in a fresh process).  A cell is model x configuration (``level2``;
``budget`` at a fraction of the predicted peak, ``pred``, or of the
unchanged program's lowest measured step peak, ``meas``): losses, fetches
and parameters bit-identical to the unchanged run's, or a BudgetError that
left the program as it was and whose smallest budget and largest batch
plan."""
import functools

import pytest

import cells
import sweep_budget_unknown as sw

pytestmark = pytest.mark.sweep

STEPS = 4
COLUMNS = ["level2"] + [f"{ref}{f:g}" for ref in ("pred", "meas") for f in sw.FRACTIONS]


@functools.lru_cache(maxsize=None)
def _run(name, config, batch, budget):
    return sw.run(name, config, batch, budget, STEPS)


def outcome(name: str, column: str) -> cells.Outcome:
    batch = sw.MODELS[name][0]
    base = _run(name, "default", batch, 0)
    failed = cells.unchanged_run(base)
    if failed is not None:
        return failed
    if column == "level2":
        return cells.digest_outcome(base, _run(name, "level2", batch, 0))
    whole = base["predicted"] if column.startswith("pred") else min(base["peaks"][1:] or base["peaks"])
    budget = float(column[4:]) * whole
    r = _run(name, "budget", batch, budget)
    if r.get("error") == "BudgetError":
        largest = r.get("largest")
        return cells.budget_error_followups(
            base, r, _run(name, "budget", batch, r["smallest"]),
            _run(name, "budget", largest, budget) if largest else None)
    return cells.digest_outcome(base, r)


@pytest.mark.parametrize("name, column", cells.cell_ids(list(sw.MODELS), COLUMNS))
def test_cell(request, name, column):
    cells.expect(request, outcome(name, column))
