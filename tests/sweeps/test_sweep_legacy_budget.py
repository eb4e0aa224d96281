"""Sweep: ``memory_optimize(budget=..., batch_size=...)`` on legacy training
programs (``FLAGS_enable_pir_api=0``, GC on; ``sweep_legacy_budget.py`` runs
each in a fresh process).  A cell is model x budget (a fraction of the
unchanged program's measured peak): every fetch of every step and every
persistable afterwards bit-identical to the unchanged run's, or a
BudgetError that left the program byte-identical."""
import functools

import pytest

import cells
import sweep_legacy_budget as sw

pytestmark = pytest.mark.sweep

STEPS = 4


@functools.lru_cache(maxsize=None)
def _run(name: str, budget: float) -> dict:
    return sw.run(name, budget, STEPS)


@pytest.mark.parametrize("name, fraction", cells.cell_ids(list(sw.MODELS), sw.FRACTIONS))
def test_cell(request, name, fraction):
    base = _run(name, 0)
    failed = cells.unchanged_run(base)
    if failed is None:
        failed = cells.digest_outcome(base, _run(name, fraction * base["peak"]))
    cells.expect(request, failed)
