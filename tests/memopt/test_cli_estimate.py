"""``memopt estimate``: the per-rank estimate from a saved program, text and
JSON, in a subprocess; the API on the same program."""
import json
import os
import subprocess
import sys

import pytest

import memopt


def run_cli(*args, timeout=300):
    env = dict(os.environ, GLOG_minloglevel="2", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "memopt.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, paddle):
    from memopt.testing import models

    root = tmp_path_factory.mktemp("saved_estimate")
    model = models.build("mlp", ir="legacy", batch_size=8)
    with models.ir_guard("legacy"):
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe = paddle.static.Executor(paddle.CPUPlace())
            model.initialize(exe)
            paddle.static.save(model.main, str(root / "mlp_legacy"))
    return root, model


def test_estimate_json_and_text(saved):
    root, model = saved
    one = run_cli("estimate", root / "mlp_legacy", "-b", "64", "--json", "--quiet")
    assert one.returncode == 0, one.stderr
    doc = json.loads(one.stdout)
    assert doc["ir"] == "legacy" and doc["micro_batch_size"] == 64
    comps = doc["components"]
    # the bundled MLP trains with Momentum: one velocity per parameter, of its bytes
    assert comps["parameters"] > 0 and comps["optimizer state"] == comps["parameters"]
    assert doc["peak_per_rank"] == sum(comps.values())

    sharded = run_cli("estimate", root / "mlp_legacy", "-b", "64", "--dp", "2",
                      "--sharding-stage", "3", "--json", "--quiet")
    assert sharded.returncode == 0, sharded.stderr
    doc2 = json.loads(sharded.stdout)
    assert doc2["micro_batch_size"] == 32
    # a legacy program is sharded by fleet's static sharding: no stage 3
    # (its stage-1 program), each rank's own parameters
    assert "no stage 3" in doc2["formula"]["gradients"] and len(doc2["per_rank"]) == 2
    assert 0 < doc2["components"]["parameters"] < comps["parameters"]
    assert doc2["peak_per_rank"] < doc["peak_per_rank"]

    text = run_cli("estimate", root / "mlp_legacy", "-b", "64", "--pp", "2",
                   "--micro-batch-size", "8", "--recompute", "--quiet")
    assert text.returncode == 0, text.stderr
    assert "peak per rank" in text.stdout and "pp=2" in text.stdout

    # the API on the saved program's source gives the same parameters
    api = memopt.estimate(model.main, batch_size=64)
    assert api.components["parameters"] == comps["parameters"]


def test_estimate_usage_errors(saved):
    root, _ = saved
    bad = run_cli("estimate", root / "mlp_legacy", "-b", "63", "--dp", "2", "--quiet")
    assert bad.returncode == 1 and "-b 63 is not a multiple of --dp" in bad.stderr
    micro = run_cli("estimate", root / "mlp_legacy", "-b", "8", "--dp", "2",
                    "--micro-batch-size", "3", "--quiet")
    assert micro.returncode == 1 and "--dp * --micro-batch-size = 6" in micro.stderr
    missing = run_cli("estimate", root / "mlp_legacy", "--quiet")
    assert missing.returncode == 2
    with pytest.raises(TypeError, match="strategy fields"):
        memopt.estimate(saved[1].main, batch_size=8, dpp=2)


def test_inference_program_has_no_optimizer_state(paddle, tmp_path):
    """A saved PIR inference program's fetched output is persistable (PIR's
    fetch op) and [-1, 10]: it was counted as 40 B of "optimizer state"
    (jit.saved ResNet-18); now "other", and the optimizer state is 0."""
    from memopt.parallel import Strategy

    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, 32], "float32")
        out = paddle.nn.functional.softmax(paddle.static.nn.fc(x, 10))
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(paddle.static.Scope()):
        exe.run(startup)
        paddle.static.save_inference_model(str(tmp_path / "infer"), [x], [out], exe,
                                           program=main)
        program, _, _ = paddle.static.load_inference_model(str(tmp_path / "infer"), exe)
    assert any(op.name() == "pd_op.fetch" for op in program.global_block().ops)
    comps = memopt.estimate(program, Strategy(dp=2), 64).to_json()["components"]
    assert comps["optimizer state"] == 0 and comps["other persistable"] == 40, comps
