"""Sweep: memory_optimize over training set-ups the other sweeps do not
build (AMP with loss scaling, second-order gradients, a GAN as two
programs, the user's own backward, static.Print, py_func, QAT, ...;
``sweep_training_setups.py`` builds and runs them).  A cell is program x IR
(the IRs the program is built in) x GC x configuration: bit-identical to
the unchanged program, a clean refusal, or the unchanged program fails in
Paddle."""
import functools

import pytest

import cells
import sweep_training_setups as sw

pytestmark = pytest.mark.sweep


@functools.lru_cache(maxsize=None)
def _program(name: str, ir: str, gc: str) -> dict:
    return cells.fresh_process(sw.__file__, [name], cells.ir_gc_env(ir, gc), timeout=900)


def outcome(res: dict, column: str) -> cells.Outcome:
    if "crash" in res:
        return cells.bug("the worker died: " + res["crash"])
    if "paddle" in res:
        return cells.paddle_fails(res["paddle"])
    if column not in res:  # a "... skip" config on a program with no skip_opt_set
        pytest.skip(f"{column} does not apply: the program has no skip_opt_set of its own")
    text = res[column]
    if "(refused: " in text and text.startswith("ok"):
        return cells.refused(text)  # a step refused cleanly, the others ran bit-identical
    return cells.from_text(text)


def _irs(name):
    ir = sw.PROGRAMS[name][1]
    return ("pir", "legacy") if ir == "both" else (ir,)


@pytest.mark.parametrize("name, ir, gc, column", cells.cell_ids(
    [(n, ir, gc) for n in sw.PROGRAMS for ir in _irs(n) for gc in ("on", "off")],
    list(sw.CONFIGS)))
def test_cell(request, name, ir, gc, column):
    cells.expect(request, outcome(_program(name, ir, gc), column))
