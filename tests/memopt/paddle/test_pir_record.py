"""What memopt made in place travels inside a PIR program (issue 13), and
legacy programs memopt rewrote either run translated to PIR or are refused.

PIR: ``memory_optimize`` marks each op it makes in place (an op attribute
Paddle's ``.json`` writer drops) and records the marks in the program as the
``output_name`` of a ``builtin.shadow_output`` fed by a one-byte constant
(which the writer keeps).  A program saved with ``paddle.static.save``,
loaded again -- here or in another process -- refuses, by the value's op and
position, a fetch of a Value an in-place op writes over, and fetches the rest
bit-identically; so do ``save_inference_model`` / ``load_inference_model``
(which write the ops as built: :mod:`memopt.paddle.pir.deploy`).

Legacy run with ``FLAGS_enable_pir_in_executor=1`` (the executor translates
the program to PIR): ``memory_optimize`` with the GC on gives bit-identical
training; ``release_memory`` with the GC off refuses, program unchanged; a
program rewritten for the legacy executor is refused at run time by a
message naming the flag (not Paddle's "Tensor holds no memory").
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
from memopt.paddle.pir import rewrite as pir_rewrite


def _run(model, program, values, feed, params=None):
    """Run ``program`` once in a fresh scope with a new Executor (parameters
    from the seeded startup program, or the saved state ``params``)."""
    import paddle

    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), models.ir_guard("pir"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        if params is None:
            model.initialize(exe)
        else:
            for name, array in paddle.static.load_program_state(params).items():
                scope.var(name).get_tensor().set(array, paddle.CPUPlace())
        return [np.array(v) for v in exe.run(program, feed=feed, fetch_list=values)]


def _overwritten(program):
    """``{(op index, result index): marked op index}`` of the top-level values a
    marked op writes over, and the other compute values (op index, 0)."""
    ops = program.global_block().ops
    marked = [k for k, op in enumerate(ops) if op.has_attr(pir_rewrite.MARK_ATTR)]
    over = {}
    for k in marked:
        src = ops[k].operand_source(0)
        for j, op in enumerate(ops[:k]):
            if op.num_results() and op.result(0).is_same(src):
                over[(j, 0)] = k
    return over


def _load(path):
    import paddle
    from paddle.base import core

    program = paddle.static.Program()
    core.deserialize_pir_program(path, program, -1)
    return program


def test_pir_record_survives_save_load_clone_inference(paddle, tmp_path):
    ref, opt = models.build("mlp", "pir", batch_size=4), models.build("mlp", "pir", batch_size=4)
    report = memopt.memory_optimize(opt.main)
    assert report.reuses
    ops = opt.main.global_block().ops
    # the record: a one-byte constant fed to a shadow_output, at the end
    assert [op.name() for op in ops[-2:]] == ["pd_op.full", "builtin.shadow_output"]
    assert ops[-1].attrs()["output_name"].startswith(pir_rewrite.RECORD_PREFIX)
    assert list(ops[-2].result(0).shape) == [1] and "uint8" in str(ops[-2].result(0).dtype)
    over = _overwritten(opt.main)
    assert len(over) == len(report.reuses)
    feed = ref.feed(np.random.default_rng(3))
    keep = [(k, 0) for k, op in enumerate(ref.main.global_block().ops)
            if op.name() in ("pd_op.matmul", "pd_op.mean") and (k, 0) not in over]
    want = _run(ref, ref.main, [ref.main.global_block().ops[k].result(r) for k, r in keep], feed)

    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("pir"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        opt.initialize(exe)
        paddle.static.save(opt.main, str(tmp_path / "m"))
        fed = set(feed)
        data = [op.result(0) for op in ops if op.name() == "pd_op.data"
                and op.attrs().get("name") in fed]
        paddle.static.save_inference_model(str(tmp_path / "inf"), data, [opt.loss], exe,
                                           program=opt.main)
    loaded = _load(str(tmp_path / "m.json"))
    # the .json writer dropped the op attribute; the record is there
    assert not any(op.has_attr(pir_rewrite.MARK_ATTR) for op in loaded.global_block().ops)
    assert pir_rewrite._record_ops(loaded)
    for name, program, params in (("program", opt.main, None), ("clone", opt.main.clone(), None),
                                  ("json", loaded, str(tmp_path / "m")),
                                  ("json clone", _load(str(tmp_path / "m.json")).clone(),
                                   str(tmp_path / "m"))):
        block_ops = program.global_block().ops
        got = _run(opt, program, [block_ops[k].result(r) for k, r in keep], feed, params)
        for w, a, b in zip(keep, want, got, strict=True):
            assert np.array_equal(a, b), (name, w)
        for (k, r), at in over.items():
            with pytest.raises(MergedVariableError, match=r"write over it") as info:
                _run(opt, program, [block_ops[k].result(r)], feed, params)
            # named as a user knows it: the producing op, its position, %N
            assert re.search(rf"cannot fetch pd_op\.\w+ at op {k}\b.*\(%\d+\)",
                             str(info.value)) and block_ops[at].name() in str(info.value), name

    # the inference model holds the ops as built (memopt.paddle.pir.deploy:
    # the predictor runs in-place ops with other kernels), so no record
    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("pir"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        program, _, targets = paddle.static.load_inference_model(str(tmp_path / "inf"), exe)
        loss = exe.run(program, feed=feed, fetch_list=targets)[0]
        assert not pir_rewrite._record_ops(program)
        names = [op.name() for op in program.global_block().ops]
        assert "pd_op.relu" in names and "pd_op.relu_" not in names and "pd_op.add_" not in names
    assert np.array_equal(loss, _run(ref, ref.main, [ref.loss], feed)[0])


def test_pir_record_is_rewritten_not_stacked_and_a_stale_one_refuses_more(paddle, tmp_path):
    """Optimizing a reloaded program again keeps one record holding the old
    marks and the new; a record whose op moved marks every op of that name."""
    model = models.build("mlp", "pir", batch_size=4)
    memopt.memory_optimize(model.main)
    first = pir_rewrite._record_ops(model.main)[0].attrs()["output_name"]
    with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("pir"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        model.initialize(exe)
        paddle.static.save(model.main, str(tmp_path / "m"))
    loaded = _load(str(tmp_path / "m.json"))
    memopt.memory_optimize(loaded, level=1)
    records = pir_rewrite._record_ops(loaded)
    assert len(records) == 1 and len(loaded.global_block().ops) == len(
        model.main.global_block().ops)
    assert records[0].attrs()["output_name"] == first
    # a record naming an op that is no longer at its position
    stale = _load(str(tmp_path / "m.json"))
    rec = pir_rewrite._record_ops(stale)[0]
    entries = json.loads(rec.attrs()["output_name"][len(pir_rewrite.RECORD_PREFIX):])
    entries[0][0] = "0"
    rec.set_str_attr("output_name", pir_rewrite._encode(entries))
    pir_rewrite.restore_marks(stale)
    name = entries[0][1]
    same_name = [op for op in stale.global_block().ops if op.name() == name]
    assert same_name and all(op.has_attr(pir_rewrite.MARK_ATTR) for op in same_name)


CHILD_PIR = textwrap.dedent("""
    import json, sys
    import numpy as np, paddle
    from paddle.base import core
    if sys.argv[2] == "memopt":
        import memopt
        memopt.install_fetch_guard()
    paddle.enable_static()
    job = json.load(open(sys.argv[1]))
    feed = dict(np.load(job["feed"]))
    out = {}
    exe = paddle.static.Executor(paddle.CPUPlace())
    for key in ("saved", "cli"):
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            program = paddle.static.Program()
            core.deserialize_pir_program(job[key], program, -1)
            for name, array in paddle.static.load_program_state(job["params"]).items():
                scope.var(name).get_tensor().set(array, paddle.CPUPlace())
            ops = program.global_block().ops
            for k, r in job["over"]:
                try:
                    exe.run(program, feed=feed, fetch_list=[ops[k].result(r)])
                    out[f"{key}/{k}"] = "NO ERROR"
                except Exception as exc:
                    out[f"{key}/{k}"] = type(exc).__name__ + ": " + str(exc)
    json.dump(out, open(job["out"], "w"))
""")


def test_pir_another_process_refuses_overwritten_values_of_saved_and_cli_files(paddle, tmp_path):
    from memopt import cli

    ref, opt = models.build("mlp", "pir", batch_size=4), models.build("mlp", "pir", batch_size=4)
    memopt.memory_optimize(opt.main)
    over = sorted(_overwritten(opt.main))
    feed = ref.feed(np.random.default_rng(5))
    np.savez(tmp_path / "feed.npz", **feed)
    for model, prefix in ((opt, "opt"), (ref, "ref")):
        with paddle.static.scope_guard(paddle.static.Scope()), models.ir_guard("pir"):
            exe = paddle.static.Executor(paddle.CPUPlace())
            model.initialize(exe)
            paddle.static.save(model.main, str(tmp_path / prefix))
    assert cli.main(["-q", "optimize", str(tmp_path / "ref.json"),
                     "-o", str(tmp_path / "cli.json")]) == 0
    cli_over = sorted(_overwritten(_restored(str(tmp_path / "cli.json"))))
    assert cli_over == over
    job = {"feed": str(tmp_path / "feed.npz"), "over": over, "params": str(tmp_path / "opt"),
           "saved": str(tmp_path / "opt.json"), "cli": str(tmp_path / "cli.json"),
           "out": str(tmp_path / "out.json")}
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "child.py").write_text(CHILD_PIR)
    env = dict(os.environ, GLOG_minloglevel="2",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(tmp_path / "child.py"),
                           str(tmp_path / "job.json"), "memopt"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert len(out) == 2 * len(over)
    for key, message in out.items():
        k = key.split("/")[1]
        assert message.startswith("MergedVariableError") and \
            re.search(rf"at op {k}\b.*\(%\d+\)", message), (key, message)


def _restored(path):
    program = _load(path)
    pir_rewrite.restore_marks(program)
    return program


# -- legacy programs run translated to PIR --------------------------------------------------

CHILD_LEGACY = textwrap.dedent("""
    import json, os, sys
    import numpy as np, paddle, memopt
    from memopt.testing import fleet_models
    paddle.enable_static()
    out = {}

    def build():
        return fleet_models.build("single", features=16, hidden=32, layers=2)

    def steps(main, startup, loss, params):
        rng = np.random.default_rng(0)
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe = paddle.static.Executor(paddle.CPUPlace())
            paddle.seed(1)
            exe.run(startup)
            losses = [exe.run(main, feed={"x": rng.random((8, 16), dtype=np.float32),
                                          "y": rng.random((8, 1), dtype=np.float32)},
                              fetch_list=[loss])[0] for _ in range(3)]
            return losses + [np.array(scope.find_var(n).get_tensor()) for n in params]

    def same(a, b):
        return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))

    paddle.set_flags({"FLAGS_eager_delete_tensor_gb": 0.0})
    # memory_optimize with the flag on and the GC on: bit-identical
    paddle.set_flags({"FLAGS_enable_pir_in_executor": True})
    base = build()
    params = sorted(v.name for v in base[0].list_vars() if v.persistable and "@" not in v.name
                    and v.name not in ("feed", "fetch"))
    want = steps(*base, params)
    for level in (0, 1):
        main, startup, loss = build()
        report = memopt.memory_optimize(main, level=level, skip_grads=False)
        out[f"optimize{level}"] = [report.merged_count, same(want, steps(main, startup, loss,
                                                                          params))]
    # release_memory with the GC off: refused, program unchanged
    paddle.set_flags({"FLAGS_eager_delete_tensor_gb": -1.0})
    main, startup, loss = build()
    before = main.desc.serialize_to_string()
    try:
        memopt.release_memory(main)
        out["release"] = "NO ERROR"
    except memopt.errors.UnsupportedProgramError as exc:
        out["release"] = str(exc)
    out["release_unchanged"] = main.desc.serialize_to_string() == before
    # rewritten for the legacy executor (flag off), run with it on: named refusals
    for kind, gc in (("optimize", 0.0), ("release", -1.0)):
        paddle.set_flags({"FLAGS_eager_delete_tensor_gb": gc,
                          "FLAGS_enable_pir_in_executor": False})
        main, startup, loss = build()
        if kind == "optimize":
            memopt.memory_optimize(main, skip_grads=False)
        else:
            memopt.release_memory(main)
        paddle.set_flags({"FLAGS_enable_pir_in_executor": True})
        try:
            steps(main, startup, loss, [])
            out["run_" + kind] = "NO ERROR"
        except memopt.errors.UnsupportedProgramError as exc:
            out["run_" + kind] = str(exc)
    json.dump(out, open(sys.argv[1], "w"))
""")


def test_legacy_programs_run_translated_to_pir_or_are_refused(tmp_path):
    from conftest import need

    need("paddle")
    (tmp_path / "child.py").write_text(CHILD_LEGACY)
    env = dict(os.environ, GLOG_minloglevel="2", FLAGS_enable_pir_api="0",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "o.json")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads((tmp_path / "o.json").read_text())
    for level in (0, 1):
        merged, same = out[f"optimize{level}"]
        assert merged > 0 and same, out
    assert "FLAGS_enable_pir_in_executor" in out["release"] and out["release_unchanged"], out
    for kind in ("optimize", "release"):
        assert "FLAGS_enable_pir_in_executor" in out["run_" + kind], out
