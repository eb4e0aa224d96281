"""Sweep: ``level=2`` and ``budget=`` on PIR training programs whose
top-level block runs an ``if`` / ``while`` (``sweep_regions.py`` runs each
configuration in a fresh process).  A cell is model x configuration
(``level2``, ``budget`` at a fraction of the guarded predicted peak):
losses, fetches and parameters bit-identical to the unchanged run's, or a
BudgetError that left the program as it was."""
import functools

import pytest

import cells
import sweep_regions as sw

pytestmark = pytest.mark.sweep

MODELS = ("cond_mlp", "while_mlp", "dense_cond")
STEPS = 3
COLUMNS = ["level2"] + [f"budget{f:g}" for f in sw.FRACTIONS]


@functools.lru_cache(maxsize=None)
def _run(name: str, config: str, fraction: float) -> dict:
    return sw.run(name, config, fraction, STEPS)


@pytest.mark.parametrize("name, column", cells.cell_ids(MODELS, COLUMNS))
def test_cell(request, name, column):
    base = _run(name, "default", 0.0)
    failed = cells.unchanged_run(base)
    if failed is None:
        if column == "level2":
            r = _run(name, "level2", 0.0)
        else:
            r = _run(name, "budget", float(column[len("budget"):]))
        failed = cells.digest_outcome(base, r)
    cells.expect(request, failed)
