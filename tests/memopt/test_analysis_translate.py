"""memopt.analyze on legacy programs goes through Paddle's translation to PIR.

- It works in a process started with ``FLAGS_enable_pir_api=0`` (the
  documented way to get the legacy IR), where PIR's context is not set up
  until something initialises it, and so does ``memopt analyze`` from such a
  shell; PIR programs built there (under ``IrGuard``) too.  Each check runs
  in a fresh subprocess: the test process has PIR initialised already.
- A program Paddle cannot translate gives UnsupportedProgramError naming the
  op and the way around, never Paddle's raw SystemError/ValueError.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from memopt.testing import models
from memopt import analyze
from memopt.errors import UnsupportedProgramError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _legacy_env():
    env = dict(os.environ, FLAGS_enable_pir_api="0", GLOG_minloglevel="2",
               PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def _run(args, timeout=300):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=_legacy_env(), cwd=ROOT)


# the script run in a fresh FLAGS_enable_pir_api=0 process: analyse a legacy
# and a PIR model first thing, print the figures as JSON
_FRESH = textwrap.dedent("""
    import json, sys
    import paddle
    paddle.enable_static()
    assert not paddle.framework.in_pir_mode()
    import memopt
    from memopt.testing import models
    out = {}
    for name, ir in (("lstm", "legacy"), ("mlp", "legacy"), ("mlp", "pir")):
        m = models.build(name, ir)
        with m.guard():
            a = memopt.analyze(m.main, m.batch_size, fetch_list=m.fetch_list)
        out[f"{name}/{ir}"] = [a.peak(), a.persistable_bytes(), len(a.op_types)]
    print(json.dumps(out))
""")


def _here(name, ir):
    m = models.build(name, ir)
    with m.guard():
        a = analyze(m.main, m.batch_size, fetch_list=m.fetch_list)
    return [a.peak(), a.persistable_bytes(), len(a.op_types)]


def test_analyze_in_a_legacy_process_both_irs(paddle):
    """First call in a FLAGS_enable_pir_api=0 process: the same figures as
    in this process (legacy LSTM and MLP, PIR MLP)."""
    result = _run(["-c", _FRESH])
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    for key, figures in got.items():
        name, ir = key.split("/")
        assert figures == _here(name, ir), key
        assert figures[0] > 0 and figures[2] > 0, key


@pytest.mark.parametrize("ir", ["legacy", "pir"])
def test_cli_analyze_in_a_legacy_shell(paddle, tmp_path, ir):
    """``memopt analyze`` with FLAGS_enable_pir_api=0 in the environment
    reads and analyses a saved program of either IR."""
    model = models.build("mlp", ir)
    with model.guard():
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe = paddle.static.Executor(paddle.CPUPlace())
            model.initialize(exe)
            paddle.static.save(model.main, str(tmp_path / "mlp"))
        want = analyze(model.main, 8).peak()
    path = tmp_path / ("mlp.pdmodel" if ir == "legacy" else "mlp.json")
    result = _run(["-m", "memopt.cli", "analyze", str(path), "--batch-size", "8", "--json"])
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert doc["ir"] == ir and doc["peak_bytes"] == want


# -- programs Paddle cannot translate -------------------------------------------

@pytest.mark.parametrize("name, op, way", [
    ("gru", "rnn_grad", "build the program in PIR"),   # GRU with sequence_length
    ("ctr", "auc", "leave 'auc' out"),                  # paddle.static.auc
])
def test_untranslatable_op_is_named(paddle, name, op, way):
    """Paddle's translator refuses the op: UnsupportedProgramError names it,
    where it is, and what to do; the program is left as it was."""
    model = models.build(name, "legacy")
    before = model.main.desc.serialize_to_string()
    with model.guard(), pytest.raises(UnsupportedProgramError) as info:
        analyze(model.main, 8, fetch_list=model.fetch_list)
    text = str(info.value)
    assert f"op {op!r} (first at op " in text and way in text, text
    assert "build the program in PIR" in text
    assert model.main.desc.serialize_to_string() == before


@pytest.mark.parametrize("name", ["gru", "ctr"])
def test_the_way_around_works(paddle, name):
    """What the message proposes: the same model built in PIR analyses; for
    the GRU so does the legacy forward program (clone(for_test=True))."""
    model = models.build(name, "pir")
    with model.guard():
        assert analyze(model.main, 8, fetch_list=model.fetch_list).peak() > 0
    if name == "gru":
        legacy = models.build(name, "legacy")
        with legacy.guard():
            forward = legacy.main.clone(for_test=True)
            assert analyze(forward, 8).peak() > 0


def test_lstm_legacy_translates(paddle):
    """paddle.nn.LSTM trained in the legacy IR (no sequence_length)
    translates: analyze gives a figure, no error."""
    model = models.build("lstm", "legacy")
    with model.guard():
        a = analyze(model.main, 8, fetch_list=model.fetch_list)
    assert a.peak() > 0 and any("rnn" in t for t in a.op_types)
