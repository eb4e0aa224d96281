"""The ``memopt`` command end to end, in a subprocess, on models the tests
save in both IRs (``paddle.static.save``), and its error paths."""
import json
import os
import subprocess
import sys

import pytest

from memopt.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(*args, timeout=300, env=None):
    env = dict(os.environ, GLOG_minloglevel="2", PYTHONWARNINGS="ignore", **(env or {}))
    return subprocess.run([sys.executable, "-m", "memopt.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, paddle):
    """An MLP training program saved in both IRs, and an interval problem."""
    from memopt.testing import models

    root = tmp_path_factory.mktemp("saved")
    for ir in ("pir", "legacy"):
        model = models.build("mlp", ir=ir, batch_size=8)
        with models.ir_guard(ir):
            scope = paddle.static.Scope()
            with paddle.static.scope_guard(scope):
                exe = paddle.static.Executor(paddle.CPUPlace())
                model.initialize(exe)
                paddle.static.save(model.main, str(root / f"mlp_{ir}"))
    (root / "problem.csv").write_text(
        "id,lower,upper,size\n0,0,3,100\n1,1,4,50\n2,3,6,120\n3,4,8,30\n4,5,9,80\n5,0,9,20\n")
    return root


def one_line_error(result, *fragments):
    assert result.returncode == 1, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("memopt: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_analyze_pir_json(saved):
    result = run_cli("analyze", saved / "mlp_pir.json", "--batch-size", "32",
                     "--budget", "1MiB", "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["ir"] == "pir" and doc["batch_size"] == 32
    assert doc["peak_bytes"] > 0 and doc["persistable_bytes"] > 0
    assert doc["peak_bytes"] == max(doc["timeline"])
    assert isinstance(doc["max_batch_size"], int) and doc["max_batch_size"] > 32
    assert doc["held_at_peak"] and doc["held_at_peak"][0]["bytes"] > 0


def test_analyze_legacy_prefix_text(saved):
    # the prefix given to paddle.static.save names the .pdmodel
    result = run_cli("analyze", saved / "mlp_legacy", "-b", "16", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "(legacy program)" in result.stdout and "peak of the step" in result.stdout
    assert "@GRAD" in result.stdout  # holders keep their legacy names


@pytest.mark.parametrize("ir,ext", [("legacy", ".pdmodel"), ("pir", ".json")])
def test_optimize_writes_a_loadable_program(saved, tmp_path, ir, ext):
    from memopt.paddle.modelio import load_model

    out = tmp_path / f"opt{ext}"
    result = run_cli("optimize", saved / f"mlp_{ir}{ext}", "--level", "1", "-o", out,
                     "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["program_type"] == ir and doc["level"] == 1 and doc["output"] == str(out)
    loaded, original = load_model(str(out)), load_model(str(saved / f"mlp_{ir}{ext}"))
    assert loaded.ir == ir
    count = (lambda p: len(p.global_block().ops))
    # PIR: the ops, and the record of what was made in place (two ops)
    assert count(loaded.program) == count(original.program) + (2 if ir == "pir" else 0)


def test_optimize_level2_and_budget_on_a_saved_pir_program(saved, tmp_path):
    from memopt.paddle.modelio import load_model

    out = tmp_path / "l2.json"
    result = run_cli("optimize", saved / "mlp_pir.json", "--level", "2", "-o", out,
                     "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["program_type"] == "pir" and doc["level"] == 2
    assert any(note.startswith("level 2") for note in doc["notes"]), doc["notes"]
    assert load_model(str(out)).ir == "pir"

    out = tmp_path / "budget.json"
    result = run_cli("optimize", saved / "mlp_pir.json", "--budget", "1GiB", "-b", "8",
                     "-o", out, "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["budget"] == 1 << 30 and doc["peak_after"] <= doc["budget"]
    assert load_model(str(out)).ir == "pir"
    # a budget without the batch it is for is a one-line user error
    one_line_error(run_cli("optimize", saved / "mlp_pir.json", "--budget", "1GiB", "-o", out,
                           "--quiet"), "batch_size")
    # and one nothing can fit names the smallest that can
    one_line_error(run_cli("optimize", saved / "mlp_pir.json", "--budget", "1KiB", "-b", "8",
                           "-o", out, "--quiet"), "smallest budget", "unchanged")


def test_optimize_release_with_gc_off(saved, tmp_path):
    from memopt.paddle.modelio import load_model

    out = tmp_path / "released.pdmodel"
    env_gc_off = {"FLAGS_eager_delete_tensor_gb": "-1"}
    result = run_cli("optimize", saved / "mlp_legacy.pdmodel", "--level", "1", "--keep-grads",
                     "--release", "-o", out, "--json", "--quiet", env=env_gc_off)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)["release_memory"]
    assert doc["gc"] is False and len(doc["released"]) > 0
    ops = [op.type for op in load_model(str(out)).program.global_block().ops]
    assert ops.count("share_buffer") == len(doc["released"])


def test_plan_writes_checked_offsets(saved, tmp_path):
    from memopt.problems import read_csv
    from memopt.simulate import check_offsets

    out = tmp_path / "offsets.csv"
    result = run_cli("plan", saved / "problem.csv", "-o", out, "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    rows = out.read_text().splitlines()
    assert rows[0] == "id,lower,upper,size,offset" and len(rows) == 7
    offsets = {int(r.split(",")[0]): int(r.split(",")[4]) for r in rows[1:]}
    problem = read_csv(saved / "problem.csv")
    assert check_offsets(problem.buffers, offsets) == doc["height"]
    assert doc["lower_bound"] == 250 and doc["height"] >= 250


def test_plot_timeline_and_arena(saved, tmp_path):
    timeline, arena = tmp_path / "timeline.png", tmp_path / "arena.png"
    result = run_cli("plot", saved / "mlp_pir.json", "-o", timeline, "-b", "64", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "before" in result.stdout and "after memory_optimize" in result.stdout
    result = run_cli("plot", saved / "problem.csv", "-o", arena, "--quiet")
    assert result.returncode == 0, result.stderr
    for path in (timeline, arena):
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_console_script_runs():
    script = os.path.join(os.path.dirname(sys.executable), "memopt")
    if not os.path.exists(script):
        pytest.fail("the memopt console script is not installed: pip install -e .")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "analyze" in result.stdout


@pytest.mark.parametrize("command", ["analyze", "optimize", "plan", "plot"])
def test_help_on_every_command(command):
    result = run_cli(command, "--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: memopt " + command)


def test_missing_file(tmp_path):
    one_line_error(run_cli("analyze", tmp_path / "nothere.json"), "no such file")


def test_wrong_format(tmp_path):
    path = tmp_path / "model.txt"
    path.write_text("hello")
    one_line_error(run_cli("analyze", path), "unknown file type '.txt'")
    params = tmp_path / "model.pdparams"
    params.write_bytes(b"\x80\x04")
    one_line_error(run_cli("analyze", params), "parameter file", "model.pdmodel")
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    one_line_error(run_cli("analyze", other), "not a PIR program")


def test_corrupt_files(saved, tmp_path):
    for name in ("mlp_pir.json", "mlp_legacy.pdmodel"):
        data = (saved / name).read_bytes()
        cut = tmp_path / name
        cut.write_bytes(data[: len(data) // 3])
        one_line_error(run_cli("analyze", cut, "--quiet"), "is the file complete?")
    bad = tmp_path / "bad.csv"
    bad.write_text("id,lower,upper,size\n0,5,2,10\n")
    result = run_cli("plan", bad)
    assert result.returncode == 1 and result.stderr.startswith("memopt: error: ")


@pytest.mark.parametrize("args", [
    [], ["analyze"], ["analyze", "m.json", "--batch-size", "0"],
    ["analyze", "m.json", "--budget", "12XB"], ["optimize", "m.json"],
    ["plan", "p.csv", "--time-limit", "-1"], ["frobnicate"],
])
def test_usage_errors_exit_2(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    assert "usage: memopt" in capsys.readouterr().err


def test_analyze_problem_checks_budget(saved, capsys):
    """``analyze PROBLEM.csv --budget`` says whether it can fit (250 bytes are
    live at step 5); it was silently ignored.  The whole-buffer bound says
    it is not an arena's."""
    assert main(["-q", "analyze", str(saved / "problem.csv"), "--budget", "200B", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["peak_live_bytes"] == 250 and doc["budget_bytes"] == 200
    assert doc["fits_lower_bound"] is False
    assert main(["-q", "analyze", str(saved / "problem.csv"), "--budget", "1KiB"]) == 0
    text = capsys.readouterr().out
    assert "budget" in text and "may fit" in text and "an arena with offsets can be lower" in text


def test_unknown_fetch_on_pir_says_how_values_are_named(saved, tmp_path, capsys):
    """A legacy-style name on a PIR program: the error says PIR's names."""
    assert main(["-q", "optimize", str(saved / "mlp_pir.json"), "--fetch", "softmax_0.tmp_0",
                 "-o", str(tmp_path / "o.json")]) == 1
    err = capsys.readouterr().err
    assert "--fetch has a name" in err and "%N" in err and "memopt analyze" in err, err
    assert not (tmp_path / "o.json").exists()


def test_exact_plan_loads_the_kernels_as_a_step_of_its_own(saved, monkeypatch, capsys):
    """The search kernels compile on a fresh install (tens of seconds, not
    counted against --time-limit): ``plan --exact --time-limit 10`` took 37 s
    with one progress line, "planning ... 37.2 s".  Loading them is now a
    step of its own, before the planning step."""
    from memopt import arena, cli

    events = []
    monkeypatch.setattr(arena, "_load_kernels", lambda: events.append("load") or 0.0)
    real = arena.plan_arena
    monkeypatch.setattr(arena, "plan_arena",
                        lambda *a, **k: events.append("plan") or real(*a, **k))
    monkeypatch.setattr(cli, "QUIET_SECONDS", -1.0)      # every step prints its line
    assert main(["plan", str(saved / "problem.csv"), "--exact", "--time-limit", "5"]) == 0
    assert events == ["load", "plan"]
    err = capsys.readouterr().err
    assert err.index("loading the search kernels") < err.index("planning 6 buffers"), err
