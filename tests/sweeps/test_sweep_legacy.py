"""Sweep: memory_optimize on legacy training programs memopt's tests do not
build (paddle.vision models, RNNs, sequence ops, sparse updates, AMP,
gradient merge, control flow; ``sweep_legacy.py`` builds and checks them).
A cell is model x configuration (levels 0, 1, 2 x variant A, B): every
check (training GC off/on, GC flipped between planning and running, fetch
of every visible name, clone, save/load, parse, inference in a new
process) ok, a clean refusal, or the unchanged program fails in Paddle;
forward-only models add an ``infer_only`` cell."""
import functools

import pytest

import cells
import sweep_legacy as sw

pytestmark = pytest.mark.sweep

CONFIGS = [f"L{level}{variant}" for level in sw.LEVELS for variant in "AB"]


@functools.lru_cache(maxsize=None)
def _model(name: str) -> dict:
    return cells.fresh_process(sw.__file__, [name], {"FLAGS_enable_pir_api": "0"},
                               timeout=1800, flag="--check")


def outcome(res: dict, column: str) -> cells.Outcome:
    if "crash" in res:
        return cells.bug("the worker died: " + res["crash"])
    if "paddle" in res:
        return cells.paddle_fails(res["paddle"])
    return cells.from_text(sw.config_cell(res[column]))


def _columns(name):
    return CONFIGS + (["infer_only"] if name in sw.INFER_ONLY else [])


@pytest.mark.parametrize("name, column", cells.cell_ids(list(sw.MODELS), _columns))
def test_cell(request, name, column):
    cells.expect(request, outcome(_model(name), column))
