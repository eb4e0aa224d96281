"""Sweep: memory_optimize on PIR programs as a new user writes them
(``sweep_user_programs.py`` builds and runs them), GC on and off.  A cell
is program x GC x configuration (levels, budgets, no fetch_list, a
skip_opt_set, print_log, ``budget_error``: budget=1 byte must raise
BudgetError and leave the program as it was, ``workflows``: clone,
save/load, save_inference_model in a new process)."""
import functools

import pytest

import cells
import sweep_user_programs as sw

pytestmark = pytest.mark.sweep

COLUMNS = [label for label, _ in sw.CONFIGS] + ["budget_error", "workflows"]


@functools.lru_cache(maxsize=None)
def _program(name: str, gc: str) -> dict:
    return cells.fresh_process(sw.__file__, [name], cells.ir_gc_env("pir", gc), timeout=1800)


def outcome(res: dict, column: str) -> cells.Outcome:
    if "crash" in res:
        return cells.bug("the worker died: " + res["crash"])
    if res["error"]:
        return cells.paddle_fails(res["error"])
    if column in ("budget_error", "workflows"):
        text = res[column]
        if text.startswith("ok refusal"):
            return cells.refused(text)
        return cells.ok(text) if text.startswith("ok") else cells.bug(text)
    row = res["rows"].get(column)
    if row is None:  # "L1 skip" on a program with no activation to skip
        pytest.skip(f"{column} does not apply: the program names no activation to skip")
    if not row["ok"]:
        return cells.bug(row.get("error") or "results differ from the unchanged program's")
    if row.get("refusal"):
        return cells.refused(row["refusal"])
    return cells.ok(f"merged {row.get('merged', '-')}")


@pytest.mark.parametrize("name, gc, column", cells.cell_ids(
    [(n, gc) for n in sw.PROGRAMS for gc in ("on", "off")], COLUMNS))
def test_cell(request, name, gc, column):
    cells.expect(request, outcome(_program(name, gc), column))
