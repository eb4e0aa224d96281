"""Sweep: every TFP-style user program of ``tests/autobatch/user_programs.py``
in every regime (NumPy, eager TF, tf.function with and without AutoGraph,
XLA, a TF1 session), with a one-deep stack in eager TF and under
``jit_compile``, and through ``dry_run`` (``sweep_autobatch_user.py``, one
fresh process per program).  A cell is program x column: equal to a plain
Python loop over the batch (or an overflow error where the stack is one
deep), or a clean refusal (autobatch's error before anything runs);
``WRONG`` and raw errors fail."""
import functools
import sys

import pytest

import cells
import sweep_autobatch_user as sw

sys.path.insert(0, sw.TESTS)
import user_programs  # noqa: E402

pytestmark = pytest.mark.sweep

COLUMNS = [*sw.REGIMES, "overflow_tf_eager", "overflow_tf_xla", "dry_run"]


@functools.lru_cache(maxsize=None)
def _program(name: str) -> dict:
    return cells.fresh_process(sw.__file__, [name], {"TF_CPP_MIN_LOG_LEVEL": "3"},
                               timeout=1800)


def outcome(cell: str) -> cells.Outcome:
    if cell.startswith("ok") or cell in ("overflow error", "fits (tail calls)"):
        return cells.ok(cell)
    if cell.startswith("clean refusal"):
        return cells.refused(cell)
    return cells.bug(cell)


@pytest.mark.parametrize("name, column", cells.cell_ids(list(user_programs.PROGRAMS),
                                                         COLUMNS))
def test_cell(request, name, column):
    res = _program(name)
    if "crash" in res:
        cells.expect(request, cells.bug("the worker died: " + res["crash"]))
    else:
        cells.expect(request, outcome(res[column]))
