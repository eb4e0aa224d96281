"""Sweep: the workflows a user takes a rewritten program through, both IRs
(``sweep_workflows.py``): the deployment predictor, desc round trips,
Executor variants, ``paddle.jit.load``, ``memopt optimize`` on a saved
model, in new processes.  A cell is program x IR x GC x configuration
(levels 0/1/2, ``budget=`` 0.9 of the predicted peak), every workflow of
it: the same bytes and dtypes as the unchanged program, a clean refusal,
or Paddle fails on the unchanged program."""
import functools

import pytest

import cells
import sweep_workflows as sw

pytestmark = pytest.mark.sweep


@functools.lru_cache(maxsize=None)
def _rows(name: str, ir: str, gc: str) -> dict:
    return cells.fresh_process(sw.__file__, [name, ir, gc],
                               {"FLAGS_eager_delete_tensor_gb": sw.GC[gc]},
                               timeout=3000, flag="--one")


@pytest.mark.parametrize("name, ir, gc, config", cells.cell_ids(
    [(n, ir, gc) for n in sw.PROGRAMS for ir in ("pir", "legacy") for gc in sw.GC],
    sw.CONFIGS))
def test_cell(request, name, ir, gc, config):
    res = _rows(name, ir, gc)
    if "crash" in res:
        cells.expect(request, cells.bug("the worker died: " + res["crash"]))
    else:
        cells.expect(request, cells.from_text(sw.config_cell(res["rows"], config)))
