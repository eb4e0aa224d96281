"""Rewritten programs through the workflows test_fetch_trust.py does not take them.

The deployment predictor (``paddle.inference.create_predictor``, Paddle's IR
passes and its own memory optimization on and off) in a new process, desc
round trips (``serialize_program`` / ``deserialize_program``,
``normalize_program``), Executor variants (``use_prune``, a
``CompiledProgram`` with ``BuildStrategy`` flags, ``return_numpy=False``)
and a fetch of every name ``program.list_vars()`` shows: each gives the
unchanged program's bytes, or a memopt error naming what was asked for.
The whole matrix (8 programs x both IRs x levels 0/1/2 and budget= x GC on
and off) is tests/sweeps/test_sweep_workflows.py.
"""
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import memopt
from memopt.testing import models
from memopt.errors import MergedVariableError
from test_fetch_trust import GC, build, data_names, optimize_legacy, same


def _list_vars_names(program):
    """Every dense, non-persistable name ``program.list_vars()`` shows, feeds
    and feed/fetch holders left out."""
    from paddle.base import core

    return sorted(v.name for v in program.list_vars()
                  if v.desc.type() == core.VarDesc.VarType.DENSE_TENSOR and not v.persistable
                  and not v.desc.need_check_feed() and v.name not in ("feed", "fetch"))


def _run(model, program, fetch, steps=1, **kw):
    """``steps`` runs of ``program`` in a fresh scope from the seeded
    startup program, a new Executor; the last run's ``fetch``."""
    import paddle

    feed = model.feed(np.random.default_rng(5))
    with paddle.static.scope_guard(paddle.static.Scope()), model.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        for _ in range(steps):
            out = exe.run(program, feed=feed, fetch_list=list(fetch), **kw)
    return [np.array(v) for v in out]


@pytest.mark.parametrize("gc", ["on", "off"])
def test_legacy_every_listed_name_fetches_right_or_refuses(paddle, gc):
    """Every name ``list_vars()`` shows of a rewritten program, the clone and
    a parsed copy: the unchanged value, or MergedVariableError naming it.
    Fetching a shared buffer ``memopt@buf_<k>`` (listed by ``list_vars()``)
    returned whichever merged variable wrote it last; now it is refused,
    naming the variables it holds."""
    from paddle.base.framework import Program as LegacyProgram

    ref, opt = build("accuracy", "legacy"), build("accuracy", "legacy")
    optimize_legacy(opt, gc, 1, release=False)
    with models.flags(eager_delete_tensor_gb=GC[gc]["FLAGS_eager_delete_tensor_gb"]):
        for derive in (lambda p: p, lambda p: p.clone(),
                       lambda p: LegacyProgram.parse_from_string(p.desc.serialize_to_string())):
            program = derive(opt.main)
            names = _list_vars_names(program)
            buffers = [n for n in names if n.startswith("memopt@buf_")]
            assert buffers
            mine = [n for n in names if not n.startswith("memopt@")]
            want = dict(zip(mine, _run(ref, derive(ref.main), mine)))
            got = dict(zip(mine, _run(opt, program, mine)))
            assert all(same(want[n], got[n]) for n in mine)
            record = memopt.paddle.legacy.program.merged_record(program)
            for buf in buffers:
                members = sorted(n for n, b in record.items() if b == buf)
                with pytest.raises(MergedVariableError,
                                   match=re.escape(repr(buf)) + r".*" + re.escape(repr(members[0]))):
                    _run(opt, program, [buf])


def _derivations_legacy(paddle, model):
    """What a legacy user derives from a training program: ``{key: arrays}``."""
    block = model.main.global_block()
    feeds = [block.var(n) for n in data_names(model.main) if n != "y"]
    logits = block.var(model.fetch_list[2].name)
    out = {"use_prune": _run(model, model.main, [logits.name], use_prune=True),
           "return_numpy=False": _run(model, model.main, [logits.name, model.loss.name],
                                      return_numpy=False)}
    for key, flags in {"plain": {}, "inplace+memory_optimize": dict(
            enable_inplace=True, memory_optimize=True), "fuse": dict(
            fuse_bn_add_act_ops=True, fuse_broadcast_ops=True)}.items():
        strategy = paddle.static.BuildStrategy()
        for k, v in flags.items():
            setattr(strategy, k, v)
        compiled = paddle.static.CompiledProgram(model.main, build_strategy=strategy)
        out["compiled " + key] = _run(model, compiled, [logits.name, model.loss.name], steps=2)
    with paddle.static.scope_guard(paddle.static.Scope()), model.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        desc = paddle.static.serialize_program(feeds, [logits], program=model.main)
        params = paddle.static.serialize_persistables(feeds, [logits], exe, program=model.main)
        normalized = paddle.static.normalize_program(model.main, feeds, [logits])
        x = {"x": model.feed(np.random.default_rng(5))["x"]}
        out["normalize_program"] = exe.run(normalized, feed=x, fetch_list=[logits.name])
    with paddle.static.scope_guard(paddle.static.Scope()), model.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        program = paddle.static.deserialize_program(desc)
        paddle.static.deserialize_persistables(program, params, exe)
        out["deserialize_program"] = exe.run(program, feed=x, fetch_list=[logits.name])
    return out


def test_legacy_prune_compiled_and_serialized_derivations(paddle):
    """use_prune, return_numpy=False, CompiledProgram with BuildStrategy
    flags (2 steps), normalize_program, serialize/deserialize_program +
    persistables of a rewritten program (logits kept by fetch_list): the
    unchanged program's bytes and dtypes."""
    ref, opt = build("accuracy", "legacy"), build("accuracy", "legacy")
    with models.ir_guard("legacy"), models.flags(eager_delete_tensor_gb=0.0):
        report = memopt.memory_optimize(opt.main, level=1, fetch_list=opt.fetch_list)
        assert report.reuses
        want, got = _derivations_legacy(paddle, ref), _derivations_legacy(paddle, opt)
    assert set(want) == set(got)
    for key in want:
        assert all(same(np.array(a), np.array(b)) and np.array(a).dtype == np.array(b).dtype
                   for a, b in zip(want[key], got[key], strict=True)), key


PREDICTOR = textwrap.dedent("""
    import json, os, sys
    job = json.load(open(sys.argv[1]))
    if job["ir"] == "legacy":
        os.environ["FLAGS_enable_pir_api"] = "0"
    import numpy as np, paddle
    feed = dict(np.load(job["feed"]))
    out = {}
    for tag, prefix in job["models"].items():
        for variant in job["variants"]:
            config = paddle.inference.Config(prefix + job["ext"], prefix + ".pdiparams")
            config.disable_gpu()
            if "no_ir_optim" in variant:
                config.switch_ir_optim(False)
            if "memory_optim" in variant:
                config.enable_memory_optim()
            predictor = paddle.inference.create_predictor(config)
            for name in predictor.get_input_names():
                predictor.get_input_handle(name).copy_from_cpu(feed[name])
            predictor.run()
            for name in predictor.get_output_names():
                out[f"{tag}/{variant}/{name}"] = predictor.get_output_handle(name).copy_to_cpu()
    np.savez(job["out"], **out)
""")


def _classifier(paddle, ir):
    """An inference program (no backward): conv, batch norm in eval mode,
    ReLU, conv, ReLU, two linear layers with a ReLU, softmax; the rewrite
    makes the adds and ReLUs in place (PIR) or merges them (legacy)."""
    nn = paddle.nn
    with models.ir_guard(ir):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            image = paddle.static.data("image", [-1, 3, 16, 16], "float32")
            net = nn.Sequential(nn.Conv2D(3, 8, 3, padding=1), nn.BatchNorm2D(8), nn.ReLU(),
                                nn.Conv2D(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                nn.Linear(8 * 16 * 16, 32), nn.ReLU(), nn.Linear(32, 4))
            net.eval()
            out = nn.functional.softmax(net(image))
    return models.BuiltModel(name="classifier", ir=ir, main=main, startup=startup,
                             feed=lambda rng: {"image": rng.standard_normal(
                                 (4, 3, 16, 16)).astype("float32")},
                             fetch_list=[out], batch_size=4)


@pytest.mark.parametrize("ir", ["legacy", "pir"])
def test_predictor_in_a_new_process_runs_the_rewritten_model_as_the_unchanged(
        paddle, tmp_path, ir):
    """save_inference_model of a rewritten classifier, run by
    paddle.inference's predictor in a new process with Paddle's IR passes
    on and off (legacy: and its own memory_optim; on PIR Paddle 3.3.1's
    predictor fails with memory_optim for any model): the same output
    names and bytes as the unchanged model's.  On PIR the model held
    memopt's in-place ops (add_, relu_), which the predictor runs with
    other kernels: softmax outputs differed in the last bits (0.25930578
    vs 0.25930575); the saved model now holds the ops as built
    (memopt.paddle.pir.deploy) and the user's program keeps its own."""
    from memopt.paddle.pir import deploy as pir_deploy, rewrite as pir_rewrite

    assert pir_deploy.MARK_ATTR == pir_rewrite.MARK_ATTR
    ref, opt = _classifier(paddle, ir), _classifier(paddle, ir)
    with models.flags(eager_delete_tensor_gb=0.0):
        report = memopt.memory_optimize(opt.main, level=1, fetch_list=opt.fetch_list)
    assert report.reuses
    before = str(opt.main) if ir == "pir" else opt.main.desc.serialize_to_string()
    feed = ref.feed(np.random.default_rng(9))
    np.savez(tmp_path / "feed.npz", **feed)
    for tag, model in (("ref", ref), ("opt", opt)):
        with paddle.static.scope_guard(paddle.static.Scope()), model.guard():
            exe = paddle.static.Executor(paddle.CPUPlace())
            model.initialize(exe)
            if ir == "legacy":
                block = model.main.global_block()
                image, out = block.var("image"), block.var(model.fetch_list[0].name)
            else:
                image = next(op.result(0) for op in model.main.global_block().ops
                             if op.name() == "pd_op.data")
                out = model.fetch_list[0]
            paddle.static.save_inference_model(str(tmp_path / tag), [image], [out], exe,
                                               program=model.main)
    assert (str(opt.main) if ir == "pir" else opt.main.desc.serialize_to_string()) == before
    variants = ["ir_optim", "no_ir_optim"] + (["memory_optim", "memory_optim+no_ir_optim"]
                                             if ir == "legacy" else [])
    job = {"ir": ir, "ext": ".pdmodel" if ir == "legacy" else ".json",
           "models": {t: str(tmp_path / t) for t in ("ref", "opt")}, "variants": variants,
           "feed": str(tmp_path / "feed.npz"), "out": str(tmp_path / "out")}
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "child.py").write_text(PREDICTOR)
    env = dict(os.environ, GLOG_minloglevel="2",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    env.pop("FLAGS_enable_pir_api", None)
    done = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "job.json")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = dict(np.load(str(tmp_path / "out.npz")))
    mine = sorted(k.split("/", 1)[1] for k in got if k.startswith("opt/"))
    assert mine == sorted(k.split("/", 1)[1] for k in got if k.startswith("ref/"))
    assert len(mine) == len(variants)
    for key in mine:
        assert same(got["ref/" + key], got["opt/" + key]), key


def test_cli_on_a_pir_inference_model_warns_about_the_predictor(paddle, tmp_path, capsys):
    """``memopt optimize`` of a PIR inference model makes ops in place: the
    file runs bit-identically under load_inference_model + Executor, but
    paddle.inference's predictor (oneDNN) gave outputs differing in the last
    bits, silently.  The CLI now says so on stderr and in --json; a PIR
    training program gets no warning."""
    from memopt import cli

    model = _classifier(paddle, "pir")
    with paddle.static.scope_guard(paddle.static.Scope()), model.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        image = next(op.result(0) for op in model.main.global_block().ops
                     if op.name() == "pd_op.data")
        paddle.static.save_inference_model(str(tmp_path / "inf"), [image], model.fetch_list,
                                           exe, program=model.main)
        program, _, targets = paddle.static.load_inference_model(str(tmp_path / "inf"), exe)
        feed = model.feed(np.random.default_rng(2))
        want = exe.run(program, feed=feed, fetch_list=targets)[0]
    assert cli.main(["-q", "optimize", str(tmp_path / "inf.json"), "--level", "1", "--json",
                     "-o", str(tmp_path / "opt.json")]) == 0
    out, err = capsys.readouterr()
    assert "warning:" in err and "predictor" in err and "last bits" in err, err
    assert "predictor" in json.loads(out)["warning"]
    import shutil

    shutil.copy(tmp_path / "inf.pdiparams", tmp_path / "opt.pdiparams")
    with paddle.static.scope_guard(paddle.static.Scope()), model.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        program, _, targets = paddle.static.load_inference_model(str(tmp_path / "opt"), exe)
        assert any(op.name() == "pd_op.relu_" for op in program.global_block().ops)
        assert same(want, exe.run(program, feed=feed, fetch_list=targets)[0])
    train = build("mlp", "pir")
    with paddle.static.scope_guard(paddle.static.Scope()), train.guard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        train.initialize(exe)
        paddle.static.save(train.main, str(tmp_path / "train"))
    assert cli.main(["-q", "optimize", str(tmp_path / "train.json"), "--level", "1",
                     "-o", str(tmp_path / "train_opt.json")]) == 0
    assert "warning:" not in capsys.readouterr().err


def test_legacy_compiled_fusion_refused_other_flags_bit_identical(paddle):
    """CompiledProgram(fuse_elewise_add_act_ops=True) of the classifier
    rewritten at level 1 computed a softmax off by up to 0.5 (Paddle's
    fusion on a merged buffer; the unchanged program's run is deterministic):
    now UnsupportedProgramError naming the flag and the fix, before Paddle
    runs; enable_inplace + memory_optimize + fuse_broadcast_ops give the
    unchanged bytes."""
    from paddle.base.executor import Executor

    from memopt.errors import UnsupportedProgramError

    ref, opt = _classifier(paddle, "legacy"), _classifier(paddle, "legacy")
    with models.ir_guard("legacy"), models.flags(eager_delete_tensor_gb=0.0):
        memopt.memory_optimize(opt.main, level=1, fetch_list=opt.fetch_list)
        out = opt.fetch_list[0].name

        def compiled(model, **flags):
            strategy = paddle.static.BuildStrategy()
            for k, v in flags.items():
                setattr(strategy, k, v)
            return paddle.static.CompiledProgram(model.main, build_strategy=strategy)

        for flag in ("fuse_elewise_add_act_ops", "fuse_bn_act_ops"):
            with pytest.raises(UnsupportedProgramError, match=rf"{flag}=True.*{flag} = False"):
                _run(opt, compiled(opt, **{flag: True}), [out])
        fine = dict(enable_inplace=True, memory_optimize=True, fuse_broadcast_ops=True)
        assert same(_run(ref, compiled(ref, **fine), [out], steps=2)[0],
                    _run(opt, compiled(opt, **fine), [out], steps=2)[0])
        # what the refusal prevents (Paddle's run, memopt's guard bypassed)
        seen = [n for n in _list_vars_names(opt.main) if not n.startswith("memopt@")]
        guarded = plain = Executor.run
        while hasattr(plain, "__memopt_original__"):
            plain = plain.__memopt_original__
        Executor.run = plain
        try:
            fused = _run(opt, compiled(opt, fuse_elewise_add_act_ops=True), seen)
        finally:
            Executor.run = guarded
        want = _run(ref, compiled(ref, fuse_elewise_add_act_ops=True), seen)
        worst = max(float(np.abs(a - b).max()) for a, b in zip(want, fused, strict=True)
                    if a.dtype == np.float32)
        assert worst > 0.1, worst


def test_legacy_translate_to_pir_of_a_rewritten_desc_refused(paddle):
    """paddle.pir.translate_to_pir(_with_param_map) of a rewritten legacy
    desc: the LSTM classifier rewritten with the GC on ran translated into
    Paddle's 'Tensor holds no memory' (level 1, GC off: a shape mismatch);
    now UnsupportedProgramError saying to translate the program as built.
    The unchanged desc translates; memopt's own analysis of the rewritten
    program (which translates it to read liveness) still works."""
    from memopt.errors import UnsupportedProgramError

    ref, opt = build("lstm", "legacy"), build("lstm", "legacy")
    optimize_legacy(opt, "on", 0, release=False)
    before = opt.main.desc.serialize_to_string()
    with models.ir_guard("pir"):
        assert paddle.pir.translate_to_pir(ref.main.desc).global_block().ops
        for fn in (paddle.pir.translate_to_pir, paddle.pir.translate_to_pir_with_param_map):
            with pytest.raises(UnsupportedProgramError,
                               match=r"memopt@.*Translate the program as built"):
                fn(opt.main.desc)
    assert opt.main.desc.serialize_to_string() == before
    with models.ir_guard("legacy"):
        assert memopt.analyze(opt.main, 4).peak(4) > 0
