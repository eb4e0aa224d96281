"""Sweep: memory_optimize on ops whose output shapes depend on data or
whose memory is unusual (masked_select, unique, sparse embeddings,
sequences, detection ops, creation and random ops, a value read at another
leading dim; ``sweep_dynamic_shapes.py`` builds them, the harness of
``sweep_memory_semantics.py`` runs them).  A cell is program x IR x GC x configuration:
bit-identical to the unchanged program, a clean refusal (memopt's error,
program unchanged), or the unchanged program fails in Paddle."""
import functools

import pytest

import cells
import sweep_dynamic_shapes as sw

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
    return [label for label, _ in sw.CONFIGS]


@pytest.mark.parametrize("name, ir, gc, column", cells.cell_ids(
    [(n, ir, gc) for n in sw.PROGRAMS for ir in ("pir", "legacy") for gc in ("on", "off")],
    columns))
def test_cell(request, name, ir, gc, column):
    cells.expect(request, outcome(_program(name, ir, gc), column))
