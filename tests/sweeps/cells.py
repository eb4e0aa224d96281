"""What one cell of a sweep's matrix ended as, and how a cell test says so.

A sweep (``tests/sweeps/test_sweep_*.py``) runs memopt over a matrix of
programs x options that the unit tests do not build; each cell of the matrix
is one test id.  A cell ends as one of four :class:`Kind`:

- ``OK``: memopt did what it promises (for a rewrite: losses, fetches and
  parameters bit-identical to the unchanged program's).
- ``REFUSED``: memopt raised one of its named errors
  (:class:`memopt.errors.MemoptError`) and left the program as it was.  An
  outcome memopt promises for input it cannot handle: the test passes after
  the sweep asserted both halves (named error, program unchanged).
- ``PADDLE``: Paddle itself fails on the unchanged program (it does not
  build, run or save it), so there is nothing memopt could be compared
  with.  The test passes after the sweep saw the unchanged program fail.
- ``BUG``: anything else (a difference, a raw exception from memopt, a
  crash, a changed program after a refusal): the test fails.

:func:`expect` turns an :class:`Outcome` into the test's verdict and records
it (``user_properties``) so that the sweep hook of ``tests/conftest.py`` prints every
cell that was not ``OK`` at the end of the run.

:func:`fresh_process` runs a sweep module's worker mode in a new Python
process (:mod:`memopt.testing.workers`): Paddle aborts on some programs
and keeps global state between programs, so each program runs in its own.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pytest

from memopt.testing import workers


class Kind(enum.Enum):
    """What a cell ended as (see the module docstring)."""

    OK = "ok"
    REFUSED = "clean refusal"
    PADDLE = "Paddle fails on the unchanged program"
    BUG = "BUG"


@dataclass(frozen=True)
class Outcome:
    """A cell's :class:`Kind` and a one-line detail (the error, the figures)."""

    kind: Kind
    detail: str = ""

    def __str__(self) -> str:
        return self.kind.value + (f": {self.detail}" if self.detail else "")


def ok(detail: str = "") -> Outcome:
    return Outcome(Kind.OK, detail)


def refused(detail: str) -> Outcome:
    return Outcome(Kind.REFUSED, detail)


def paddle_fails(detail: str) -> Outcome:
    return Outcome(Kind.PADDLE, detail)


def bug(detail: str) -> Outcome:
    return Outcome(Kind.BUG, detail)


def expect(request: pytest.FixtureRequest, outcome: Outcome) -> None:
    """The test's verdict on ``outcome``: fail on ``BUG``, pass otherwise;
    the outcome is recorded on the test's report either way."""
    request.node.user_properties.append(("sweep_outcome", str(outcome)))
    if outcome.kind is Kind.BUG:
        pytest.fail(str(outcome), pytrace=False)


def fresh_process(script: str, args: Sequence[Any], env: Optional[dict] = None,
                  timeout: float = 1800, flag: str = "--worker") -> dict:
    """:func:`memopt.testing.workers.run_worker` for a sweep: a worker that
    printed no JSON object (it crashed, Paddle aborted, it ran out of time)
    gives ``{"crash": <why>}`` (a sweep worker's own ``error`` key means
    something else: the error it caught)."""
    res = workers.run_worker(script, args, env, timeout=timeout, flag=flag)
    if res.get("crashed") is True:
        return {"crash": res["error"], "stderr": res.get("stderr", "")}
    return res


def cell_ids(rows: Sequence[Any], columns: Any) -> list:
    """``pytest.param(*row, column, id="row-column")`` for every cell, row
    by row (a row's cells run one after another and share its worker run).
    A row is a value or a tuple of values; ``columns`` a sequence, or a
    function of the row giving its columns."""
    params = []
    for row in rows:
        row = row if isinstance(row, tuple) else (row,)
        for column in (columns(*row) if callable(columns) else columns):
            ident = "-".join(map(str, row + (column,))).replace(" ", "_")
            params.append(pytest.param(*row, column, id=ident))
    return params


def ir_gc_env(ir: str, gc: str) -> dict:
    """The environment of a worker under ``ir`` (``pir``: Paddle's default;
    ``legacy``: ``FLAGS_enable_pir_api=0`` before Paddle is imported) and
    ``gc`` (``on``: Paddle's default; ``off``:
    ``FLAGS_eager_delete_tensor_gb=-1``)."""
    env = {"FLAGS_enable_pir_api": "1" if ir == "pir" else "0"}
    if gc == "off":
        env["FLAGS_eager_delete_tensor_gb"] = "-1"
    return env


def from_text(text: str) -> Outcome:
    """The outcome a sweep's cell text names: ``ok ...``; ``refused ...``
    (the sweep checked the error is memopt's and the program unchanged);
    ``paddle ...`` (the unchanged program fails); anything else (``BUG``,
    ``DIFFERS``, ``FAIL``, a crash) is a bug."""
    head = text.lower()
    if head.startswith("ok"):
        return ok(text[2:].strip(" :()"))
    if head.startswith(("refused", "clean refusal")):
        return refused(text)
    if head.startswith("paddle"):
        return paddle_fails(text)
    return bug(text)


def unchanged_run(base: dict) -> Optional[Outcome]:
    """None when the unchanged program's worker ``base`` ran (it has a
    ``digest``); else the outcome every cell of that program takes: a
    crash is a bug, an error Paddle's failure on the unchanged program."""
    if "digest" in base:
        return None
    if "crash" in base:
        return bug("the unchanged program's worker died: " + base["crash"])
    return paddle_fails(str(base.get("error", "?")))


def digest_outcome(base: dict, r: dict) -> Outcome:
    """A rewritten program's worker ``r`` against the unchanged one's
    ``base``: the same ``digest`` (every fetch of every step and the
    parameters, bit for bit) is ``OK``; a BudgetError (or
    UnsupportedProgramError, ``refused: ...``) with the program unchanged
    is ``REFUSED``; anything else a bug.  The measured peak over the budget
    is reported, not judged (Paddle's CPU collector frees on its own thread:
    benchmarks/bench_recompute.py measures fits)."""
    if "crash" in r:
        return bug("the worker died: " + r["crash"])
    if "digest" in r:
        peak = r.get("peak") or max(r.get("peaks") or [0])
        fit = f"step peak / budget {peak / r['budget']:.2f}" if r.get("budget") and peak else ""
        if r["digest"] == base["digest"]:
            return ok(fit)
        return bug("fetches or parameters differ from the unchanged program's " + fit)
    error = str(r.get("error", "?"))
    if error == "BudgetError" or error.startswith("refused"):
        if not r.get("unchanged"):
            return bug(f"{error} left the program changed")
        if error == "BudgetError":
            return refused(f"BudgetError, program unchanged (smallest budget "
                           f"{r.get('smallest')} B)")
        return refused(error + ", program unchanged")
    return bug(error)


def budget_error_followups(base: dict, r: dict, at_smallest: dict,
                           at_largest: Optional[dict]) -> Outcome:
    """A BudgetError cell ``r`` (program unchanged) and what its figures
    promise: planning again at ``err.smallest_budget`` (``at_smallest``,
    same batch) must plan and give the unchanged run's bits; at
    ``err.largest_batch`` with the same budget (``at_largest``; None when
    the error names no batch) must plan."""
    if not r.get("unchanged"):
        return bug("BudgetError left the program changed")
    if "digest" not in at_smallest:
        return bug("budget=err.smallest_budget does not plan: "
                   + str(at_smallest.get("error") or at_smallest.get("crash")))
    if at_smallest["digest"] != base["digest"]:
        return bug("at err.smallest_budget the results differ from the unchanged program's")
    if at_largest is not None and "digest" not in at_largest:
        return bug(f"batch err.largest_batch={r.get('largest')} at the same budget does not "
                   "plan: " + str(at_largest.get("error") or at_largest.get("crash")))
    return refused(f"BudgetError, program unchanged; smallest budget {r.get('smallest')} B "
                   f"plans bit-identical; largest batch {r.get('largest')}"
                   + (" plans" if at_largest is not None else ""))
