"""Sweep: memory_optimize at levels 0/1/2 and the workflows around a
rewritten program on real PIR programs the unit tests do not build
(``sweep_programs.py`` builds and runs them).  A cell is program x
configuration (``L0``, ``L1``, ``L2``, ``L1 grads``, ``L0 log``,
``workflows``): bit-identical to the unchanged program, or the unchanged
program fails in Paddle."""
import functools

import pytest

import cells
import sweep_programs as sw

pytestmark = pytest.mark.sweep

COLUMNS = [label for label, _ in sw.CONFIGS] + ["workflows"]


@functools.lru_cache(maxsize=None)
def _program(name: str) -> dict:
    return cells.fresh_process(sw.__file__, [name], flag="--one", timeout=3600)


def outcome(res: dict, column: str) -> cells.Outcome:
    if "crash" in res:
        return cells.bug("the worker died: " + res["crash"])
    if res["error"]:
        return cells.paddle_fails(res["error"])
    note = res.get("note", "")
    if column == "workflows":
        text = res["workflows"]
        return cells.ok(text) if text.startswith("ok") else cells.bug(text)
    row = res["rows"][column]
    if row["ok"]:
        return cells.ok(f"merged {row['merged']}" + (f"; {note}" if note else ""))
    return cells.bug(row.get("error") or "results differ from the unchanged program's")


@pytest.mark.parametrize("name, column", cells.cell_ids(list(sw.PROGRAMS), COLUMNS))
def test_cell(request, name, column):
    cells.expect(request, outcome(_program(name), column))
