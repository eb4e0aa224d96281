"""Sweep: memopt on distributed programs, two CPU ranks (gloo), one launch
per strategy of ``memopt.testing.fleet_strategies.STRATEGIES``
(``memopt.testing.dist_sweep`` spawns and collects; ``sweep_distributed.py`` reads
a launch).  A cell is strategy x option (unoptimized, levels 0/1/2,
``budget=``, GC on and off, memory_optimize before minimize): both ranks'
losses and persistables bit-identical to their unoptimized run with the
communication ops unchanged, a clean refusal, or Paddle fails on the
unchanged program."""
import functools
import tempfile

import pytest

import cells
import sweep_distributed as sw
from memopt.testing.dist_sweep import SweepConfig, launch
from memopt.testing.fleet_strategies import STRATEGIES

pytestmark = pytest.mark.sweep

TIMEOUT = 120.0
STEPS = 4


@functools.lru_cache(maxsize=None)
def _launch(strategy: str) -> dict:
    return launch(SweepConfig(strategy=strategy, options=sw.OPTIONS, steps=STEPS),
                  tempfile.mkdtemp(prefix=f"sweep_{strategy}_"), timeout=TIMEOUT)


@pytest.mark.parametrize("strategy, option", cells.cell_ids(
    list(STRATEGIES), [o.label for o in sw.OPTIONS]))
def test_cell(request, strategy, option):
    index = [o.label for o in sw.OPTIONS].index(option)
    cells.expect(request, cells.from_text(sw.option_cell(strategy, _launch(strategy), index)))
