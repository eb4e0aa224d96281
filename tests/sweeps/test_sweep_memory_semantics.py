"""Sweep: memory_optimize on ops with unusual memory semantics (slice
assignment, scatter and in-place writes, aliases and views, odd dtypes,
memory_optimize applied twice, odd targets; ``sweep_memory_semantics.py``
builds and runs them).  A cell is program x IR x GC x configuration:
bit-identical to the unchanged program, a clean refusal (memopt's error,
program unchanged), or the unchanged program fails in Paddle."""
import functools

import pytest

import cells
import sweep_memory_semantics as sw

pytestmark = pytest.mark.sweep


@functools.lru_cache(maxsize=None)
def _program(name: str, ir: str, gc: str) -> dict:
    return cells.fresh_process(sw.__file__, [name], cells.ir_gc_env(ir, gc), timeout=900)


def outcome(res: dict, column: str) -> cells.Outcome:
    if "cells" not in res:
        return cells.bug("the worker died: " + res.get("crash", "?"))
    if res["error"]:
        return cells.paddle_fails(res["error"])
    return cells.from_text(res["cells"][column])


def columns(name, ir, gc):
    return [label for label, _ in sw.configs_of(name)]


@pytest.mark.parametrize("name, ir, gc, column", cells.cell_ids(
    [(n, ir, gc) for n in sw.PROGRAMS for ir in ("pir", "legacy") for gc in ("on", "off")],
    columns))
def test_cell(request, name, ir, gc, column):
    cells.expect(request, outcome(_program(name, ir, gc), column))
