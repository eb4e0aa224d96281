"""``memopt`` on models saved the ways users save them
(``save_inference_model``, fluid ``__model__`` directories) and the output
paths a user gets wrong.  What ``tests/sweeps/test_sweep_cli.py`` found, kept fixed:
``optimize -o`` of the input (or its prefix) overwrote the input model; the
written model had no parameters beside it (``load_inference_model`` of it
failed; ``paddle.inference`` ran it on uninitialised weights: NaN); ``-o``
in a missing directory was made by Paddle's PIR writer, ``-o`` in an
unwritable one ended in Paddle's traceback; ``-o model.opt`` was refused
with advice to write ``model.json``, the input; ``optimize -b 0`` ran;
``plot -o x.html`` and ``plan -o`` of the input were found out after the
work (or overwrote the problem)."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from memopt.cli import main
from runs import save_legacy_cnn


def _one_line(capsys, *fragments):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("memopt: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def inference_model(tmp_path_factory, paddle):
    """A PIR ``save_inference_model`` (two inputs, int64 ids with a dynamic
    sequence dim + float features, two outputs) and its feed."""
    root = tmp_path_factory.mktemp("infer")
    main_prog, start = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_prog, start):
        ids = paddle.static.data("ids", [None, None], "int64")
        feat = paddle.static.data("feat", [None, 8], "float32")
        table = paddle.static.create_parameter([50, 8], "float32", name="table")
        pooled = paddle.mean(paddle.nn.functional.embedding(ids, table), axis=1)
        h = paddle.nn.functional.relu(paddle.static.nn.fc(pooled + feat, 16))
        h = paddle.nn.functional.relu(paddle.static.nn.fc(h, 16))
        out = paddle.nn.functional.softmax(paddle.static.nn.fc(h, 3))
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(paddle.static.Scope()):
        exe.run(start)
        paddle.static.save_inference_model(str(root / "model"), [ids, feat], [out, h], exe,
                                           program=main_prog)
    rng = np.random.default_rng(0)
    feed = {"ids": rng.integers(0, 50, (3, 5)).astype("int64"),
            "feat": rng.standard_normal((3, 8)).astype("float32")}
    np.savez(root / "feed.npz", **feed)
    return root


RUN = textwrap.dedent("""
    import sys, numpy as np, paddle
    paddle.enable_static()
    feed = dict(np.load(sys.argv[2]))
    exe = paddle.static.Executor(paddle.CPUPlace())
    outs = []
    for prefix in sys.argv[3:]:
        program, names, fetches = paddle.static.load_inference_model(prefix, exe)
        outs.append(exe.run(program, feed={n: feed[n] for n in names}, fetch_list=fetches))
    np.savez(sys.argv[1], *[o for run in outs for o in run])
""")


def test_optimize_writes_a_model_a_new_process_loads(inference_model, tmp_path, capsys):
    """The parameter file is copied beside the written program (a prefix
    with a dot is a prefix), and ``load_inference_model`` + Executor in a
    new process give the original model's outputs, bit for bit."""
    before = (inference_model / "model.json").read_bytes()
    assert main(["-q", "optimize", str(inference_model / "model"), "--level", "1",
                 "-o", str(tmp_path / "model.opt")]) == 0
    assert "parameters copied" in capsys.readouterr().out
    assert (tmp_path / "model.opt.json").is_file()
    assert (tmp_path / "model.opt.pdiparams").read_bytes() == \
        (inference_model / "model.pdiparams").read_bytes()
    assert (inference_model / "model.json").read_bytes() == before
    out = tmp_path / "outs.npz"
    env = dict(os.environ, GLOG_minloglevel="2", PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, "-c", RUN, str(out), str(inference_model / "feed.npz"),
                             str(inference_model / "model"), str(tmp_path / "model.opt")],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    arrays = np.load(out)
    a, b = [arrays[f"arr_{k}"] for k in (0, 1)], [arrays[f"arr_{k}"] for k in (2, 3)]
    assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("output", ["model.json", "model", "model.pdiparams", "model.pdmodel"])
def test_optimize_never_writes_over_its_input(inference_model, output, capsys):
    files = {f: (inference_model / f).read_bytes() for f in os.listdir(inference_model)}
    assert main(["-q", "optimize", str(inference_model / "model.json"),
                 "-o", str(inference_model / output)]) == 1
    _one_line(capsys, "-o ")
    assert {f: (inference_model / f).read_bytes() for f in os.listdir(inference_model)} == files


def test_bad_output_directories_are_refused_before_the_work(inference_model, tmp_path, capsys):
    model = str(inference_model / "model.json")
    missing = tmp_path / "no" / "dir"
    assert main(["-q", "optimize", model, "-o", str(missing / "o.json")]) == 1
    _one_line(capsys, str(missing), "does not exist")
    assert not missing.parent.exists()  # Paddle's PIR writer made it
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["-q", "optimize", model, "-o", str(blocker / "o.json")]) == 1
    _one_line(capsys, "is not a directory")
    assert main(["-q", "plot", model, "-o", str(missing / "t.png")]) == 1
    _one_line(capsys, "does not exist")
    assert main(["-q", "plot", model, "-o", str(tmp_path / "t.html")]) == 1
    _one_line(capsys, "t.html", ".png, .svg, .pdf")
    if os.path.isdir("/proc"):  # unwritable even for root: Paddle's writer raised
        assert main(["-q", "optimize", model, "-o", "/proc/memopt_o.json"]) == 1
        _one_line(capsys, "/proc/memopt_o.json")


def test_plan_never_writes_over_its_problem(tmp_path, capsys):
    problem = tmp_path / "p.csv"
    problem.write_text("id,lower,upper,size\n0,0,3,100\n1,1,4,50\n")
    assert main(["-q", "plan", str(problem), "-o", str(problem)]) == 1
    _one_line(capsys, "never overwrites")
    assert problem.read_text() == "id,lower,upper,size\n0,0,3,100\n1,1,4,50\n"


@pytest.mark.parametrize("flags,message", [(["-b", "0"], "positive integer"),
                                           (["--budget", "12XB", "-b", "8"], "number of bytes")])
def test_optimize_values_are_checked_as_analyze_checks_them(inference_model, flags, message,
                                                            capsys):
    """``optimize -b 0`` ran; ``--budget 12XB`` was exit 1 after loading
    the model, where ``analyze --budget 12XB`` is a usage error (2)."""
    with pytest.raises(SystemExit) as info:
        main(["optimize", str(inference_model / "model.json"), *flags, "-o", "x.json"])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_several_dynamic_dims_are_named(inference_model, capsys):
    """``ids`` of shape [-1, -1]: the figures are for a B x B input (the
    peak a polynomial in B^2), which nothing said."""
    assert main(["-q", "analyze", str(inference_model / "model.json"), "-b", "4"]) == 0
    captured = capsys.readouterr()
    assert "B^2" in captured.out
    assert "note: ids [-1, -1]: every -1 dimension is taken as the batch size" in captured.out
    assert "feat [" not in captured.out  # [-1, 8]: only the batch is dynamic
    assert main(["-q", "analyze", str(inference_model / "model.json"), "-b", "4",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dynamic_inputs"] == [{"name": "ids", "shape": [-1, -1]}]


def test_plan_of_a_program_says_what_plan_takes(inference_model, capsys):
    """It quoted the whole .json as a bad CSV header (one 2 KB line)."""
    assert main(["-q", "plan", str(inference_model / "model.json")]) == 1
    _one_line(capsys, "interval problem", "memopt analyze")


def test_directories_and_parameter_files(inference_model, tmp_path, capsys, paddle):
    """A fluid ``__model__`` directory is read; another directory names the
    programs it holds; ``.pdiparams.info`` is a parameter file."""
    from paddle.pir_utils import OldIrGuard

    with OldIrGuard():
        main_prog, start = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main_prog, start):
            x = paddle.static.data("x", [None, 4], "float32")
            paddle.static.nn.fc(x, 3)
        fluid = tmp_path / "fluid"
        fluid.mkdir()
        (fluid / "__model__").write_bytes(main_prog.desc.serialize_to_string())
    assert main(["-q", "analyze", str(fluid), "-b", "2"]) == 0
    assert "(legacy program)" in capsys.readouterr().out
    assert main(["-q", "analyze", str(inference_model)]) == 1
    _one_line(capsys, "is a directory", "model.json")
    info = tmp_path / "m.pdiparams.info"
    info.write_bytes(b"\0")
    assert main(["-q", "analyze", str(info)]) == 1
    _one_line(capsys, "parameter file", "m.json")


def test_version_and_help_say_what_the_readme_says(capsys):
    """``--version`` was an unknown flag; ``estimate`` had no help test; the
    help said level 2 and ``--budget`` were PIR-only (both IRs run them)."""
    import memopt

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == \
        f"memopt {memopt.__version__}"
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert all(c in text for c in ("analyze", "optimize", "estimate", "plan", "plot", "__model__"))
    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(PIR" not in text and "both IRs" in text and "copied beside it" in text
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    assert capsys.readouterr().out.startswith("usage: memopt estimate")


def test_legacy_inference_model_at_level_1_warns_about_the_predictor(tmp_path, capsys, paddle):
    """``optimize --level 1`` of legacy ``jit.save`` ResNet-18 / MobileNetV3
    models wrote files ``paddle.inference``'s default predictor cannot load
    (oneDNN: 'could not create a primitive descriptor for a reorder
    primitive'; tests/sweeps/test_sweep_cli.py) without a word; Executor runs them
    bit-identically.  Now a warning says so; level 0 ran and says nothing."""
    import json

    from paddle.pir_utils import OldIrGuard

    with OldIrGuard(), paddle.static.scope_guard(paddle.static.Scope()):
        save_legacy_cnn(paddle, str(tmp_path / "cnn"))
    for level in (1, 0):
        assert main(["-q", "optimize", str(tmp_path / "cnn.pdmodel"), "--level", str(level),
                     "-o", str(tmp_path / f"L{level}"), "--json"]) == 0
        captured = capsys.readouterr()
        doc = json.loads(captured.out)
        assert doc["merged_count"] > 0
        if level:
            assert "predictor" in doc["warning"] and "switch_ir_optim(False)" in doc["warning"]
            assert "memopt: warning:" in captured.err
        else:
            assert "warning" not in doc and not captured.err
    # what the warning is about (drop it when Paddle's predictor loads the file)
    from paddle import inference

    def predictor(prefix, ir_optim=True):
        config = inference.Config(f"{prefix}.pdmodel", f"{prefix}.pdiparams")
        config.disable_gpu()
        config.switch_ir_optim(ir_optim)
        runner = inference.create_predictor(config)
        feed = np.ones((2, 3, 8, 8), "float32")
        runner.get_input_handle(runner.get_input_names()[0]).copy_from_cpu(feed)
        runner.run()
        return runner.get_output_handle(runner.get_output_names()[0]).copy_to_cpu()

    assert np.array_equal(predictor(tmp_path / "L1", ir_optim=False),
                          predictor(tmp_path / "cnn", ir_optim=False))
    assert np.array_equal(predictor(tmp_path / "L0"), predictor(tmp_path / "cnn"))
    with pytest.raises(RuntimeError, match="primitive descriptor"):
        predictor(tmp_path / "L1")
