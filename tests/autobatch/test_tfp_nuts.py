"""TFP 0.25's own auto-batched NUTS (``NoUTurnSampler``, TFP's file unmodified)
with autobatch in place of TFP's ``auto_batching``, in TFP's venv
(``make tfp``; CI builds it, and ``MEMOPT_REQUIRE_ALL=1`` makes a missing venv
a failure): it samples in every regime TFP supports (TF2 eager,
``tf.function``, a ``tf.compat.v1`` graph in a Session, XLA), with the stack
and the stackless VM and in ``dry_run``; the dry run gives TFP's samples bit
for bit; batched runs (whose random draws differ from TFP's by design: see
docs/autobatch/tfp_differences.rst) pass TFP's own statistical checks of
NUTS on 10,000 chains x 100 steps.

The runs happen in a subprocess of TFP's venv (TensorFlow 2.18) driven by
``tfp_nuts.py``, which prints its results as JSON."""
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import need_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TFP_PYTHON = os.environ.get("AUTOBATCH_TFP_PYTHON",
                            os.path.join(ROOT, ".tfp-venv", "bin", "python"))


def run_nuts(**settings):
    """``tfp_nuts.main(settings)`` in TFP's venv, with this tree's autobatch."""
    need_file(TFP_PYTHON, "TFP 0.25's venv (make tfp; CI builds it)")
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([TFP_PYTHON, os.path.join(HERE, "tfp_nuts.py"), json.dumps(settings)],
                          capture_output=True, text=True, timeout=3600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


REGIMES = [dict(regime="eager"), dict(regime="function"), dict(regime="graph"),
           dict(regime="xla"), dict(regime="eager", stackless=True)]


@pytest.mark.parametrize("regime", REGIMES, ids=lambda r: "-".join(
    str(v) if not isinstance(v, bool) else k for k, v in r.items()))
def test_tfp_nuts_samples_on_autobatch_in_every_regime(regime):
    """48 chains x 3 steps of a normal(1, 2) target: the right shapes, finite
    samples that moved, leapfrog counts as NUTS takes them (2..14 per step at
    tree depth 3 with 2 unrolled leapfrogs, even)."""
    got = run_nuts(impl="autobatch", chains=48, steps=3, return_samples=True, **regime)
    samples, leapfrogs = np.array(got["samples"]), np.array(got["leapfrogs"])
    assert samples.shape == (3, 48) and got["dtype"] == "float32"
    assert np.isfinite(samples).all()
    assert not np.array_equal(samples[0], samples[1])
    steps = np.diff(np.concatenate([np.zeros((1, 48)), leapfrogs]), axis=0)
    assert ((steps >= 2) & (steps <= 14) & (steps % 2 == 0)).all(), steps


def test_tfp_nuts_dry_run_gives_tfps_samples_bit_for_bit():
    settings = dict(regime="eager", steps=4, dry_run=True, return_samples=True)
    ours = run_nuts(impl="autobatch", **settings)
    theirs = run_nuts(impl="tfp", **settings)
    assert ours["samples"] == theirs["samples"] and len(ours["samples"]) == 4
    assert ours["leapfrogs"] == theirs["leapfrogs"]


def test_tfp_nuts_regimes_agree_with_one_another():
    """Eager, ``tf.function`` and a TF1 Session build the same run from the
    same seeds: the same samples."""
    runs = [run_nuts(impl="autobatch", regime=r, chains=32, steps=2, return_samples=True)
            for r in ("eager", "function", "graph")]
    assert runs[0]["samples"] == runs[1]["samples"] == runs[2]["samples"]


STATISTICAL = [
    dict(target="normal", step_size=0.2),
    dict(target="logit_beta", step_size=0.2),
    dict(target="correlated_mvn", dim=10, step_size=0.25, max_tree_depth=5),
]


@pytest.mark.parametrize("case", STATISTICAL, ids=lambda c: c["target"])
def test_tfp_nuts_on_autobatch_passes_tfps_statistical_checks(case):
    """10,000 chains started from the target, 100 NUTS steps each: the last
    step's samples still follow the target by TFP's own checks (DKWM against
    the true CDF for univariate targets; two-sample projections against the
    initial draws for the correlated MVN, at TFP's false-fail rates), and the
    sampler behaves as NUTS (leapfrog counts vary and average at least 4,
    the chains move)."""
    got = run_nuts(impl="autobatch", regime="graph", chains=10_000, steps=100, check=True,
                   **case)
    event = [case["dim"]] if case.get("dim", 1) > 1 else []   # one sample: a dim-vector
    assert got["shape"] == [100, 10_000] + event
    checks = got["checks"]
    assert checks["cdf_agrees"], got
    assert checks["leapfrogs_vary"] and checks["leapfrogs_average_4"] and checks["moves"], got
