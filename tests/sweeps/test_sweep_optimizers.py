"""Sweep: memory_optimize over the optimizer / regularizer / clipping /
LR-schedule zoo (``sweep_optimizers.py`` builds and runs it).  A cell is
program x IR x GC x configuration: fetches, after-training arrays and
every persistable bit-identical to the unchanged program's, a clean
refusal (memopt's error, program unchanged; at run: memopt's guard), or
the unchanged program fails in Paddle."""
import functools

import pytest

import cells
import sweep_optimizers as sw

pytestmark = pytest.mark.sweep


@functools.lru_cache(maxsize=None)
def _program(name: str, ir: str, gc: str) -> dict:
    res = cells.fresh_process(sw.__file__, [name], cells.ir_gc_env(ir, gc), timeout=900)
    return res.get(name) or {"crash": res.get("crash", "no result for " + name)}


def outcome(res: dict, column: str) -> cells.Outcome:
    if "crash" in res:
        return cells.bug("the worker died: " + res["crash"])
    if "paddle" in res:
        return cells.paddle_fails(res["paddle"])
    return cells.from_text(res[column])


@pytest.mark.parametrize("name, ir, gc, column", cells.cell_ids(
    [(n, ir, gc) for n in sw.PROGRAMS for ir in ("pir", "legacy") for gc in ("on", "off")],
    sw.CONFIGS))
def test_cell(request, name, ir, gc, column):
    cells.expect(request, outcome(_program(name, ir, gc), column))
