"""Sweep: the ``memopt`` command on saved models of every kind, both IRs
(``sweep_cli.py`` saves them and checks each subcommand), then input a user
gets wrong.  A cell is IR x model x subcommand (``analyze``, ``--json``,
``--budget``, ``plot png``/``svg``, ``optimize L0``/``L1``/``L2``,
``estimate``, ``input kept``): ``ok``, a clean refusal (exit 1, one
``memopt: error:`` line), or Paddle could not save the model; and one cell
per bad input: refused with one error line, no traceback, input kept."""
import functools
import os
import re
import tempfile

import pytest

import cells
import sweep_cli as sw

pytestmark = pytest.mark.sweep

_JIT = ["jit_transformer_dyn", "jit_transformer_fixed", "jit_lstm_dyn", *sw.VISION]
#: the models ``sw.build_models`` saves (checked against the directory)
MODELS = {
    "pir": ["static_one", "static_multi", "static_while_cond", "train", *_JIT],
    "legacy": ["static_one", "static_multi", "static_while_cond", "static_lod", "train",
               "vars_separate", "vars_combined", *_JIT],
}
COLUMNS = ["analyze", "--json", "--budget", "plot png", "plot svg", "optimize L0",
           "optimize L1", "optimize L2", "estimate", "input kept"]
#: the cases of ``sw.bad_inputs``, in its order (checked against it)
BAD = ("truncated .json", "truncated .pdmodel", "text as .pdmodel", "binary as .json",
       "empty .json", "other JSON", "a .txt file", "a .pdiparams.info", "missing path",
       "a directory", "a .pdiparams", "--batch 0", "--batch -1", "--batch text",
       "optimize -b 0", "estimate -b -1", "unknown subcommand", "unknown flag",
       "-o in a missing dir", "-o under a file", "-o unwritable (/proc)", "-o is the input",
       "-o is the input's prefix", "plot -o in a missing dir", "plot -o .html",
       "plan -o is the input", "PIR model, legacy env", "legacy model, PIR env")


@functools.lru_cache(maxsize=None)
def _base() -> str:
    base = tempfile.mkdtemp(prefix="memopt_sweep_cli_")
    os.makedirs(os.path.join(base, "out"))
    return base


@functools.lru_cache(maxsize=None)
def _models(ir: str) -> str:
    """The directory holding every model of ``ir``, saved by a worker."""
    root = os.path.join(_base(), ir)
    os.makedirs(root)
    built = sw.worker("--build", ir, root, ir=ir)
    assert built.returncode == 0, f"building the {ir} models failed:\n{built.stderr[-2000:]}"
    names = sorted({re.sub(r"\.(json|pdmodel|unsaved)$", "", f) for f in os.listdir(root)
                    if f.endswith((".json", ".pdmodel", ".unsaved"))}
                   | {d for d in os.listdir(root) if d.startswith("vars_")})
    assert names == sorted(MODELS[ir]), "the saved models are not the ones MODELS lists"
    return root


@functools.lru_cache(maxsize=None)
def _row(ir: str, name: str) -> dict:
    root = _models(ir)
    unsaved = os.path.join(root, name + ".unsaved")
    if os.path.exists(unsaved):
        return {"unsaved": open(unsaved).read()}
    return sw.sweep_model(ir, root, name, os.path.join(_base(), "out"))


@functools.lru_cache(maxsize=None)
def _bad() -> dict:
    _models("pir"), _models("legacy")
    rows = sw.sweep_bad(_base(), os.path.join(_base(), "out"))
    assert tuple(case for case, _, _ in rows) == BAD, "sw.bad_inputs' cases are not BAD"
    return {case: (command, verdict) for case, command, verdict in rows}


def outcome(row: dict, ir: str, column: str) -> cells.Outcome:
    if "unsaved" in row:
        return cells.paddle_fails("Paddle could not save the model: " + row["unsaved"])
    if column == "input kept":
        return cells.from_text(row.get(column, "ok"))
    return cells.from_text(row[column])


def _columns(ir, name):
    """The subcommands run on a model (the legacy IR has no level 2)."""
    return [c for c in COLUMNS if not (ir == "legacy" and c == "optimize L2")]


@pytest.mark.parametrize("ir, name, column", cells.cell_ids(
    [(ir, n) for ir in MODELS for n in MODELS[ir]], _columns))
def test_model(request, ir, name, column):
    cells.expect(request, outcome(_row(ir, name), ir, column))


@pytest.mark.parametrize("case", BAD)
def test_bad_input(request, case):
    command, verdict = _bad()[case]
    cells.expect(request, cells.from_text(verdict))
