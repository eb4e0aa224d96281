"""Sweep: memory_optimize on legacy programs written the way Fluid-era
users wrote them (``sweep_legacy_user.py``, on sweep_legacy.py's harness):
a cell is program x configuration (levels 0, 1, 2 and ``budget=`` 0.9 x
the predicted peak, variants A and B), every check of the harness plus
CompiledProgram, ``use_prune`` and two copies in one process: ok, a clean
refusal (memopt's error, program byte-identical), or the unchanged program
fails in Paddle."""
import functools

import pytest

import cells
import sweep_legacy_user as sw

pytestmark = pytest.mark.sweep


@functools.lru_cache(maxsize=None)
def _program(name: str) -> dict:
    return cells.fresh_process(sw.__file__, [name], {"FLAGS_enable_pir_api": "0"},
                               timeout=1800, flag="--check")


def outcome(res: dict, column: str) -> cells.Outcome:
    if "crash" in res:
        return cells.bug("the worker died: " + res["crash"])
    if "paddle" in res:
        return cells.paddle_fails(res["paddle"])
    return cells.from_text(sw.s.config_cell(res[column]))


@pytest.mark.parametrize("name, column", cells.cell_ids([*sw.MODELS, *sw.READERS], sw.CONFIGS))
def test_cell(request, name, column):
    cells.expect(request, outcome(_program(name), column))
